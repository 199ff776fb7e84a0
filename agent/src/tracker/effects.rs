//! Where the registry's effects go ([`Sinks`]): datapath writes (the datapath writer, and the
//! entries written by hand that a registry write replaces), conflicts (counted, logged,
//! published), transitions for the event feed and for reuse hygiene, and the
//! quarantine-duration histogram. Each sink owns its state; the tracker hands them the core's
//! effects. The datapath entry of an address, its observe-only flag included, is always the
//! registry's own derivation ([`crate::registry::datapath_entry`]): nothing here adds to it.

use std::net::IpAddr;

use ipq_common::{
    addr::{AddrKey, AddrState},
    counters::Reason,
    sample::ConflictSample,
};
use log::warn;

use super::{break_glass::HandWritten, decide::Core, enforcer::Enforcer, observer::Observer};
use crate::{
    api::views::outcome_of,
    datapath::attach::Attacher,
    hygiene::Hygiene,
    metrics::Metrics,
    netdev,
    registry::{AddrStatus, Effect, Holder, Registry, StateName},
};

/// The parts the registry's effects change, each the owner of its state.
pub(super) struct Sinks {
    /// The datapath's one writer.
    pub(super) enforcer: Enforcer,
    /// Entries written by hand behind the registry's back, until it changes them.
    pub(super) hand_written: HandWritten,
    /// Effects and samples made counters, feed entries and log lines.
    pub(super) observer: Observer,
    /// Reuse hygiene's jobs and last reports (inert until started).
    pub(super) hygiene: Hygiene,
    /// Where a remote claim's local holder is asked about (the API server), when the agent
    /// knows its Kubernetes node.
    pub(super) remote_claims: Option<crate::remote_claim::Asker>,
}

