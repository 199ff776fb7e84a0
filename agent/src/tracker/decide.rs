//! The registry's decisions, without I/O: the registry, the node's netlink mirror and the
//! configuration, behind handlers that take what netlink observed, what the kernel sampled or
//! what time it is, and return the registry's effects (and what an interface's change asks of
//! the attacher). The [`super::Tracker`] hands those to the parts that own each sink: the
//! datapath writer, the observer, hygiene, the attacher, the journal.

use std::net::IpAddr;

use ipq_common::{
    counters::{Action, Reason},
    sample::ConflictSample,
    verdict,
};
use log::warn;

use crate::{
    config::{Config, EarlyReusePolicy},
    datapath::attach::Role,
    netlink::{NetEvent, NetState},
    registry::{AddrStatus, Conflict, Effect, Holder, Registry, RegistryError, Source, StateName},
};

pub(super) struct Core {
    pub(super) config: Config,
    pub(super) registry: Registry,
    /// The node's links, routes, addresses and neighbours, as netlink last said.
    pub(super) net: NetState,
}

/// What a netlink event asks of the attacher, beside the registry's effects.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum InterfaceChange {
    /// Nothing about interfaces.
    Unchanged,
    /// An interface seen (new, renamed or changed): its role under the configuration, `None`
    /// when its name matches none.
    Seen {
        ifindex: u32,
        name: String,
        role: Option<Role>,
    },
    /// A known interface deleted.
    Gone(u32),
}

/// What one input decided.
#[derive(Debug, PartialEq)]
pub(super) struct Decision {
    pub(super) effects: Vec<Effect>,
    pub(super) interface: InterfaceChange,
}

impl Decision {
    fn effects(effects: Vec<Effect>) -> Self {
        Self {
            effects,
            interface: InterfaceChange::Unchanged,
        }
    }
}

/// What interface `ifname` is to ipq under `config`: the uplink's role wins over a workload
/// glob that also matches it.
pub(super) fn role(config: &Config, ifname: &str) -> Option<Role> {
    if config.is_uplink(ifname) {
        Some(Role::Uplink)
    } else if config.workload_glob_matching(ifname).is_some() {
        Some(Role::Workload)
    } else {
        None
    }
}

/// The holder of an address behind `ifindex` on the node `net` mirrors, when it is a workload's
/// interface under `config`.
fn workload_holder(config: &Config, net: &NetState, ifindex: u32) -> Option<Holder> {
    let name = net.link_name(ifindex)?;
    (role(config, name) == Some(Role::Workload)).then(|| Holder::new(ifindex, name.to_owned()))
}

/// Who holds `addr` now, as `registry` says.
fn holder_of(registry: &Registry, addr: IpAddr) -> Option<&Holder> {
    registry.records().get(addr).and_then(|r| r.status.holder())
}

/// A registry operation's effects, or nothing, with the reason logged, when it refused.
pub(super) fn settled(result: Result<Vec<Effect>, RegistryError>, why: &str) -> Vec<Effect> {
    // Only explicit claims (the API) answer a refusal; they record their conflict there.
    result.unwrap_or_else(|e| {
        warn!("{why}: {e}");
        Vec::new()
    })
}

impl Core {
    pub(super) fn new(config: Config, registry: Registry) -> Self {
        Self {
            config,
            registry,
            net: NetState::default(),
        }
    }

