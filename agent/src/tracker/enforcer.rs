//! The datapath's one writer: every map write the registry's owner makes goes through here,
//! compared first with what the table holds as written, so that a write the kernel already has
//! costs no syscall. It also takes the registry as the whole truth after a netlink dump
//! ([`Enforcer::sync`]), from the table's own view of what it wrote, without reading the map
//! again.
//!
//! A write the kernel refuses (a full map, a failing syscall) is never only logged: it is kept
//! pending for its address ([`PendingWrites`]), counted, retried on every tick
//! ([`Enforcer::retry_pending`]) until it goes through or the registry wants something else,
//! and while any is pending the agent is not ready and says which in `/readyz`, `ipq status`
//! and the address's view.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use super::pending_writes::{PendingWrites, WantedWrite};
use crate::{
    datapath::{map_check::MapSuspects, AddrTable, DatapathError, DatapathPort, MapsCheck},
    metrics::Metrics,
};
use ipq_common::addr::{AddrEntry, AddrKey};

pub struct Enforcer {
    datapath: Box<dyn DatapathPort>,
    /// Writes the kernel refused, retried every tick.
    pending: PendingWrites,
}

impl Enforcer {
    pub fn new(datapath: impl DatapathPort + 'static, metrics: Arc<Metrics>) -> Self {
        Self {
            datapath: Box::new(datapath),
            pending: PendingWrites::new(metrics),
        }
    }

    /// The writes the kernel refused, still pending.
    pub fn pending(&self) -> &PendingWrites {
        &self.pending
    }

    #[cfg(test)]
    pub fn port(&self) -> &dyn DatapathPort {
        self.datapath.as_ref()
    }

    /// The address table, to read: what this agent wrote (no syscall), and what the kernel
    /// has now. Every write goes through this writer.
    pub fn table(&self) -> &dyn AddrTable {
        self.datapath.table()
    }

    /// Writes one entry, as the registry derived it, unless the table already holds it as
    /// written (O(1), no syscall).
    pub fn write(&mut self, addr: IpAddr, entry: AddrEntry) {
        let current = self.datapath.table().get(&AddrKey::from(addr));
        if current.is_some_and(|current| current.written_as(&entry)) {
            // The map has it (a failed write the registry then changed back): nothing pends.
            self.pending.settled(addr);
        } else {
            self.put(addr, entry);
        }
    }

    /// Removes the entry of `addr` (the address is free).
    pub fn remove(&mut self, addr: IpAddr) {
        match self.datapath.table_mut().remove(&AddrKey::from(addr)) {
            Ok(_) => self.pending.settled(addr),
            Err(e) => self.pending.failed(addr, WantedWrite::Delete, &e),
        }
    }

    /// Tries every pending write again (the owner's tick): O(pending). A put is tried again
    /// whole, even where the table's copy already shows the entry: a put can fail after its
    /// authoritative write (a fast-path slot), and putting an entry again is harmless.
    pub fn retry_pending(&mut self) {
        for (addr, wanted) in self.pending.wanted() {
            match wanted {
                WantedWrite::Update(entry) => self.put(addr, entry),
                WantedWrite::Delete => self.remove(addr),
            }
        }
    }

    /// Makes the map hold exactly `wanted`: what it holds and `wanted` lacks is removed, what
    /// differs is written, what it holds as wanted (an agent restart: nearly everything) is
    /// not written again. A pending write is replaced by what `wanted` says of its address.
    pub fn sync(&mut self, wanted: BTreeMap<IpAddr, AddrEntry>) {
        // A refused write of an address the table never held, which the registry no longer
        // wants: its pending update must not be retried.
        for (addr, _) in self.pending.wanted() {
            if !wanted.contains_key(&addr) {
                self.remove(addr);
            }
        }
        let mut written = std::collections::HashMap::new();
        for (key, entry) in self.datapath.table().cached() {
            let addr = key.to_ip();
            if wanted.contains_key(&addr) {
                written.insert(addr, entry);
            } else {
                self.remove(addr);
            }
        }
        for (addr, entry) in wanted {
            if written.get(&addr).is_some_and(|e| e.written_as(&entry)) {
                self.pending.settled(addr);
            } else {
                self.put(addr, entry);
            }
        }
    }

    /// Looks again at what the off-loop comparison of the maps found differing, and writes
    /// `wanted`'s entry back where another process changed them.
    pub fn recheck_maps(
        &mut self,
        suspects: &MapSuspects,
        wanted: &dyn Fn(&AddrKey) -> Option<AddrEntry>,
    ) -> MapsCheck {
        self.datapath.table_mut().recheck(suspects, wanted)
    }

