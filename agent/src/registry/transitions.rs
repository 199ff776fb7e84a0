//! The transitions of DESIGN §2. Each works on a copy of the record and commits it through
//! `Registry::put`, so an error leaves the registry exactly as it was.

use std::net::IpAddr;

use ipq_common::addr::NO_IFINDEX;

use super::{
    canonical, AddrRecord, AddrStatus, Clock, Conflict, ConflictKind, Effect, Holder, MonoNs,
    Registry, RegistryError, Source,
};
use crate::config::EarlyReusePolicy;

impl<C: Clock> Registry<C> {
    /// `holder` claims `addr`, as seen by `source`.
    ///
    /// - Free → Active(holder), unless the registry is full ([`RegistryError::Full`]; nothing is
    ///   evicted).
    /// - The current holder again: a no-op (identity it lacked is filled in, no effects). A
    ///   Draining holder that claims again explicitly (CNI, API) is Active again; the same claim
    ///   seen on netlink (a resync still listing its route) changes nothing.
    /// - The fenced holder or blocked claimant seen again on netlink: a no-op (it stays fenced).
    /// - Another live holder (Active or Draining) has it: an `early_reuse` conflict.
    ///   `fence-old`: the claimant becomes the holder, the old holder is fenced.
    ///   `refuse-new`: an explicit claim is refused ([`RegistryError::Refused`], nothing changes);
    ///   a netlink claim is kept as the blocked claimant (its traffic dropped) and promoted to
    ///   holder once the old holder is gone. `observe`: the claimant becomes the holder, nothing
    ///   is fenced.
    /// - Quarantined: a `reuse_in_cooldown` conflict. `fence-old`, `observe`: claimed.
    ///   `refuse-new`: an explicit claim is refused until the quarantine ends; a netlink claimant
    ///   is blocked until then and promoted by [`tick`](Self::tick).
    pub fn claim(
        &mut self,
        addr: IpAddr,
        holder: Holder,
        source: Source,
    ) -> Result<Vec<Effect>, RegistryError> {
        let addr = canonical(addr)?;
        if holder.ifindex == NO_IFINDEX {
            return Err(RegistryError::InvalidHolder {
                addr,
                holder: Box::new(holder),
            });
        }
        let now = self.clock.now();
        let mut out = Vec::new();
        let Some(current) = self.records.get(&addr) else {
            if self.records.len() >= self.settings.capacity as usize {
                self.full_rejections += 1;
                return Err(RegistryError::Full {
                    addr,
                    capacity: self.settings.capacity,
                });
            }
            let record = AddrRecord::new(addr, AddrStatus::Active { holder, since: now });
            self.put(addr, Some(record), &mut out);
            return Ok(out);
        };
        let mut next = current.clone();

        // The holder again.
        match &mut next.status {
            AddrStatus::Active { holder: h, .. } if h.same_as(&holder) => {
                if h.merge_identity(&holder) {
                    self.put(addr, Some(next), &mut out);
                }
                return Ok(out);
            }
            AddrStatus::Draining { holder: h, .. } if h.same_as(&holder) => {
                let changed = h.merge_identity(&holder);
                if source.is_explicit() {
                    let h = h.clone();
                    next.status = AddrStatus::Active {
                        holder: h,
                        since: now,
                    };
                    self.put(addr, Some(next), &mut out);
                } else if changed {
                    self.put(addr, Some(next), &mut out);
                }
                return Ok(out);
            }
            _ => {}
        }

        // A fenced holder or blocked claimant observed again: its fate is already decided.
        if next.is_fenced(&holder) && !source.is_explicit() {
            return Ok(out);
        }

        // A conflict. The claimant is no longer "the fenced one" whatever the outcome: it either
        // becomes the holder or is refused (and then nothing is committed).
        let (kind, old, until) = match &next.status {
            AddrStatus::Active { holder: old, .. } | AddrStatus::Draining { holder: old, .. } => {
                (ConflictKind::EarlyReuse, old.clone(), None)
            }
            AddrStatus::Quarantined {
                previous, until, ..
            } => (
                ConflictKind::ReuseInCooldown,
                previous.clone(),
                Some(*until),
            ),
        };
        let policy = self.settings.policy;
        if policy == EarlyReusePolicy::RefuseNew && source.is_explicit() {
            self.refused_claims += 1;
            return Err(RegistryError::Refused {
                addr,
                holder: Box::new(old),
                until,
            });
        }
        next.unfence(&holder);
        let live_old = kind == ConflictKind::EarlyReuse;
        // Another container on the very interface of the live holder: the interface changed
        // hands, so the old holder cannot be told apart in the datapath and is not fenced.
        let same_iface = live_old && old.ifindex == holder.ifindex;
        let take = AddrStatus::Active {
            holder: holder.clone(),
            since: now,
        };
        match policy {
            EarlyReusePolicy::RefuseNew if !same_iface => {
                // Only a netlink claim gets here: the workload exists, so it is fenced until
                // the address is free for it. The newest claimant takes the datapath's slot
                // (its route is the one just installed); an earlier one is displaced.
                if let Some(earlier) = next.replace_blocked_claimant(holder.clone()) {
                    next.displace(earlier);
                }
            }
            EarlyReusePolicy::FenceOld => {
                // A claimant left blocked by an earlier `refuse-new` loses to this claim.
                if let Some(blocked) = next.take_blocked_claimant() {
                    next.fence(blocked);
                }
                // The old live holder takes the fence slot (unless the interface itself
                // changed hands: fencing it would cut off the claimant).
                if live_old && !same_iface {
                    next.fence(old.clone());
                }
                next.status = take;
            }
            EarlyReusePolicy::RefuseNew => next.status = take,
            EarlyReusePolicy::Observe => {
                next.status = take;
                next.observe_only = true;
            }
        }
        let conflict = self.conflict(&mut next, kind, Some(old), Some(holder), now);
        self.put(addr, Some(next), &mut out);
        out.push(conflict);
        Ok(out)
    }

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
        let addr = canonical(addr)?;
        let record = self
            .records
            .get(&addr)
            .ok_or(RegistryError::NotFound { addr })?;
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
            self.put(addr, Some(next), &mut out);
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
        let Some(addrs) = self.by_ifindex.get(&ifindex).cloned() else {
            return Ok(out);
        };
        let now = self.clock.now();
        for addr in addrs {
            let Some(mut next) = self.records.get(&addr).cloned() else {
                continue;
            };
            next.forget_contestant(ifindex);
            if let Some(holder) = next.status.holder().filter(|h| h.ifindex == ifindex) {
                let holder = holder.clone();
                next.status = match next.take_blocked_claimant() {
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
            self.put(addr, Some(next), &mut out);
        }
        Ok(out)
    }

    /// The datapath saw stale traffic for `addr` at `at` (monotonic ns). On a Quarantined
    /// address this moves its end to `max(since + cooldown, last stale + quiet_period)`, capped
    /// at `since + max_cooldown` (never earlier than it already was). On a live address it is a
    /// no-op (a report that raced a claim).
    pub fn stale_seen(&mut self, addr: IpAddr, at: MonoNs) -> Result<Vec<Effect>, RegistryError> {
        let addr = canonical(addr)?;
        let record = self
            .records
            .get(&addr)
            .ok_or(RegistryError::NotFound { addr })?;
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
            self.put(addr, Some(next), &mut out);
        }
        Ok(out)
    }

