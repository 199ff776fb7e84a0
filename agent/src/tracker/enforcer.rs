//! The datapath's one writer: every map write the registry's owner makes goes through here,
//! compared first with what the table holds as written, so that a write the kernel already has
//! costs no syscall. It also takes the registry as the whole truth after a netlink dump
//! ([`Enforcer::sync`]), from the table's own view of what it wrote, without reading the map
//! again.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_common::addr::{AddrEntry, AddrKey};
use log::error;

use crate::datapath::{map_check::MapSuspects, DatapathError, DatapathPort, MapsCheck};

pub struct Enforcer {
    datapath: Box<dyn DatapathPort>,
}

impl Enforcer {
    pub fn new(datapath: impl DatapathPort + 'static) -> Self {
        Self {
            datapath: Box::new(datapath),
        }
    }

    pub fn port(&self) -> &dyn DatapathPort {
        self.datapath.as_ref()
    }

    /// Entries in the address map.
    pub fn len(&self) -> usize {
        self.datapath.table().len()
    }

    /// Every entry as this agent's table holds it written (no syscall), in address order.
    pub fn as_written(&self) -> Vec<(AddrKey, AddrEntry)> {
        self.datapath.table().cached()
    }

    /// The entry of `addr` as the kernel has it now, with the stamps the programs wrote.
    pub fn kernel_entry(&self, addr: IpAddr) -> Result<Option<AddrEntry>, DatapathError> {
        self.datapath.table().kernel_entry(&AddrKey::from(addr))
    }

    /// Writes one entry, as the registry derived it, unless the table already holds it as
    /// written (O(1), no syscall).
    pub fn write(&mut self, addr: IpAddr, entry: AddrEntry) {
        let current = self.datapath.table().get(&AddrKey::from(addr));
        if !current.is_some_and(|current| current.written_as(&entry)) {
            self.put(addr, entry);
        }
    }

    /// Removes the entry of `addr` (the address is free).
    pub fn remove(&mut self, addr: IpAddr) {
        if let Err(e) = self.datapath.table_mut().remove(&AddrKey::from(addr)) {
            error!("{addr}: datapath remove failed, enforcement may lag the registry: {e}");
        }
    }

    /// Makes the map hold exactly `wanted`: what it holds and `wanted` lacks is removed, what
    /// differs is written, what it holds as wanted (an agent restart: nearly everything) is
    /// not written again.
    pub fn sync(&mut self, wanted: BTreeMap<IpAddr, AddrEntry>) {
        let mut written = std::collections::HashMap::new();
        for (key, entry) in self.as_written() {
            let addr = key.to_ip();
            if wanted.contains_key(&addr) {
                written.insert(addr, entry);
            } else if let Err(e) = self.datapath.table_mut().remove(&key) {
                error!("{addr}: removing a stale datapath entry: {e}");
            }
        }
        for (addr, entry) in wanted {
            if !written.get(&addr).is_some_and(|e| e.written_as(&entry)) {
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

    /// Where the pinned copies disagreed when the table opened.
    pub fn opened_disagreeing(&self) -> Vec<String> {
        self.datapath.table().opened_disagreeing().to_vec()
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
        if let Err(e) = self.datapath.table_mut().put(AddrKey::from(addr), entry) {
            error!("{addr}: datapath write failed, enforcement may lag the registry: {e}");
        }
    }
}
