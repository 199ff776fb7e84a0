//! Carrying out what the registry asks: datapath writes, conflicts (counted, logged,
//! published), transitions for the event feed, and the quarantine-duration histogram. The
//! datapath entry of an address, its observe-only flag included, is always the registry's own
//! derivation ([`crate::registry::datapath_entry`]): nothing here adds to it.

use ipq_common::sample::ConflictSample;
use log::warn;

use super::Tracker;
use crate::{
    api::views::outcome_of,
    registry::{AddrStatus, Effect, RegistryError},
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
                Effect::Upsert { addr, entry } => {
                    self.hand_written.forget(addr);
                    self.enforcer.write(addr, entry);
                }
                Effect::Remove { addr } => {
                    freed += 1;
                    self.hand_written.forget(addr);
                    self.enforcer.remove(addr);
                }
                Effect::Conflict(conflict) => {
                    let record = self.core.registry.get(conflict.addr);
                    let outcome = outcome_of(&conflict, record, self.core.config.mode);
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
            let claimed = self.core.retry_waiting(freed);
            if !claimed.is_empty() {
                self.apply_effects(claimed);
            }
        }
    }

    /// Logs (rate-limited) and publishes one kernel sample.
    pub(super) fn publish_sample(&mut self, sample: &ConflictSample) {
        let addr = sample.addr.to_ip();
        let holder = self.core.registry.get(addr).map(|r| match &r.status {
            AddrStatus::Quarantined { previous, .. } => previous.clone(),
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                holder.clone()
            }
        });
        let seen_on = self.interface_name(sample.ifindex);
        self.observer.sample(sample, seen_on, holder);
    }

    /// The name of interface `ifindex` as an event shows it: the node's, else the attacher's
    /// last known, else `if<index>`.
    fn interface_name(&self, ifindex: u32) -> String {
        self.core
            .net
            .link_name(ifindex)
            .map(str::to_owned)
            .or_else(|| self.attacher.target(ifindex).map(|t| t.name.clone()))
            .unwrap_or_else(|| format!("if{ifindex}"))
    }
}
