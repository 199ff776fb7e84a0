//! What netlink events, kernel samples and time mean for the registry.

use std::net::IpAddr;

use ipq_common::{addr::AddrState, counters::Reason, sample::ConflictSample};
use log::{info, warn};

use super::Tracker;
use crate::{
    netdev,
    netlink::NetEvent,
    registry::{AddrStatus, Holder, RegistryError, Source},
};

impl Tracker {
    /// One netlink event, with the gauges it changes.
    pub fn on_event(&mut self, event: NetEvent) {
        let attacher_changed = self.apply_event(event);
        self.update_gauges();
        if attacher_changed {
            self.observe_protection();
        }
    }

    /// One netlink event, without the gauges (a resync updates them once after all its
    /// events); returns whether it changed what the attacher wants.
    pub(super) fn apply_event(&mut self, event: NetEvent) -> bool {
        match &event {
            NetEvent::Link { ifindex, name } => {
                self.net.apply(&event);
                // Also on a rename: a veth renamed into (or out of) a workload glob changes role.
                return self.attach(*ifindex, name);
            }
            NetEvent::LinkGone { ifindex } => {
                let known = self.net.has_link(*ifindex);
                self.net.apply(&event);
                self.registry.stop_waiting_on(*ifindex);
                if known {
                    let result = self.registry.holder_gone(*ifindex);
                    self.apply(result, "interface deleted");
                    self.attacher.forget(*ifindex);
                    return true;
                }
            }
            NetEvent::HostRoute { addr, ifindex } => {
                self.net.apply(&event);
                if let Some(holder) = self.workload_holder(*ifindex) {
                    self.observed_claim(*addr, holder, "host route added");
                }
            }
            NetEvent::HostRouteGone { addr, ifindex } => {
                self.net.apply(&event);
                self.registry.stop_waiting(*addr, *ifindex);
                // A route withdrawn while its interface lives: the holder is terminating.
                if let Some(holder) = self.workload_holder(*ifindex) {
                    let current = self
                        .registry
                        .get(*addr)
                        .and_then(|r| r.status.holder().cloned());
                    if current.is_some_and(|h| h.same_as(&holder)) {
                        let result = self.registry.drain(*addr, Some(&holder));
                        self.apply(result, "host route withdrawn");
                    }
                }
            }
            NetEvent::NodeAddress { addr, .. } => {
                self.net.apply(&event);
                self.node_took(*addr);
            }
            NetEvent::NodeAddressGone { .. } => {
                self.net.apply(&event);
            }
            NetEvent::Neighbour { addr, .. } => {
                self.net.apply(&event);
                self.claim_behind_bridge_port(*addr);
            }
            NetEvent::Fdb { mac, .. } => {
                self.net.apply(&event);
                // The addresses resolved to this MAC, from the MAC index: not a scan.
                for addr in self.net.addresses_with_mac(mac) {
                    self.claim_behind_bridge_port(addr);
                }
            }
            // A neighbour or FDB entry expiring says nothing about the holder's life: only its
            // interface going away does.
            NetEvent::NeighbourGone { .. } | NetEvent::FdbGone { .. } => {
                self.net.apply(&event);
            }
            NetEvent::Overrun => {}
        }
        false
    }

    /// A claim seen on netlink. An address the node itself holds is never a workload's; a
    /// claim the full registry refuses waits for space.
    fn observed_claim(&mut self, addr: IpAddr, holder: Holder, why: &str) {
        if self.net.is_node_address(addr) {
            return;
        }
        match self.registry.claim(addr, holder.clone(), Source::Netlink) {
            Err(RegistryError::Full { capacity, .. }) => {
                if self.registry.wait_for_room(addr, holder) {
                    warn!(
                        "{addr}: not protected: the registry is full ({capacity} addresses); \
                         claimed as soon as space frees"
                    );
                }
            }
            result => self.apply(result, why),
        }
    }

    /// An address turned out to be the node's own: whatever record a workload had on it goes
    /// (an agent before this one may have taken a gateway on a veth for a pod's address).
    fn node_took(&mut self, addr: IpAddr) {
        if self.registry.get(addr).is_none() {
            return;
        }
        warn!("{addr}: configured on the node itself; no workload holds it, its record goes");
        let result = self.registry.forget(addr);
        self.apply(result, "address of the node");
    }

    /// Space freed in the registry: claims it refused for being full are tried again, oldest
    /// first, as long as their holders still show them (at most `freed` claims).
    pub(super) fn retry_waiting(&mut self, freed: usize) {
        let net = &self.net;
        let run = self.registry.claim_waiting(freed, |addr, ifindex| {
            (net.has_host_route(addr, ifindex) || net.port_of(addr) == Some(ifindex))
                && !net.is_node_address(addr)
        });
        if run.claimed > 0 {
            self.apply(Ok(run.effects), "registry has room again");
        }
        if run.rescan {
            self.rescan_unclaimed_routes();
        }
    }

