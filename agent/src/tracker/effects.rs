//! Carrying out what the registry asks: datapath writes, conflicts (counted, logged,
//! published), transitions for the event feed, and the quarantine-duration histogram. The
//! datapath entry of an address, its observe-only flag included, is always the registry's own
//! derivation ([`crate::registry::datapath_entry`]): nothing here adds to it.

use ipq_common::{
    counters::{Action, Reason},
    sample::ConflictSample,
    verdict,
};
use log::warn;

use super::Tracker;
use crate::{
    api::views::Outcome,
    config::EarlyReusePolicy,
    registry::{AddrStatus, Conflict, ConflictKind, Effect, RegistryError},
};

impl Tracker {
    /// Applies a transition's effects, or reports why there was none.
    pub(super) fn apply(&mut self, result: Result<Vec<Effect>, RegistryError>, why: &str) {
        // Only explicit claims (the API) can be refused; they record their conflict there.
        match result {
            Ok(effects) => self.apply_effects(effects),
            Err(e) => warn!("{why}: {e}"),
        }
    }

    pub(super) fn apply_effects(&mut self, effects: Vec<Effect>) {
        let mut freed = 0;
        for effect in effects {
            match effect {
                Effect::Upsert { addr, entry } => self.enforcer.write(addr, entry),
                Effect::Remove { addr } => {
                    freed += 1;
                    self.enforcer.remove(addr);
                }
                Effect::Conflict(conflict) => {
                    let outcome = self.outcome_of(&conflict);
                    self.observer.conflict(&conflict, outcome);
                }
                Effect::Transition {
                    addr,
                    from,
                    to,
                    holder,
                } => {
                    self.hygiene_on_transition(addr, from, to, holder.as_ref());
                    self.observer.transition(addr, from, to, holder);
                }
                Effect::Released {
                    addr,
                    quarantined_for_ns,
                } => self.observer.released(addr, quarantined_for_ns),
            }
        }
        if freed > 0 {
            self.retry_waiting(freed);
        }
    }

    /// What the policy did about `conflict`, judged from the registry after it.
    pub(super) fn outcome_of(&self, conflict: &Conflict) -> Outcome {
        let record = self.registry.get(conflict.addr);
        let old_fenced = match (record, &conflict.old) {
            (Some(record), Some(old)) => record.is_fenced(old),
            _ => false,
        };
        let duplicate = verdict::action_for_address(
            self.config.mode,
            Reason::DuplicateSource,
            record.is_some_and(|r| r.observe_only),
        );
        match conflict.kind {
            ConflictKind::EarlyReuse | ConflictKind::ReuseInCooldown => match conflict.policy {
                EarlyReusePolicy::Observe => Outcome::Observed,
                EarlyReusePolicy::RefuseNew => Outcome::BlockedNew,
                EarlyReusePolicy::FenceOld if old_fenced => Outcome::FencedOld,
                EarlyReusePolicy::FenceOld => Outcome::Claimed,
            },
            ConflictKind::DuplicateSource => match duplicate {
                Action::Dropped => Outcome::Dropped,
                Action::Observed => Outcome::Observed,
                Action::Reported => Outcome::Reported,
            },
            ConflictKind::RemoteClaim if old_fenced => Outcome::FencedOld,
            ConflictKind::RemoteClaim => Outcome::Reported,
        }
    }

    /// Logs (rate-limited) and publishes one kernel sample.
    pub(super) fn publish_sample(&mut self, sample: &ConflictSample) {
        let addr = sample.addr.to_ip();
        let holder = self.registry.get(addr).map(|r| match &r.status {
            AddrStatus::Quarantined { previous, .. } => previous.clone(),
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                holder.clone()
            }
        });
        let seen_on = self.interface_name(sample.ifindex);
        self.observer.sample(sample, seen_on, holder);
    }
}