    /// One netlink event: the mirror follows it, and the registry what it says of holders.
    pub(super) fn on_net_event(&mut self, event: NetEvent) -> Decision {
        match &event {
            NetEvent::Link { ifindex, name } => {
                self.net.apply(&event);
                // Also on a rename: a veth renamed into (or out of) a workload glob changes
                // role.
                let role = role(&self.config, name);
                return Decision {
                    effects: Vec::new(),
                    interface: InterfaceChange::Seen {
                        ifindex: *ifindex,
                        name: name.clone(),
                        role,
                    },
                };
            }
            NetEvent::LinkGone { ifindex } => {
                let known = self.net.has_link(*ifindex);
                self.net.apply(&event);
                self.registry.waitlist_mut().forget_interface(*ifindex);
                if known {
                    let result = self.registry.lifecycle_mut().holder_gone(*ifindex);
                    return Decision {
                        effects: settled(result, "interface deleted"),
                        interface: InterfaceChange::Gone(*ifindex),
                    };
                }
            }
            NetEvent::HostRoute { addr, ifindex } => {
                self.net.apply(&event);
                if let Some(holder) = workload_holder(&self.config, &self.net, *ifindex) {
                    return Decision::effects(self.observed_claim(
                        *addr,
                        holder,
                        "host route added",
                    ));
                }
            }
            NetEvent::HostRouteGone { addr, ifindex } => {
                self.net.apply(&event);
                self.registry.waitlist_mut().forget(*addr, *ifindex);
                // A route withdrawn while its interface lives: the holder is terminating.
                if let Some(holder) = workload_holder(&self.config, &self.net, *ifindex) {
                    if holder_of(&self.registry, *addr).is_some_and(|h| h.same_as(&holder)) {
                        let result = self.registry.lifecycle_mut().drain(*addr, Some(&holder));
                        return Decision::effects(settled(result, "host route withdrawn"));
                    }
                }
            }
            NetEvent::NodeAddress { addr, .. } => {
                self.net.apply(&event);
                return Decision::effects(self.node_took(*addr));
            }
            NetEvent::Neighbour { addr, .. } => {
                self.net.apply(&event);
                return Decision::effects(self.claim_behind_bridge_port(*addr));
            }
            NetEvent::Fdb { mac, .. } => {
                self.net.apply(&event);
                // The addresses resolved to this MAC, from the MAC index: not a scan.
                let mut effects = Vec::new();
                for addr in self.net.addresses_with_mac(mac) {
                    effects.extend(self.claim_behind_bridge_port(addr));
                }
                return Decision::effects(effects);
            }
            // A neighbour or FDB entry expiring says nothing about the holder's life: only its
            // interface going away does.
            NetEvent::NodeAddressGone { .. }
            | NetEvent::NeighbourGone { .. }
            | NetEvent::FdbGone { .. } => {
                self.net.apply(&event);
            }
            NetEvent::Overrun => {}
        }
        Decision::effects(Vec::new())
    }

    /// A claim seen on netlink. An address the node itself holds is never a workload's; a
    /// claim the full registry refuses waits for space.
    fn observed_claim(&mut self, addr: IpAddr, holder: Holder, why: &str) -> Vec<Effect> {
        if self.net.is_node_address(addr) {
            return Vec::new();
        }
        match self.registry.claim(addr, holder.clone(), Source::Netlink) {
            Err(RegistryError::Full { capacity, .. }) => {
                if self.registry.waitlist_mut().push(addr, holder) {
                    warn!(
                        "{addr}: not protected: the registry is full ({capacity} addresses); \
                         claimed as soon as space frees"
                    );
                }
                Vec::new()
            }
            result => settled(result, why),
        }
    }

    /// An address turned out to be the node's own: whatever record a workload had on it goes
    /// (an agent before this one may have taken a gateway on a veth for a pod's address).
    fn node_took(&mut self, addr: IpAddr) -> Vec<Effect> {
        if self.registry.records().get(addr).is_none() {
            return Vec::new();
        }
        warn!("{addr}: configured on the node itself; no workload holds it, its record goes");
        settled(
            self.registry.lifecycle_mut().forget(addr),
            "address of the node",
        )
    }

    /// Space freed in the registry: claims it refused for being full are tried again, oldest
    /// first, as long as their holders still show them (at most `freed` claims).
    pub(super) fn retry_waiting(&mut self, freed: usize) -> Vec<Effect> {
        let net = &self.net;
        let run = self.registry.claim_waiting(freed, |addr, ifindex| {
            (net.has_host_route(addr, ifindex) || net.port_of(addr) == Some(ifindex))
                && !net.is_node_address(addr)
        });
        let mut effects = run.effects;
        if run.rescan {
            effects.extend(self.rescan_unclaimed_routes());
        }
        effects
    }

    /// Claims every workload host route the registry lacks: once, after the pending queue's
    /// bound left claimants out and the queue ran dry.
    fn rescan_unclaimed_routes(&mut self) -> Vec<Effect> {
        let unclaimed: Vec<(IpAddr, u32)> = self
            .net
            .host_routes()
            .filter(|(addr, _)| self.registry.records().get(*addr).is_none())
            .collect();
        let mut effects = Vec::new();
        for (addr, ifindex) in unclaimed {
            if let Some(holder) = workload_holder(&self.config, &self.net, ifindex) {
                effects.extend(self.observed_claim(
                    addr,
                    holder,
                    "host route seen while the registry was full",
                ));
            }
        }
        effects
    }

    /// On bridge-plugin nodes a pod's address has no host route: the bridge resolved it to a
    /// MAC, and the forwarding database says which port (the pod's veth) that MAC is behind.
    fn claim_behind_bridge_port(&mut self, addr: IpAddr) -> Vec<Effect> {
        let Some(port) = self.net.port_of(addr) else {
            return Vec::new();
        };
        let Some(holder) = workload_holder(&self.config, &self.net, port) else {
            return Vec::new();
        };
        let current = holder_of(&self.registry, addr);
        if current.is_some_and(|h| h.same_as(&holder)) {
            return Vec::new();
        }
        // A neighbour entry follows whoever last sent with the address; it is weaker evidence
        // than an explicit claim (CNI, API), which names a container. Letting it contest one
        // would hand the address back to an old holder whose early reuse was only observed,
        // losing the claimant's identity; the datapath sees that old holder's packets anyway.
        if current.is_some_and(|h| h.container_id().is_some()) {
            return Vec::new();
        }
        self.observed_claim(addr, holder, "neighbour behind a bridge port")
    }

