//! The core's handlers alone: a registry, a netlink mirror and a configuration, inputs in and
//! effects out; no journal, no datapath, no attacher, no channel.

use std::net::IpAddr;

use super::{Core, Decision, InterfaceChange};
use crate::{
    api::model::{Attachment, DrainAttachmentRequest, GcRequest},
    config::{Config, EarlyReusePolicy, Globs, Mode},
    datapath::attach::Role,
    netlink::NetEvent,
    registry::{
        AddrStatus, Effect, Holder, Registry, RegistrySettings, Source, StateName, SystemClock,
    },
};

const VETH_A: u32 = 11;
const VETH_B: u32 = 12;
const ETH0: u32 = 2;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn core_with_capacity(capacity: u32) -> Core {
    let mut config = Config {
        capacity,
        ..Config::default()
    };
    config.interfaces.workload = Globs::parse(&["veth*"]).unwrap();
    config.interfaces.uplink = vec!["eth0".to_owned()];
    let registry = Registry::new(RegistrySettings::from(&config), SystemClock);
    let mut core = Core::new(config, registry);
    for (ifindex, name) in [(VETH_A, "vethA"), (VETH_B, "vethB"), (ETH0, "eth0")] {
        core.on_net_event(NetEvent::Link {
            ifindex,
            name: name.to_owned(),
        });
    }
    core
}

fn core() -> Core {
    core_with_capacity(1024)
}

fn route(addr: &str, ifindex: u32) -> NetEvent {
    NetEvent::HostRoute {
        addr: ip(addr),
        ifindex,
    }
}

/// The transitions among `effects`, as (address, from, to).
fn transitions(effects: &[Effect]) -> Vec<(IpAddr, StateName, StateName)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Transition { addr, from, to, .. } => Some((*addr, *from, *to)),
            _ => None,
        })
        .collect()
}

fn writes(effects: &[Effect]) -> Vec<IpAddr> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Upsert { addr, .. } => Some(*addr),
            _ => None,
        })
        .collect()
}

#[test]
fn a_link_is_seen_with_the_role_its_name_gives_it() {
    let mut core = core();
    let seen = |core: &mut Core, name: &str| {
        core.on_net_event(NetEvent::Link {
            ifindex: 40,
            name: name.to_owned(),
        })
        .interface
    };
    let role_of = |change| match change {
        InterfaceChange::Seen { role, .. } => role,
        other => panic!("a link event is an interface seen, not {other:?}"),
    };
    assert_eq!(role_of(seen(&mut core, "veth9")), Some(Role::Workload));
    assert_eq!(role_of(seen(&mut core, "eth0")), Some(Role::Uplink));
    assert_eq!(
        role_of(seen(&mut core, "docker0")),
        None,
        "renamed out of every glob: the attacher is to release it"
    );
}

#[test]
fn a_host_route_on_a_workload_veth_claims_its_address_and_nowhere_else() {
    let mut core = core();
    let Decision { effects, interface } = core.on_net_event(route("10.0.0.5", VETH_A));
    assert_eq!(interface, InterfaceChange::Unchanged);
    assert_eq!(writes(&effects), vec![ip("10.0.0.5")]);
    assert_eq!(
        transitions(&effects),
        vec![(ip("10.0.0.5"), StateName::Free, StateName::Active)]
    );
    let on_uplink = core.on_net_event(route("10.0.0.6", ETH0));
    assert!(on_uplink.effects.is_empty(), "{on_uplink:?}");
    assert!(core.registry.records().get(ip("10.0.0.6")).is_none());
}

#[test]
fn a_route_withdrawn_drains_its_holder_and_the_interface_gone_quarantines() {
    let mut core = core();
    core.on_net_event(route("10.0.0.5", VETH_A));
    let withdrawn = core.on_net_event(NetEvent::HostRouteGone {
        addr: ip("10.0.0.5"),
        ifindex: VETH_A,
    });
    assert_eq!(
        transitions(&withdrawn.effects),
        vec![(ip("10.0.0.5"), StateName::Active, StateName::Draining)]
    );
    let gone = core.on_net_event(NetEvent::LinkGone { ifindex: VETH_A });
    assert_eq!(gone.interface, InterfaceChange::Gone(VETH_A));
    assert_eq!(
        transitions(&gone.effects),
        vec![(ip("10.0.0.5"), StateName::Draining, StateName::Quarantined)]
    );
    // A link nobody knew is no interface change.
    let unknown = core.on_net_event(NetEvent::LinkGone { ifindex: 99 });
    assert_eq!(unknown.interface, InterfaceChange::Unchanged);
}

