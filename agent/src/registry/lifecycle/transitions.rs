//! The transitions of DESIGN §2 after a claim. Each works on a copy of the record and commits
//! it through `RecordBook::put`, so an error leaves the registry exactly as it was.

use std::net::IpAddr;

use ipq_common::addr::NO_IFINDEX;

use crate::registry::{
    canonical, AddrRecord, AddrStatus, Clock, ConflictKind, Effect, Holder, Lifecycle, MonoNs,
    RecordBook, RegistryError,
};

/// `addr` in its canonical form with its record: what every transition of one address starts
/// from. Errors: [`RegistryError::NotFound`], and [`RegistryError::InvalidAddress`] for the
/// unspecified address.
pub(super) fn known(
    records: &RecordBook,
    addr: IpAddr,
) -> Result<(IpAddr, &AddrRecord), RegistryError> {
    let addr = canonical(addr)?;
    let record = records
        .record(&addr)
        .ok_or(RegistryError::NotFound { addr })?;
    Ok((addr, record))
}

impl<C: Clock> Lifecycle<C> {
    /// The holder of `addr` starts to terminate: Active → Draining; its traffic keeps flowing.
    ///
    /// Idempotent on Draining, a no-op on Quarantined (the holder is already gone) and when
    /// `holder` is the fenced holder or blocked claimant (a late CNI DEL of the old pod).
    /// Errors: [`RegistryError::NotFound`] for an unknown address, [`RegistryError::NotHolder`]
    /// when `holder` is given and is someone else.
    pub fn drain(
        &mut self,
        addr: IpAddr,
        holder: Option<&Holder>,
    ) -> Result<Vec<Effect>, RegistryError> {
        let (addr, record) = known(&self.records, addr)?;
        let mut out = Vec::new();
        let Some(current) = record.status.holder() else {
            return Ok(out);
        };
        if let Some(given) = holder {
            if !current.same_as(given) {
                if record.is_fenced(given) {
                    return Ok(out);
                }
                return Err(RegistryError::NotHolder {
                    addr,
                    given: Box::new(given.clone()),
                    current: Box::new(current.clone()),
                });
            }
        }
        if let AddrStatus::Active { holder: h, .. } = &record.status {
            let mut h = h.clone();
            if let Some(given) = holder {
                h.merge_identity(given);
            }
            let mut next = record.clone();
            next.status = AddrStatus::Draining {
                holder: h,
                since: self.clock.now(),
            };
            self.records.put(addr, Some(next), &mut out);
        }
        Ok(out)
    }

    /// Interface `ifindex` (or its netns) was deleted: its holder is gone.
    ///
    /// Every address it held is Quarantined for `cooldown` — or, when a claimant is blocked on
    /// it (`refuse-new`), handed to that claimant (Active), which needs no quarantine. Where it
    /// was the fenced holder or the blocked claimant, that mark is cleared.
    pub fn holder_gone(&mut self, ifindex: u32) -> Result<Vec<Effect>, RegistryError> {
        let mut out = Vec::new();
        if ifindex == NO_IFINDEX {
            return Ok(out);
        }
        let Some(addrs) = self.records.indexes().on_interface(ifindex).cloned() else {
            return Ok(out);
        };
        let now = self.clock.now();
        for addr in addrs {
            let Some(mut next) = self.records.record(&addr).cloned() else {
                continue;
            };
            next.contest.forget(ifindex);
            if let Some(holder) = next.status.holder().filter(|h| h.ifindex == ifindex) {
                let holder = holder.clone();
                next.status = match next.contest.take_blocked_claimant() {
                    Some(claimant) => AddrStatus::Active {
                        holder: claimant,
                        since: now,
                    },
                    None => AddrStatus::Quarantined {
                        since: now,
                        until: self.settings.release_at(now, None),
                        last_stale: None,
                        previous: holder,
                    },
                };
            }
            self.records.put(addr, Some(next), &mut out);
        }
        Ok(out)
    }