    /// What a conflict sample from the kernel means for the registry; `asks_the_cluster`
    /// when a remote claim's local holder can be asked about (the API server).
    pub(super) fn on_sample(
        &mut self,
        sample: &ConflictSample,
        asks_the_cluster: bool,
    ) -> Vec<Effect> {
        let addr = sample.addr.to_ip();
        let observe_only = self
            .registry
            .records()
            .get(addr)
            .is_some_and(|r| r.observe_only);
        match Reason::from_repr(sample.reason) {
            Some(Reason::StaleTraffic) => settled(
                self.registry.lifecycle_mut().stale_seen(addr, sample.ts_ns),
                "stale traffic",
            ),
            Some(Reason::RemoteClaim) => settled(
                self.registry
                    .lifecycle_mut()
                    .remote_claim(addr, asks_the_cluster),
                "remote claim",
            ),
            // On an address whose early reuse was let through, the old holder's packets are the
            // evidence of the conflict already recorded, not a new one.
            Some(Reason::DuplicateSource) if observe_only => Vec::new(),
            Some(Reason::DuplicateSource) => settled(
                self.registry
                    .lifecycle_mut()
                    .duplicate_source(addr, sample.ifindex),
                "duplicate source",
            ),
            _ => Vec::new(),
        }
    }

    /// The API server's answer about a remote claim's local holder.
    pub(super) fn on_remote_claim_answer(
        &mut self,
        answer: &crate::remote_claim::Answer,
    ) -> Vec<Effect> {
        settled(
            self.registry.lifecycle_mut().remote_claim_answered(
                answer.addr,
                &answer.holder,
                answer.standing,
            ),
            "remote claim answered",
        )
    }

    /// The kernel's stale-traffic stamp of a quarantine due now (`last_stale_ns`, from its
    /// datapath entry): newer than what the registry knows, it may push the release back.
    pub(super) fn on_stale_stamp(&mut self, addr: IpAddr, last_stale_ns: u64) -> Vec<Effect> {
        let known = match self.registry.records().get(addr).map(|r| &r.status) {
            Some(AddrStatus::Quarantined { last_stale, .. }) => *last_stale,
            _ => return Vec::new(),
        };
        if last_stale_ns == 0 || known.is_some_and(|k| last_stale_ns <= k) {
            return Vec::new();
        }
        settled(
            self.registry
                .lifecycle_mut()
                .stale_seen(addr, last_stale_ns),
            "stale traffic",
        )
    }

    /// Whether reuse hygiene cleans `addr` as it leaves `from`: exactly when the datapath
    /// drops a workload conflict on it. Under `observe` (the mode, or an early reuse only
    /// observed) every holder keeps flowing, and so must their state. (The transition comes
    /// before its conflict, so an observed early reuse is recognised here by the policy and the
    /// live old holder.)
    pub(super) fn cleans(&self, addr: IpAddr, from: StateName) -> bool {
        let observed_reuse = self
            .registry
            .records()
            .get(addr)
            .is_some_and(|r| r.observe_only)
            || (self.config.on_early_reuse == EarlyReusePolicy::Observe
                && matches!(from, StateName::Active | StateName::Draining));
        let namespace_observed = self
            .registry
            .records()
            .get(addr)
            .is_some_and(|r| r.namespace_observed);
        let flags = if namespace_observed {
            ipq_common::addr::FLAG_OBSERVE_NAMESPACE
        } else if observed_reuse {
            ipq_common::addr::FLAG_OBSERVE_ONLY
        } else {
            0
        };
        verdict::action_for_flags(self.config.mode, Reason::Fenced, flags) == Action::Dropped
    }

    /// The conflict a claim by `claimant` that the policy refused (`refuse-new`) is: the
    /// registry records none for a refusal, so the API's side counts and publishes this one.
    pub(super) fn refusal(&self, error: &RegistryError, claimant: &Holder) -> Option<Conflict> {
        let RegistryError::Refused {
            addr, holder: old, ..
        } = error
        else {
            return None;
        };
        Some(Conflict {
            kind: error.conflict_kind()?,
            addr: *addr,
            old: Some((**old).clone()),
            new: Some(claimant.clone()),
            policy: self.config.on_early_reuse,
            at: crate::netdev::monotonic_ns(),
        })
    }

    /// The cool-downs that are over.
    pub(super) fn tick(&mut self) -> Vec<Effect> {
        settled(self.registry.lifecycle_mut().tick(), "cool-down over")
    }
}

mod drains;

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
