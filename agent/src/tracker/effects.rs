//! Carrying out what the registry asks: datapath writes, conflicts (counted, logged,
//! published), transitions for the event feed, and the quarantine-duration histogram. The
//! datapath entry of an address, its observe-only flag included, is always the registry's own
//! derivation ([`crate::registry::datapath_entry`]): nothing here adds to it.

use ipq_common::{
    counters::{Action, Reason},
    sample::ConflictSample,
    verdict,
};
use log::{debug, info, warn};

use super::Tracker;
use crate::{
    api::{
        model::EventBody,
        views::{conflict_view, sample_body, Outcome, TimeBase},
    },
    config::EarlyReusePolicy,
    metrics::LostAt,
    netdev,
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
                    self.record_conflict(&conflict, outcome);
                }
                Effect::Transition {
                    addr,
                    from,
                    to,
                    holder,
                } => {
                    self.hygiene_on_transition(addr, from, to, holder.as_ref());
                    let shown = holder.as_ref().map(|h| h.to_string()).unwrap_or_default();
                    // Per address: the event feed has every one; the log only when asked.
                    debug!(target: "ipq::transition", "{addr}: {} -> {} {shown}", from.as_str(), to.as_str());
                    let at = TimeBase::now().rfc3339(netdev::monotonic_ns());
                    self.events.publish(
                        at,
                        EventBody::Transition {
                            address: addr,
                            from,
                            to,
                            holder,
                        },
                    );
                }
                Effect::Released {
                    addr,
                    quarantined_for_ns,
                } => {
                    let seconds = quarantined_for_ns as f64 / 1e9;
                    self.metrics.quarantine_duration_seconds.observe(seconds);
                    debug!("{addr}: released after {seconds:.1}s of quarantine");
                }
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

    /// Counts, logs (rate-limited) and publishes one conflict.
    pub(super) fn record_conflict(&mut self, conflict: &Conflict, outcome: Outcome) {
        self.metrics
            .conflicts
            .with_label_values(&[conflict.kind.as_str()])
            .inc();
        let view = conflict_view(conflict, outcome, &TimeBase::now());
        if self.events.may_log() {
            let line = serde_json::json!({ "event": "conflict", "conflict": &view });
            warn!(target: "ipq::conflict", "{line}");
        } else {
            self.metrics.events_lost(LostAt::Log, 1);
        }
        self.events.conflict(view);
    }

    /// Logs (rate-limited) and publishes one kernel sample.
    pub(super) fn publish_sample(&mut self, sample: &ConflictSample) {
        let time = TimeBase::now();
        let addr = sample.addr.to_ip();
        let holder = self.registry.get(addr).map(|r| match &r.status {
            AddrStatus::Quarantined { previous, .. } => previous.clone(),
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                holder.clone()
            }
        });
        let seen_on = self.interface_name(sample.ifindex);
        let body = sample_body(sample, seen_on, holder);
        if self.events.may_log() {
            let mut line = serde_json::json!({ "event": "conflict_sample" });
            if let (Some(map), Ok(serde_json::Value::Object(fields))) =
                (line.as_object_mut(), serde_json::to_value(&body))
            {
                map.extend(fields);
                map.insert("at".into(), time.rfc3339(sample.ts_ns).into());
            }
            info!(target: "ipq::conflict", "{line}");
        } else {
            self.metrics.events_lost(LostAt::Log, 1);
        }
        self.events.publish(time.rfc3339(sample.ts_ns), body);
    }
}