#[test]
fn a_route_withdrawn_on_another_interface_leaves_the_holder_alone() {
    let mut core = core();
    core.on_net_event(route("10.0.0.5", VETH_A));
    let elsewhere = core.on_net_event(NetEvent::HostRouteGone {
        addr: ip("10.0.0.5"),
        ifindex: VETH_B,
    });
    assert!(elsewhere.effects.is_empty(), "{elsewhere:?}");
}

#[test]
fn an_address_the_node_takes_is_never_a_workloads() {
    let mut core = core();
    core.on_net_event(route("10.0.0.1", VETH_A));
    let taken = core.on_net_event(NetEvent::NodeAddress {
        addr: ip("10.0.0.1"),
        ifindex: VETH_A,
    });
    assert!(
        taken
            .effects
            .iter()
            .any(|e| matches!(e, Effect::Remove { addr } if *addr == ip("10.0.0.1"))),
        "{taken:?}"
    );
    assert!(core.registry.records().get(ip("10.0.0.1")).is_none());
    let again = core.on_net_event(route("10.0.0.1", VETH_B));
    assert!(again.effects.is_empty(), "{again:?}");
}

#[test]
fn a_claim_the_full_registry_refused_is_made_when_room_frees() {
    let mut core = core_with_capacity(1);
    core.on_net_event(route("10.0.0.1", VETH_A));
    let refused = core.on_net_event(route("10.0.0.2", VETH_B));
    assert!(refused.effects.is_empty(), "full: {refused:?}");
    assert!(core.registry.records().get(ip("10.0.0.2")).is_none());
    // The node takes the first address: one record freed, and the waiting claim is made.
    core.on_net_event(NetEvent::NodeAddress {
        addr: ip("10.0.0.1"),
        ifindex: VETH_A,
    });
    let retried = core.retry_waiting(1);
    assert_eq!(writes(&retried), vec![ip("10.0.0.2")]);
    assert!(core.registry.records().get(ip("10.0.0.2")).is_some());
}

#[test]
fn a_neighbour_behind_a_bridge_port_claims_its_address() {
    let mut core = core();
    let mac = [2, 0, 0, 0, 0, 5];
    let before_fdb = core.on_net_event(NetEvent::Neighbour {
        addr: ip("10.0.0.5"),
        ifindex: 3,
        mac: Some(mac),
    });
    assert!(
        before_fdb.effects.is_empty(),
        "no port known for the MAC yet"
    );
    let fdb = core.on_net_event(NetEvent::Fdb { mac, port: VETH_A });
    assert_eq!(writes(&fdb.effects), vec![ip("10.0.0.5")]);
    let holder = core
        .registry
        .records()
        .get(ip("10.0.0.5"))
        .and_then(|r| r.status.holder().cloned());
    assert_eq!(holder.map(|h| h.ifindex), Some(VETH_A));
}

#[test]
fn only_a_newer_stale_stamp_of_a_quarantined_address_reaches_the_registry() {
    let mut core = core();
    core.on_net_event(route("10.0.0.5", VETH_A));
    assert!(
        core.on_stale_stamp(ip("10.0.0.5"), 7).is_empty(),
        "an active address has no stale traffic"
    );
    core.on_net_event(NetEvent::LinkGone { ifindex: VETH_A });
    let last_stale = |core: &Core| match core
        .registry
        .records()
        .get(ip("10.0.0.5"))
        .map(|r| &r.status)
    {
        Some(AddrStatus::Quarantined { last_stale, .. }) => *last_stale,
        other => panic!("quarantined, not {other:?}"),
    };
    assert_eq!(last_stale(&core), None);
    core.on_stale_stamp(ip("10.0.0.5"), 0);
    assert_eq!(last_stale(&core), None, "0 is no stamp");
    let now = crate::netdev::monotonic_ns();
    core.on_stale_stamp(ip("10.0.0.5"), now);
    assert_eq!(last_stale(&core), Some(now));
    core.on_stale_stamp(ip("10.0.0.5"), now - 1);
    assert_eq!(
        last_stale(&core),
        Some(now),
        "an older stamp changes nothing"
    );
}