    /// A break-glass write, behind the registry's back (`PUT /v1/datapath/{ip}`).
    pub fn put_unchecked(&mut self, addr: IpAddr, entry: AddrEntry) -> Result<(), DatapathError> {
        self.datapath.table_mut().put(AddrKey::from(addr), entry)
    }

    /// A break-glass removal (`DELETE /v1/datapath/{ip}`): the entry that was there.
    pub fn remove_unchecked(&mut self, addr: IpAddr) -> Result<Option<AddrEntry>, DatapathError> {
        self.datapath.table_mut().remove(&AddrKey::from(addr))
    }

    fn put(&mut self, addr: IpAddr, entry: AddrEntry) {
        match self.datapath.table_mut().put(AddrKey::from(addr), entry) {
            Ok(()) => self.pending.settled(addr),
            Err(e) => self.pending.failed(addr, WantedWrite::Update(entry), &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ipq_common::addr::{AddrEntry, AddrState};

    use super::Enforcer;
    use crate::{
        datapath::{MemDatapath, MemTable},
        metrics::Metrics,
    };

    fn entry(holder: u32) -> AddrEntry {
        AddrEntry {
            state: AddrState::Active as u32,
            holder_ifindex: holder,
            ..AddrEntry::default()
        }
    }

    /// A writer over a map with room for one entry, holding 10.0.0.1, with the write of
    /// 10.0.0.2 refused.
    fn one_refused() -> Enforcer {
        let table = MemTable {
            capacity: Some(1),
            ..MemTable::default()
        };
        let mut enforcer = Enforcer::new(MemDatapath { table }, Metrics::for_tests());
        enforcer.write("10.0.0.1".parse().unwrap(), entry(5));
        enforcer.write("10.0.0.2".parse().unwrap(), entry(6));
        assert_eq!(enforcer.pending().len(), 1);
        enforcer
    }

    /// A map that fills refuses many addresses at once: one burst, counted once per address
    /// (each logged at debug after the first's ERROR), over when none is pending.
    #[test]
    fn refused_addresses_are_one_burst_until_none_is_pending() {
        let mut enforcer = one_refused();
        enforcer.write("10.0.0.3".parse().unwrap(), entry(7));
        enforcer.write("10.0.0.4".parse().unwrap(), entry(8));
        enforcer.retry_pending();
        assert_eq!(enforcer.pending().len(), 3);
        assert_eq!(
            enforcer.pending.refused_in_burst, 3,
            "retries are not new refusals"
        );
        enforcer.sync(BTreeMap::from([("10.0.0.1".parse().unwrap(), entry(5))]));
        assert_eq!(enforcer.pending().len(), 0);
        assert_eq!(enforcer.pending.refused_in_burst, 0, "the burst ended");
        enforcer.write("10.0.0.2".parse().unwrap(), entry(6));
        assert_eq!(enforcer.pending.refused_in_burst, 1, "a new burst");
    }

    #[test]
    fn a_sync_that_no_longer_wants_a_refused_address_drops_its_pending_write() {
        let mut enforcer = one_refused();
        enforcer.sync(BTreeMap::from([("10.0.0.1".parse().unwrap(), entry(5))]));
        assert_eq!(enforcer.pending().len(), 0);
        enforcer.retry_pending();
        assert_eq!(
            enforcer.table().len(),
            1,
            "nothing the registry does not want is written"
        );
        assert_eq!(enforcer.pending.metrics.writes.pending.get(), 0);
    }

    #[test]
    fn a_sync_that_still_wants_it_keeps_it_pending_until_there_is_room() {
        let mut enforcer = one_refused();
        enforcer.sync(BTreeMap::from([
            ("10.0.0.1".parse().unwrap(), entry(5)),
            ("10.0.0.2".parse().unwrap(), entry(6)),
        ]));
        assert_eq!(enforcer.pending().len(), 1);
        // The registry freed 10.0.0.1: room, and the retry writes 10.0.0.2.
        enforcer.sync(BTreeMap::from([("10.0.0.2".parse().unwrap(), entry(6))]));
        assert_eq!(enforcer.pending().len(), 0);
        assert_eq!(enforcer.pending.metrics.writes.pending.get(), 0);
        assert_eq!(
            enforcer
                .table()
                .cached()
                .iter()
                .map(|(k, _)| k.to_ip().to_string())
                .collect::<Vec<_>>(),
            ["10.0.0.2"]
        );
    }
}