    /// The datapath saw stale traffic for `addr` at `at` (monotonic ns). On a Quarantined
    /// address this moves its end to `max(since + cooldown, last stale + quiet_period)`, capped
    /// at `since + max_cooldown` (never earlier than it already was). On a live address it is a
    /// no-op (a report that raced a claim).
    pub fn stale_seen(&mut self, addr: IpAddr, at: MonoNs) -> Result<Vec<Effect>, RegistryError> {
        let (addr, record) = known(&self.records, addr)?;
        let mut out = Vec::new();
        if let AddrStatus::Quarantined {
            since,
            until,
            last_stale,
            ..
        } = record.status
        {
            let last = last_stale.map_or(at, |prev| prev.max(at));
            let release = self.settings.release_at(since, Some(last)).max(until);
            let mut next = record.clone();
            if let AddrStatus::Quarantined {
                until, last_stale, ..
            } = &mut next.status
            {
                *until = release;
                *last_stale = Some(last);
            }
            self.records.put(addr, Some(next), &mut out);
        }
        Ok(out)
    }

    /// Ends every quarantine whose time is over. The address goes Free — unless someone still
    /// lives on it: the claimant blocked on it (`refuse-new`) becomes its Active holder; else a
    /// fenced (or displaced) old holder that is still alive becomes its Draining holder and
    /// stays fenced, so a stuck workload is neither reconnected nor forgotten.
    pub fn tick(&mut self) -> Result<Vec<Effect>, RegistryError> {
        let now = self.clock.now();
        let due: Vec<IpAddr> = self.records.indexes().due(now).collect();
        let mut out = Vec::new();
        for addr in due {
            let Some(record) = self.records.record(&addr) else {
                continue;
            };
            if let Some((after, released)) = record.quarantine_over(now) {
                self.records.put(addr, after, &mut out);
                out.push(released);
            }
        }
        Ok(out)
    }

    /// Frees `addr` now. A quarantine that is over needs no force; an early end of one, or the
    /// release of a live holder's address, does (the API's `release --force`).
    /// A claimant blocked on a quarantine takes the address, as when it ends by itself.
    pub fn release(&mut self, addr: IpAddr, force: bool) -> Result<Vec<Effect>, RegistryError> {
        let (addr, record) = known(&self.records, addr)?;
        let now = self.clock.now();
        let over = matches!(record.status, AddrStatus::Quarantined { until, .. } if until <= now);
        if !force && !over {
            return Err(RegistryError::NotReleasable {
                addr,
                state: record.state(),
            });
        }
        let mut out = Vec::new();
        match record.quarantine_over(now) {
            Some((after, released)) => {
                self.records.put(addr, after, &mut out);
                out.push(released);
            }
            None => self.records.put(addr, None, &mut out),
        }
        Ok(out)
    }

    /// `addr` turned out to be no workload's at all (the node itself holds it): its record
    /// goes, whatever state it was in, and nothing is handed to anyone.
    pub fn forget(&mut self, addr: IpAddr) -> Result<Vec<Effect>, RegistryError> {
        let (addr, _) = known(&self.records, addr)?;
        let mut out = Vec::new();
        self.records.put(addr, None, &mut out);
        Ok(out)
    }

    /// Packets with `addr` as source arrived on interface `ifindex`, which is not its holder's:
    /// a `duplicate_source` conflict, reported only (the datapath already dropped them).
    pub fn duplicate_source(
        &mut self,
        addr: IpAddr,
        ifindex: u32,
    ) -> Result<Vec<Effect>, RegistryError> {
        let (addr, record) = known(&self.records, addr)?;
        let mut out = Vec::new();
        let old = match &record.status {
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => holder,
            AddrStatus::Quarantined { previous, .. } => previous,
        };
        if old.ifindex == ifindex {
            return Ok(out);
        }
        let old = old.clone();
        // The fullest identity the registry knows for `ifindex`, else the bare interface index.
        let new = self
            .records
            .indexes()
            .on_interface(ifindex)
            .and_then(|addrs| addrs.iter().next())
            .and_then(|addr| self.records.record(addr))
            .and_then(|r| r.live_holders().find(|h| h.ifindex == ifindex).cloned())
            .unwrap_or_else(|| Holder::new(ifindex, String::new()));
        let mut next = record.clone();
        let now = self.clock.now();
        let conflict = next.conflict(
            ConflictKind::DuplicateSource,
            Some(old),
            Some(new),
            self.settings.policy,
            now,
        );
        self.records.put(addr, Some(next), &mut out);
        out.push(conflict);
        Ok(out)
    }
}