#[test]
fn hygiene_cleans_where_the_datapath_drops_and_never_under_observe() {
    let cases = [
        (
            Mode::Enforce,
            EarlyReusePolicy::FenceOld,
            StateName::Active,
            true,
        ),
        (
            Mode::Enforce,
            EarlyReusePolicy::FenceOld,
            StateName::Quarantined,
            true,
        ),
        // An early reuse only observed: both holders keep flowing.
        (
            Mode::Enforce,
            EarlyReusePolicy::Observe,
            StateName::Active,
            false,
        ),
        (
            Mode::Enforce,
            EarlyReusePolicy::Observe,
            StateName::Draining,
            false,
        ),
        // A reuse after the quarantine is no early reuse: the old holder is gone.
        (
            Mode::Enforce,
            EarlyReusePolicy::Observe,
            StateName::Quarantined,
            true,
        ),
        (
            Mode::Observe,
            EarlyReusePolicy::FenceOld,
            StateName::Active,
            false,
        ),
    ];
    for (mode, policy, from, cleans) in cases {
        let mut core = core();
        core.config.mode = mode;
        core.config.on_early_reuse = policy;
        assert_eq!(
            core.cleans(ip("10.0.0.5"), from),
            cleans,
            "{mode:?}, {policy:?}, from {from:?}"
        );
    }
}

#[test]
fn a_cni_gc_drains_only_the_cni_made_holders_the_runtime_no_longer_lists() {
    let mut core = core();
    let cni = |id: &str, ifindex: u32, name: &str| {
        Holder::new(ifindex, name)
            .with_container_id(id)
            .with_cni_ifname("eth0")
    };
    for (addr, holder) in [
        ("10.0.0.1", cni("c-listed", VETH_A, "vethA")),
        ("10.0.0.2", cni("c-gone", VETH_B, "vethB")),
    ] {
        core.registry.claim(ip(addr), holder, Source::Cni).unwrap();
    }
    // Seen on netlink only: no container, not the runtime's to collect.
    core.on_net_event(route("10.0.0.3", VETH_A));
    let request = GcRequest {
        valid_attachments: vec![Attachment {
            container_id: "c-listed".to_owned(),
            ifname: "eth0".to_owned(),
        }],
        network: None,
    };
    let drained = core.gc(&request);
    assert_eq!(
        drained.addresses.into_iter().collect::<Vec<_>>(),
        vec![ip("10.0.0.2")]
    );
    assert_eq!(
        transitions(&drained.effects),
        vec![(ip("10.0.0.2"), StateName::Active, StateName::Draining)]
    );
    let del = core.drain_attachment(&DrainAttachmentRequest {
        container_id: "c-listed".to_owned(),
        cni_ifname: Some("eth0".to_owned()),
        addresses: Vec::new(),
    });
    assert_eq!(
        del.addresses.into_iter().collect::<Vec<_>>(),
        vec![ip("10.0.0.1")]
    );
}

#[test]
fn a_remote_claim_sample_of_a_pods_address_asks_the_cluster_and_its_answer_decides() {
    let mut core = core();
    let addr = ip("10.0.0.7");
    let pod = Holder::new(VETH_A, "vethA").with_pod(crate::registry::PodRef {
        namespace: "default".into(),
        name: "web-0".into(),
        uid: Some("uid-1".into()),
    });
    core.registry.claim(addr, pod.clone(), Source::Cni).unwrap();
    let sample = ipq_common::sample::ConflictSample {
        addr: addr.into(),
        ifindex: ETH0,
        reason: ipq_common::counters::Reason::RemoteClaim as u32,
        ..Default::default()
    };
    let fenced = |core: &Core| core.registry.records().get(addr).unwrap().fenced().cloned();

    // Without an asker: fenced on the announcement's word (fence-old, the default).
    let mut without = core_with_capacity(1024);
    without
        .registry
        .claim(addr, pod.clone(), Source::Cni)
        .unwrap();
    without.on_sample(&sample, false);
    assert_eq!(fenced(&without), Some(pod.clone()));

    // With one: the cluster is asked, nothing decided yet.
    let effects = core.on_sample(&sample, true);
    assert_eq!(
        effects,
        vec![Effect::AskAboutHolder {
            addr,
            holder: pod.clone()
        }]
    );
    assert_eq!(fenced(&core), None);
    let answer = |standing| crate::remote_claim::Answer {
        addr,
        holder: pod.clone(),
        standing,
    };
    core.on_remote_claim_answer(&answer(crate::registry::PodStanding::Present));
    assert_eq!(fenced(&core), None, "the pod is still there");
    core.on_sample(&sample, true);
    core.on_remote_claim_answer(&answer(crate::registry::PodStanding::Gone));
    assert_eq!(fenced(&core), Some(pod));
}