    /// Ends every quarantine whose time is over. The address goes Free — unless someone still
    /// lives on it: the claimant blocked on it (`refuse-new`) becomes its Active holder; else a
    /// fenced (or displaced) old holder that is still alive becomes its Draining holder and
    /// stays fenced, so a stuck workload is neither reconnected nor forgotten.
    pub fn tick(&mut self) -> Result<Vec<Effect>, RegistryError> {
        let now = self.clock.now();
        let due: Vec<IpAddr> = self
            .deadlines
            .iter()
            .take_while(|(until, _)| *until <= now)
            .map(|(_, addr)| *addr)
            .collect();
        let mut out = Vec::new();
        for addr in due {
            self.end_quarantine(addr, now, &mut out);
        }
        Ok(out)
    }

    /// Frees `addr` now. A quarantine that is over needs no force; an early end of one, or the
    /// release of a live holder's address, does (the API's `release --force`).
    /// A claimant blocked on a quarantine takes the address, as when it ends by itself.
    pub fn release(&mut self, addr: IpAddr, force: bool) -> Result<Vec<Effect>, RegistryError> {
        let addr = canonical(addr)?;
        let record = self
            .records
            .get(&addr)
            .ok_or(RegistryError::NotFound { addr })?;
        let now = self.clock.now();
        let over = matches!(record.status, AddrStatus::Quarantined { until, .. } if until <= now);
        if !force && !over {
            return Err(RegistryError::NotReleasable {
                addr,
                state: record.state(),
            });
        }
        let mut out = Vec::new();
        if matches!(record.status, AddrStatus::Quarantined { .. }) {
            self.end_quarantine(addr, now, &mut out);
        } else {
            self.put(addr, None, &mut out);
        }
        Ok(out)
    }

    /// `addr` turned out to be no workload's at all (the node itself holds it): its record
    /// goes, whatever state it was in, and nothing is handed to anyone.
    pub fn forget(&mut self, addr: IpAddr) -> Result<Vec<Effect>, RegistryError> {
        let addr = canonical(addr)?;
        if !self.records.contains_key(&addr) {
            return Err(RegistryError::NotFound { addr });
        }
        let mut out = Vec::new();
        self.put(addr, None, &mut out);
        Ok(out)
    }