impl Sinks {
    /// Hands each of `effects` to its sink; the claims that waited for room the removals freed
    /// are made (by the core) and handed on in turn.
    pub(super) fn apply(&mut self, core: &mut Core, effects: Vec<Effect>) {
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
                    let record = core.registry.records().get(conflict.addr);
                    let outcome = outcome_of(&conflict, record, core.config.mode);
                    self.observer.conflict(&conflict, outcome);
                }
                Effect::Transition {
                    addr,
                    from,
                    to,
                    holder,
                } => {
                    self.hygiene_on_transition(core, addr, from, to, holder.as_ref());
                    self.observer.transition(addr, from, to, holder);
                }
                Effect::Released {
                    addr,
                    quarantined_for_ns,
                } => self.observer.released(addr, quarantined_for_ns),
                Effect::AskAboutHolder { addr, holder } => {
                    // Asked only when there is an asker (`on_sample` says so to the core).
                    if let Some(asker) = &self.remote_claims {
                        asker.ask(addr, holder);
                    }
                }
            }
        }
        if freed > 0 {
            let claimed = core.retry_waiting(freed);
            if !claimed.is_empty() {
                self.apply(core, claimed);
            }
        }
    }

    /// A transition of `addr` from `from` into `to` with `holder` live after it: when the holder
    /// is gone or new, the hygiene worker gets a job; it cleans only where the core says the
    /// datapath drops a conflict ([`Core::cleans`]).
    fn hygiene_on_transition(
        &mut self,
        core: &Core,
        addr: IpAddr,
        from: StateName,
        to: StateName,
        holder: Option<&Holder>,
    ) {
        let act = core.cleans(addr, from);
        let live = holder
            .filter(|_| matches!(to, StateName::Active | StateName::Draining))
            .map(|h| h.ifindex);
        self.hygiene
            .on_transition(addr, to == StateName::Quarantined, live, act);
        if to == StateName::Free {
            self.hygiene.forget(addr);
        }
    }

    /// One conflict sample from the kernel: logged (rate-limited) and published, named by who
    /// the registry says holds (or held) its address and the interface it was seen on; the age
    /// of stale traffic observed; and what the core decides it means for the registry carried
    /// out.
    pub(super) fn on_sample(
        &mut self,
        core: &mut Core,
        attacher: &Attacher,
        metrics: &Metrics,
        sample: &ConflictSample,
    ) {
        let addr = sample.addr.to_ip();
        let status = core.registry.records().get(addr).map(|r| &r.status);
        let holder = status.map(|status| match status {
            AddrStatus::Quarantined { previous, .. } => previous.clone(),
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                holder.clone()
            }
        });
        if let Some(AddrStatus::Quarantined { since, .. }) = status {
            if Reason::from_repr(sample.reason) == Some(Reason::StaleTraffic) {
                let age = sample.ts_ns.saturating_sub(*since) as f64 / 1e9;
                metrics.stale_traffic_age_seconds.observe(age);
            }
        }
        if let (Some(events), Some(record)) = (
            self.observer.pod_events(),
            core.registry.records().get(addr),
        ) {
            match (Reason::from_repr(sample.reason), &record.status) {
                (Some(Reason::Fenced), status) => {
                    if let Some(fenced) = record.fenced() {
                        events.fenced_traffic(addr, fenced, status.holder());
                    }
                }
                (Some(Reason::StaleTraffic), AddrStatus::Quarantined { previous, .. }) => {
                    events.stale_traffic(addr, previous);
                }
                _ => {}
            }
        }
        let seen_on = interface_name(core, attacher, sample.ifindex);
        self.observer.sample(sample, seen_on, holder);
        let effects = core.on_sample(sample, self.remote_claims.is_some());
        self.apply(core, effects);
    }

    /// Time passed: the writes the kernel refused are retried, then the cool-downs that are
    /// over end, with the gauges after.
    ///
    /// The retries come before the registry's own tick, whose effects may replace them. Before
    /// a release, the kernel's stale-traffic stamps of the quarantines due now are carried into
    /// the registry, where they may push the release back: stale traffic reaches the registry
    /// as samples while it happens, but at most one per address per sample interval, and none
    /// when the ring is full, so the map's own stamp (exact) has the last word. One lookup per
    /// quarantine due, never a scan of the map.
    pub(super) fn tick(&mut self, core: &mut Core, metrics: &Metrics) {
        self.enforcer.retry_pending();
        let due: Vec<IpAddr> = core
            .registry
            .records()
            .indexes()
            .due(netdev::monotonic_ns())
            .collect();
        for addr in due {
            let entry = match self.enforcer.table().kernel_entry(&AddrKey::from(addr)) {
                Ok(Some(entry)) => entry,
                Ok(None) => continue,
                Err(e) => {
                    warn!("{addr}: reading its stale-traffic stamp: {e}");
                    continue;
                }
            };
            if entry.state() != Some(AddrState::Quarantined) {
                continue;
            }
            let effects = core.on_stale_stamp(addr, entry.last_stale_ns);
            self.apply(core, effects);
        }
        let effects = core.tick();
        self.apply(core, effects);
        self.observe_gauges(&core.registry, metrics);
    }

    /// The gauges that follow the registry and the datapath, after every burst of events and
    /// of requests. O(1) in what is stored: the registry keeps its per-state counts, the table
    /// its length. (The protection gauges walk the attacher's interfaces: they are updated only
    /// where the attacher changes and on every tick, see `Protection::observe`.)
    pub(super) fn observe_gauges(&self, registry: &Registry, metrics: &Metrics) {
        metrics.observe_registry(registry);
        metrics
            .registry_entries
            .set(self.enforcer.table().len() as i64);
        metrics
            .addresses_unprotected
            .set(registry.waitlist().len() as i64);
    }
}

/// The name of interface `ifindex` as an event shows it: the node's, else the attacher's last
/// known, else `if<index>`.
fn interface_name(core: &Core, attacher: &Attacher, ifindex: u32) -> String {
    core.net
        .link_name(ifindex)
        .map(str::to_owned)
        .or_else(|| attacher.ledger().target(ifindex).map(|t| t.name.clone()))
        .unwrap_or_else(|| format!("if{ifindex}"))
}