    /// Claims every workload host route the registry lacks: once, after the pending queue's
    /// bound left claimants out and the queue ran dry.
    fn rescan_unclaimed_routes(&mut self) {
        let unclaimed: Vec<(IpAddr, u32)> = self
            .net
            .host_routes()
            .filter(|(addr, _)| self.registry.get(*addr).is_none())
            .collect();
        for (addr, ifindex) in unclaimed {
            if let Some(holder) = self.workload_holder(ifindex) {
                self.observed_claim(addr, holder, "host route seen while the registry was full");
            }
        }
    }

    /// On bridge-plugin nodes a pod's address has no host route: the bridge resolved it to a
    /// MAC, and the forwarding database says which port (the pod's veth) that MAC is behind.
    fn claim_behind_bridge_port(&mut self, addr: IpAddr) {
        let Some(port) = self.net.port_of(addr) else {
            return;
        };
        let Some(holder) = self.workload_holder(port) else {
            return;
        };
        let current = self
            .registry
            .get(addr)
            .and_then(|r| r.status.holder().cloned());
        if current.as_ref().is_some_and(|h| h.same_as(&holder)) {
            return;
        }
        // A neighbour entry follows whoever last sent with the address; it is weaker evidence
        // than an explicit claim (CNI, API), which names a container. Letting it contest one
        // would hand the address back to an old holder whose early reuse was only observed,
        // losing the claimant's identity; the datapath sees that old holder's packets anyway.
        if current.is_some_and(|h| h.container_id().is_some()) {
            return;
        }
        self.observed_claim(addr, holder, "neighbour behind a bridge port");
    }

    /// Asks for `ifindex` to be protected in the role its name gives it (or forgotten, when
    /// its name no longer matches the configuration); the attach itself runs off this loop.
    /// Returns whether that changed what the attacher wants (most link events, an operstate
    /// or carrier change, do not).
    pub(super) fn attach(&mut self, ifindex: u32, name: &str) -> bool {
        let wanted = |t: &Tracker| {
            t.attacher
                .target(ifindex)
                .map(|target| (target.name.clone(), target.role))
        };
        let before = wanted(self);
        match self.role(name) {
            Some(role) => self.attacher.want(ifindex, name, role),
            None => self.attacher.release(ifindex),
        }
        wanted(self) != before
    }

    /// Detaches what earlier agents attached and no configured interface needs now.
    pub fn prune_links(&self) {
        match self.attacher.prune() {
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
        self.attacher.retry_due(std::time::Instant::now());
        // Writes the kernel refused before the registry's own tick, whose effects may replace
        // them.
        self.enforcer.retry_pending();
        self.refresh_stale();
        let result = self.registry.tick();
        self.apply(result, "cool-down over");
        self.update_gauges();
        self.observe_protection();
    }

    /// Carries the kernel's stale-traffic stamps of the quarantines due now into the registry,
    /// where they may push the release back. Stale traffic reaches the registry as samples while
    /// it happens, but at most one per address per sample interval, and none when the ring is
    /// full: before a release, the map's own stamp (exact) has the last word. One lookup per
    /// quarantine due, never a scan of the map.
    fn refresh_stale(&mut self) {
        let due: Vec<IpAddr> = self.registry.due(netdev::monotonic_ns()).collect();
        for addr in due {
            let entry = match self.enforcer.kernel_entry(addr) {
                Ok(Some(entry)) => entry,
                Ok(None) => continue,
                Err(e) => {
                    warn!("{addr}: reading its stale-traffic stamp: {e}");
                    continue;
                }
            };
            if entry.state() != Some(AddrState::Quarantined) || entry.last_stale_ns == 0 {
                continue;
            }
            let known = match self.registry.get(addr).map(|r| &r.status) {
                Some(AddrStatus::Quarantined { last_stale, .. }) => *last_stale,
                _ => continue,
            };
            if known.is_none_or(|k| entry.last_stale_ns > k) {
                let result = self.registry.stale_seen(addr, entry.last_stale_ns);
                self.apply(result, "stale traffic");
            }
        }
    }

    /// One conflict sample from the kernel.
    pub fn on_sample(&mut self, sample: &ConflictSample) {
        let addr = sample.addr.to_ip();
        self.publish_sample(sample);
        let observe_only = self.registry.get(addr).is_some_and(|r| r.observe_only);
        match Reason::from_repr(sample.reason) {
            Some(Reason::StaleTraffic) => {
                if let Some(AddrStatus::Quarantined { since, .. }) =
                    self.registry.get(addr).map(|r| &r.status)
                {
                    let age = sample.ts_ns.saturating_sub(*since) as f64 / 1e9;
                    self.metrics.stale_traffic_age_seconds.observe(age);
                }
                let result = self.registry.stale_seen(addr, sample.ts_ns);
                self.apply(result, "stale traffic");
            }
            Some(Reason::RemoteClaim) => {
                let result = self.registry.remote_claim(addr);
                self.apply(result, "remote claim");
            }
            // On an address whose early reuse was let through, the old holder's packets are the
            // evidence of the conflict already recorded, not a new one.
            Some(Reason::DuplicateSource) if observe_only => {}
            Some(Reason::DuplicateSource) => {
                let result = self.registry.duplicate_source(addr, sample.ifindex);
                self.apply(result, "duplicate source");
            }
            _ => {}
        }
    }
}
