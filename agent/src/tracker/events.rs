//! Netlink events, kernel samples and time: the core decides what they mean for the registry,
//! and the tracker carries out its decisions.

use std::net::IpAddr;

use ipq_common::{addr::AddrState, counters::Reason, sample::ConflictSample};
use log::{info, warn};

use super::{decide::InterfaceChange, Tracker};
use crate::{netdev, netlink::NetEvent, registry::AddrStatus};

impl Tracker {
    /// One netlink event, with the gauges it changes.
    pub fn on_event(&mut self, event: NetEvent) {
        let attacher_changed = self.apply_event(event);
        self.update_gauges();
        if attacher_changed {
            self.protection.observe();
        }
    }

    /// One netlink event, without the gauges (a resync updates them once after all its
    /// events); returns whether it changed what the attacher wants.
    pub(super) fn apply_event(&mut self, event: NetEvent) -> bool {
        let decision = self.core.on_net_event(event);
        let attacher_changed = match decision.interface {
            InterfaceChange::Unchanged => false,
            InterfaceChange::Seen {
                ifindex,
                name,
                role,
            } => self.protection.want(ifindex, &name, role),
            InterfaceChange::Gone(ifindex) => {
                self.protection.attacher.forget(ifindex);
                true
            }
        };
        self.sinks.apply(&mut self.core, decision.effects);
        attacher_changed
    }

    /// Detaches what earlier agents attached and no configured interface needs now.
    pub fn prune_links(&self) {
        match self.protection.attacher.prune() {
            Ok(removed) => {
                for (ifindex, point) in removed {
                    info!(
                        "detached if{ifindex} {}: no longer configured or gone",
                        point.as_ref()
                    );
                }
            }
            Err(e) => warn!("pruning stale link pins: {e}"),
        }
    }

    /// Ends the quarantines that are due.
    pub fn tick(&mut self) {
        self.protection
            .attacher
            .retry_due(std::time::Instant::now());
        // Writes the kernel refused before the registry's own tick, whose effects may replace
        // them.
        self.sinks.enforcer.retry_pending();
        self.refresh_stale();
        let effects = self.core.tick();
        self.sinks.apply(&mut self.core, effects);
        self.update_gauges();
        self.protection.observe();
    }

    /// Carries the kernel's stale-traffic stamps of the quarantines due now into the registry,
    /// where they may push the release back. Stale traffic reaches the registry as samples while
    /// it happens, but at most one per address per sample interval, and none when the ring is
    /// full: before a release, the map's own stamp (exact) has the last word. One lookup per
    /// quarantine due, never a scan of the map.
    fn refresh_stale(&mut self) {
        let due: Vec<IpAddr> = self
            .core
            .registry
            .records()
            .indexes()
            .due(netdev::monotonic_ns())
            .collect();
        for addr in due {
            let entry = match self.sinks.enforcer.kernel_entry(addr) {
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
            let effects = self.core.on_stale_stamp(addr, entry.last_stale_ns);
            self.sinks.apply(&mut self.core, effects);
        }
    }

    /// One conflict sample from the kernel: logged and published, the age of stale traffic
    /// observed, and what it means for the registry carried out.
    pub fn on_sample(&mut self, sample: &ConflictSample) {
        self.sinks
            .publish_sample(&self.core, &self.protection.attacher, sample);
        if Reason::from_repr(sample.reason) == Some(Reason::StaleTraffic) {
            if let Some(AddrStatus::Quarantined { since, .. }) = self
                .core
                .registry
                .records()
                .get(sample.addr.to_ip())
                .map(|r| &r.status)
            {
                let age = sample.ts_ns.saturating_sub(*since) as f64 / 1e9;
                self.metrics.stale_traffic_age_seconds.observe(age);
            }
        }
        let effects = self.core.on_sample(sample);
        self.sinks.apply(&mut self.core, effects);
    }
}