    /// Another machine announced `addr` (gratuitous ARP, unsolicited NA) while a holder here
    /// still has it: a `remote_claim` conflict. A Draining holder is fenced (it is on its way
    /// out and the address now lives elsewhere); an Active one is only reported, as is a
    /// Draining one while a blocked claimant holds the datapath's fence slot. A Quarantined
    /// address moving to another machine is no conflict.
    pub fn remote_claim(&mut self, addr: IpAddr) -> Result<Vec<Effect>, RegistryError> {
        let addr = canonical(addr)?;
        let record = self
            .records
            .get(&addr)
            .ok_or(RegistryError::NotFound { addr })?;
        let mut out = Vec::new();
        let Some(holder) = record.status.holder().cloned() else {
            return Ok(out);
        };
        let mut next = record.clone();
        if matches!(next.status, AddrStatus::Draining { .. }) && next.blocked_claimant().is_none() {
            next.fence(holder.clone());
        }
        let now = self.clock.now();
        let conflict = self.conflict(
            &mut next,
            ConflictKind::RemoteClaim,
            Some(holder),
            None,
            now,
        );
        self.put(addr, Some(next), &mut out);
        out.push(conflict);
        Ok(out)
    }

    /// Packets with `addr` as source arrived on interface `ifindex`, which is not its holder's:
    /// a `duplicate_source` conflict, reported only (the datapath already dropped them).
    pub fn duplicate_source(
        &mut self,
        addr: IpAddr,
        ifindex: u32,
    ) -> Result<Vec<Effect>, RegistryError> {
        let addr = canonical(addr)?;
        let record = self
            .records
            .get(&addr)
            .ok_or(RegistryError::NotFound { addr })?;
        let mut out = Vec::new();
        let old = match &record.status {
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => holder,
            AddrStatus::Quarantined { previous, .. } => previous,
        };
        if old.ifindex == ifindex {
            return Ok(out);
        }
        let old = old.clone();
        let new = self.known_holder(ifindex);
        let mut next = record.clone();
        let now = self.clock.now();
        let conflict = self.conflict(
            &mut next,
            ConflictKind::DuplicateSource,
            Some(old),
            Some(new),
            now,
        );
        self.put(addr, Some(next), &mut out);
        out.push(conflict);
        Ok(out)
    }

    /// Ends the quarantine of `addr` at `now`. The address goes to whoever still lives on it:
    /// the blocked claimant (`refuse-new`) becomes its Active holder; a fenced holder that is
    /// still alive (a stuck, terminating workload) keeps it as Draining and stays fenced, so it
    /// is neither reconnected nor forgotten; with neither, the address is Free.
    fn end_quarantine(&mut self, addr: IpAddr, now: MonoNs, out: &mut Vec<Effect>) {
        let Some(record) = self.records.get(&addr) else {
            return;
        };
        let AddrStatus::Quarantined { since, .. } = record.status else {
            return;
        };
        let mut next = record.clone();
        let after = if let Some(claimant) = next.take_blocked_claimant() {
            next.status = AddrStatus::Active {
                holder: claimant,
                since: now,
            };
            Some(next)
        } else if let Some(fenced) = next.fenced().cloned() {
            // (`put` keeps the fence slot filled while any displaced holder lives.)
            next.status = AddrStatus::Draining {
                holder: fenced,
                since: now,
            };
            Some(next)
        } else {
            None
        };
        self.put(addr, after, out);
        out.push(Effect::Released {
            addr,
            quarantined_for_ns: now.saturating_sub(since),
        });
    }

    /// The fullest identity the registry knows for `ifindex`, else the bare interface index.
    fn known_holder(&self, ifindex: u32) -> Holder {
        self.by_ifindex
            .get(&ifindex)
            .and_then(|addrs| addrs.iter().next())
            .and_then(|addr| self.records.get(addr))
            .and_then(|r| r.live_holders().find(|h| h.ifindex == ifindex).cloned())
            .unwrap_or_else(|| Holder::new(ifindex, String::new()))
    }

    /// Counts a conflict on `record` and builds its effect.
    fn conflict(
        &self,
        record: &mut AddrRecord,
        kind: ConflictKind,
        old: Option<Holder>,
        new: Option<Holder>,
        at: MonoNs,
    ) -> Effect {
        record.conflicts = record.conflicts.saturating_add(1);
        Effect::Conflict(Box::new(Conflict {
            kind,
            addr: record.addr,
            old,
            new,
            policy: self.settings.policy,
            at,
        }))
    }
}
