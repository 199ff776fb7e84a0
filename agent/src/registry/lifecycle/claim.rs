//! A claim (DESIGN §2): the transition of an address to a holder, and what each early-reuse
//! policy makes of a claim over a live or quarantined holder.

use std::net::IpAddr;

use ipq_common::addr::NO_IFINDEX;

use crate::config::EarlyReusePolicy;
use crate::registry::{
    canonical, AddrRecord, AddrStatus, Clock, ConflictKind, Effect, Holder, Lifecycle,
    RegistryError, Source,
};

impl<C: Clock> Lifecycle<C> {
    /// `holder` claims `addr`, as seen by `source`: the rules of
    /// [`Registry::claim`](crate::registry::Registry::claim), which counts the refusals.
    pub(in crate::registry) fn claim(
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
        let Some(current) = self.records.record(&addr) else {
            let capacity = self.records.capacity();
            if self.records.len() >= capacity as usize {
                return Err(RegistryError::Full { addr, capacity });
            }
            let record = AddrRecord::new(addr, AddrStatus::Active { holder, since: now });
            self.records.put(addr, Some(record), &mut out);
            return Ok(out);
        };
        let mut next = current.clone();

        // The holder again.
        match &mut next.status {
            AddrStatus::Active { holder: h, .. } if h.same_as(&holder) => {
                if h.merge_identity(&holder) {
                    self.records.put(addr, Some(next), &mut out);
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
                    self.records.put(addr, Some(next), &mut out);
                } else if changed {
                    self.records.put(addr, Some(next), &mut out);
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
            return Err(RegistryError::Refused {
                addr,
                holder: Box::new(old),
                until,
            });
        }
        next.contest.unfence(&holder);
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
                if let Some(earlier) = next.contest.replace_blocked_claimant(holder.clone()) {
                    next.displace(earlier);
                }
            }
            EarlyReusePolicy::FenceOld => {
                // A claimant left blocked by an earlier `refuse-new` loses to this claim.
                if let Some(blocked) = next.contest.take_blocked_claimant() {
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
        let conflict = next.conflict(kind, Some(old), Some(holder), policy, now);
        self.records.put(addr, Some(next), &mut out);
        out.push(conflict);
        Ok(out)
    }
}
