//! The tables of `ipq`, drawn from constructed answers at a fixed `now`.

use std::time::SystemTime;

use super::render::{self, holder_short};
use ipq_api::{
    model::{
        AddressView, ClaimFlushView, ConflictView, Event, EventBody, ExhaustedAnswer,
        InterfaceStatus, IpamHoldView, PendingWriteView, PublishView, RecoveryView, RegistryCounts,
        Status, VerificationView,
    },
    AttachedHook, Attachment, CheckedMap, ConflictKind, ConflictOutcome, ConntrackFlush,
    DriftFoundBy, EarlyReusePolicy, EntryState, EventHook, HoldRelease, Holder, HygieneTrigger,
    LostPart, MapWrite, OnExhausted, PodRef, Protection, RecoveredFrom, SampleAction, SampleReason,
    StateName, TcAttachMode,
};

const NOW: &str = "2026-11-22T10:01:00Z";

fn now() -> SystemTime {
    humantime::parse_rfc3339(NOW).unwrap()
}

fn pod_holder() -> Holder {
    Holder::new(5, "vethpa")
        .with_container_id("3f2a1b9c0d1e77aa88bb")
        .with_cni_ifname("eth0")
        .with_netns("/var/run/netns/cni-1")
        .with_pod(PodRef {
            namespace: "default".into(),
            name: "web-1".into(),
            uid: Some("u-1".into()),
        })
}

fn view(address: &str, state: StateName, since: &str) -> AddressView {
    AddressView {
        state,
        since: since.into(),
        ..AddressView::free(address.parse().unwrap())
    }
}

#[test]
fn a_holder_is_its_interface_and_pod_else_a_short_container_id() {
    assert_eq!(holder_short(&pod_holder()), "vethpa default/web-1");
    let container = Holder::new(6, "vethpb").with_container_id("0123456789abcdef0123");
    assert_eq!(holder_short(&container), "vethpb 0123456789ab");
    assert_eq!(holder_short(&Holder::new(7, "eth9")), "eth9");
}

#[test]
fn list_shows_holders_and_relative_times() {
    let active = AddressView {
        holder: Some(pod_holder()),
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:48Z")
    };
    let quarantined = AddressView {
        previous_holder: Some(Holder::new(6, "vethpb").with_container_id("abcdef0123456789")),
        until: Some("2026-11-22T10:01:18.4Z".into()),
        conflicts: 2,
        ..view("fd77::3", StateName::Quarantined, "2026-11-22T09:56:00Z")
    };
    assert_eq!(
        render::addresses(&[active, quarantined], now()),
        "\
ADDRESS    STATE        HOLDER                   SINCE    UNTIL   CONFLICTS
10.77.0.2  active       vethpa default/web-1     12s ago  -       0
fd77::3    quarantined  was vethpb abcdef012345  5m ago   in 18s  2
"
    );
}

#[test]
fn list_adds_the_fenced_column_only_when_some_address_is_fenced() {
    let fenced = AddressView {
        holder: Some(Holder::new(6, "vethpb")),
        fenced: Some(Holder::new(5, "vethpa")),
        conflicts: 1,
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:00Z")
    };
    let plain = AddressView {
        holder: Some(Holder::new(6, "vethpb")),
        ..view("10.77.0.3", StateName::Draining, "2026-11-22T10:00:59Z")
    };
    assert_eq!(
        render::addresses(&[fenced, plain], now()),
        "\
ADDRESS    STATE     HOLDER  SINCE   UNTIL  CONFLICTS  FENCED
10.77.0.2  active    vethpb  1m ago  -      1          vethpa
10.77.0.3  draining  vethpb  1s ago  -      0          -
"
    );
}

#[test]
fn list_adds_the_protection_column_only_when_a_holder_is_unprotected() {
    let attaching = AddressView {
        holder: Some(Holder::new(6, "vethpb")),
        protection: Some(Protection::Attaching),
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:59Z")
    };
    let protected = AddressView {
        holder: Some(Holder::new(5, "vethpa")),
        protection: Some(Protection::Protected),
        attachment: Some(Attachment::Netlink),
        ..view("10.77.0.3", StateName::Active, "2026-11-22T10:00:59Z")
    };
    assert_eq!(
        render::addresses(&[attaching.clone(), protected.clone()], now()),
        "\
ADDRESS    STATE   HOLDER  SINCE   UNTIL  CONFLICTS  PROTECTION
10.77.0.2  active  vethpb  1s ago  -      0          attaching
10.77.0.3  active  vethpa  1s ago  -      0          protected
"
    );
    assert!(!render::addresses(std::slice::from_ref(&protected), now()).contains("PROTECTION"));
    assert!(render::address_detail(&attaching, now()).contains("Protection:"));
    let detail = render::address_detail(&protected, now());
    assert!(
        detail.contains("Protection:        protected (netlink)\n"),
        "{detail}"
    );
}

#[test]
fn an_empty_list_is_its_header() {
    assert_eq!(
        render::addresses(&[], now()),
        "ADDRESS  STATE  HOLDER  SINCE  UNTIL  CONFLICTS\n"
    );
}

#[test]
fn get_shows_every_field() {
    let detail = AddressView {
        holder: Some(Holder::new(6, "vethpb")),
        fenced: Some(pod_holder()),
        displaced: vec![Holder::new(8, "vethx"), Holder::new(9, "vethy")],
        until: Some("2026-11-22T10:02:00Z".into()),
        last_stale: Some("2026-11-22T10:00:58Z".into()),
        conflicts: 3,
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:00Z")
    };
    assert_eq!(
        render::address_detail(&detail, now()),
        "\
Address:           10.77.0.2
State:             active
Since:             2026-11-22T10:00:00Z (1m ago)
Until:             2026-11-22T10:02:00Z (in 1m)
Last stale:        2026-11-22T10:00:58Z (2s ago)
Conflicts:         3
Last flush:        -
Holder:            vethpb (ifindex 6)
Previous holder:   -
Fenced:            vethpa (ifindex 5)
  Container:       3f2a1b9c0d1e77aa88bb
  CNI ifname:      eth0
  Netns:           /var/run/netns/cni-1
  Pod:             default/web-1 (uid u-1)
Blocked claimant:  -
Displaced:         vethx (ifindex 8)
Displaced:         vethy (ifindex 9)
"
    );
}

#[test]
fn status_shows_readiness_counts_and_hooks() {
    let status = Status {
        ready: true,
        not_ready: None,
        tc_attach: TcAttachMode::NetlinkThenTcx,
        unprotected: 0,
        conntrack_claim_flush: Some(ClaimFlushView {
            ipv4: "kernel".into(),
            ipv6: "dump (the kernel did not honour the filter)".into(),
        }),
        version: "0.1.0".into(),
        mode: ipq_common::config::Mode::Enforce,
        on_early_reuse: EarlyReusePolicy::FenceOld,
        registry: RegistryCounts {
            entries: 3,
            capacity: 65536,
            active: 2,
            draining: 1,
            quarantined: 0,
        },
        interfaces: vec![
            InterfaceStatus {
                ifindex: 5,
                name: "vethpa".into(),
                hooks: vec![AttachedHook::TcIngress, AttachedHook::TcEgress],
                protection: Protection::Protected,
                attachment: Some(Attachment::Netlink),
                error: None,
                failed_attempts: 0,
                ahead: Vec::new(),
            },
            InterfaceStatus {
                ifindex: 12,
                name: "up0".into(),
                hooks: vec![AttachedHook::Xdp],
                protection: Protection::Protected,
                attachment: Some(Attachment::Xdp),
                error: None,
                failed_attempts: 0,
                ahead: Vec::new(),
            },
        ],
        conflicts_total: 4,
        refused_claims_total: 1,
        verification: None,
        unannounced: String::new(),
        recovery: Some(RecoveryView {
            from: RecoveredFrom::Journal,
            addresses: 3,
            problems: Vec::new(),
        }),
        started: None,
        started_at: "2026-11-22T09:56:00Z".into(),
        datapath_writes_pending: 0,
        pending_writes: Vec::new(),
        publish: None,
        whereabouts: None,
        cluster: None,
        observe_namespaces: Vec::new(),
        enforce_namespaces: Vec::new(),
        namespace_observed: 0,
    };
    assert_eq!(
        render::status(&status, now()),
        "\
Ready:           yes
Version:         0.1.0
Mode:            enforce
On early reuse:  fence-old
Started:         2026-11-22T09:56:00Z (5m ago)
Registry:        3/65536 entries: 2 active, 1 draining, 0 quarantined
Conflicts:       4 total, 1 claims refused
Interfaces:      2
TC attach:       netlink-then-tcx
Conntrack:       claims flushed by: IPv4 kernel; IPv6 dump (the kernel did not honour the filter)
Verified:        not yet
Datapath:        every write through
Recovered:       from the journal, 3 addresses
  IFINDEX  NAME    HOOKS                 ATTACHMENT  PROTECTION
  5        vethpa  tc-ingress,tc-egress  netlink     protected
  12       up0     xdp                   xdp         protected
"
    );
    let mut rebuilt = status.clone();
    rebuilt.recovery = Some(RecoveryView {
        from: RecoveredFrom::PinnedMaps,
        addresses: 3,
        problems: vec![
            "journal /s/registry.journal is corrupt (checksum mismatch); kept as /s/x".into(),
        ],
    });
    let text = render::status(&rebuilt, now());
    assert!(
        text.contains(
            "Recovered:       from the pinned maps, 3 addresses; journal /s/registry.journal is \
             corrupt (checksum mismatch); kept as /s/x\n"
        ),
        "{text}"
    );
    let mut verified = status.clone();
    verified.verification = Some(VerificationView {
        at: "2026-11-22T10:00:58Z".into(),
        took_us: 420,
        pins: 14,
        found: Vec::new(),
        last_found_at: None,
        last_found: Vec::new(),
    });
    let text = render::status(&verified, now());
    assert!(
        text.contains(
            "Verified:        2026-11-22T10:00:58Z (2s ago), 14 pins in place (0.4 ms)\n"
        ),
        "{text}"
    );
    verified.verification.as_mut().unwrap().found =
        vec!["if5 tcx-ingress link detached: repairing".into()];
    let text = render::status(&verified, now());
    assert!(
        text.contains("14 pins (0.4 ms); FOUND: if5 tcx-ingress link detached: repairing\n"),
        "{text}"
    );
    let mut failing = status.clone();
    failing.ready = false;
    failing.not_ready = Some("1 interface(s) unprotected: vethpa (if5) failed: boom".into());
    failing.unprotected = 1;
    failing.interfaces[0].hooks = vec![AttachedHook::TcxEgress];
    failing.interfaces[0].protection = Protection::Failed;
    failing.interfaces[0].error = Some("tcx-ingress: boom".into());
    failing.interfaces[0].failed_attempts = 3;
    let text = render::status(&failing, now());
    assert!(
        text.starts_with("Ready:           no: 1 interface(s) unprotected: vethpa (if5)"),
        "{text}"
    );
    assert!(
        text.contains("Interfaces:      2, 1 NOT PROTECTED\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "5        vethpa  tcx-egress  netlink     failed      tcx-ingress: boom (3 attempts)"
        ),
        "{text}"
    );
    // A co-tenant ahead that hands packets on: protected, and the line says what and why.
    let mut shared = status.clone();
    shared.interfaces[0].ahead = vec![
        "tc-ingress: bpf filter pref 1 handle 0x1 (program cni_next, id 42) (TC_ACT_UNSPEC) runs \
         before ipq's and hands packets on (run on 10.77.0.2)"
            .into(),
    ];
    let text = render::status(&shared, now());
    assert!(
        text.contains(
            "vethpa  tc-ingress,tc-egress  netlink     protected (co-tenant ahead hands on)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "  ahead of ipq on vethpa: tc-ingress: bpf filter pref 1 handle 0x1 (program \
             cni_next, id 42) (TC_ACT_UNSPEC) runs before ipq's and hands packets on (run on \
             10.77.0.2)\n"
        ),
        "{text}"
    );
    let mut unwritten = status.clone();
    unwritten.ready = false;
    unwritten.datapath_writes_pending = 1;
    unwritten.pending_writes = vec![PendingWriteView {
        address: "10.77.0.60".parse().unwrap(),
        op: MapWrite::Update,
        error: "the address map is full: 10.77.0.60 was not stored".into(),
        failures: 3,
        since: "2026-11-22T10:00:57Z".into(),
    }];
    let text = render::status(&unwritten, now());
    assert!(
        text.contains(
            "Datapath:        1 addresses NOT WRITTEN; 10.77.0.60: update refused 3 times since \
             2026-11-22T10:00:57Z (3s ago) (the address map is full: 10.77.0.60 was not \
             stored); retried every tick\n"
        ),
        "{text}"
    );
    let mut publishing = status.clone();
    publishing.publish = Some(PublishView {
        node: "node-a".into(),
        state: ipq_api::PublishState::Failing,
        last_published_at: Some("2026-11-22T10:00:58Z".into()),
        entries: 2,
        omitted: 0,
        orphaned: 0,
        orphans_withheld: None,
        writes_total: 7,
        failures_total: 3,
        last_error: Some("connecting to the API server: connection refused".into()),
        failing_since: Some("2026-11-22T10:00:59Z".into()),
    });
    let text = render::status(&publishing, now());
    assert!(
        text.contains(
            "NodeQuarantine:  node-a (failing), written 2026-11-22T10:00:58Z (2s ago), 2 \
             entries; 7 writes, 3 failed; FAILING since 2026-11-22T10:00:59Z (1s ago): \
             connecting to the API server: connection refused\n"
        ),
        "{text}"
    );
    let mut projecting = publishing.clone();
    projecting.whereabouts = Some(ipq_api::model::WhereaboutsView {
        namespace: "kube-system".into(),
        network_name: String::new(),
        reservations: 2,
        foreign: 1,
        writes_total: 9,
        recreated_total: 3,
        orphaned: 0,
        failures_total: 1,
        last_error: Some(
            "refused: creating OverlappingRangeIPReservation 10.0.0.5: forbidden".into(),
        ),
        failing_since: Some("2026-11-22T10:00:59Z".into()),
    });
    let text = render::status(&projecting, now());
    assert!(
        text.contains(
            "whereabouts:     reservations in kube-system: 2 of ipq's, 1 held by other pods; 9 \
             writes (3 made again after whereabouts deleted them), 1 failed; FAILING since \
             2026-11-22T10:00:59Z (1s ago): refused: creating OverlappingRangeIPReservation \
             10.0.0.5: forbidden\n"
        ),
        "{text}"
    );
    let mut orphaned = projecting.clone();
    if let Some(p) = orphaned.publish.as_mut() {
        p.state = ipq_api::PublishState::Published;
        p.orphaned = 1;
        p.orphans_withheld = Some(2);
        p.last_error = None;
    }
    if let Some(w) = orphaned.whereabouts.as_mut() {
        w.orphaned = 3;
    }
    let text = render::status(&orphaned, now());
    assert!(
        text.contains(
            "node-a (published), written 2026-11-22T10:00:58Z (2s ago), 2 entries (1 \
             orphaned); 2 ORPHANED LEFT OUT: the cluster's NodeQuarantine CRD lacks the state \
             (kubectl apply -f deploy/helm/ipq/crds/); 7 writes"
        ) && text.contains("; 3 live holders whose pod was deleted under them (orphaned)"),
        "{text}"
    );
    use ipq_api::model::{ClusterEntry, ClusterView, NodeQuarantineSummary};
    let mut clustered = projecting.clone();
    clustered.cluster = Some(ClusterView {
        read_at: Some("2026-11-22T10:00:30Z".into()),
        last_error: None,
        nodes: vec![NodeQuarantineSummary {
            node: "node-b".into(),
            quarantined: 4,
            fenced: 1,
            orphaned: 0,
            newest: vec![ClusterEntry {
                address: "10.0.3.7".into(),
                state: "fenced".into(),
                since: "2026-11-22T10:00:20Z".into(),
                pod: Some("default/web-1".into()),
            }],
        }],
        nodes_omitted: 2,
    });
    let text = render::status(&clustered, now());
    assert!(
        text.contains(
            "node-b: 4 quarantined, 1 fenced; newest: 10.0.3.7 fenced (default/web-1) since \
             2026-11-22T10:00:20Z; 2 more nodes (read 2026-11-22T10:00:30Z)"
        ),
        "{text}"
    );
    if let Some(cluster) = clustered.cluster.as_mut() {
        cluster.last_error = Some("refused: listing nodequarantines: forbidden".into());
    }
    let text = render::status(&clustered, now());
    assert!(
        text.contains("(last read FAILED: refused: listing nodequarantines: forbidden)"),
        "{text}"
    );
    let mut scoped = clustered.clone();
    scoped.observe_namespaces = vec!["audit".into(), "dev".into()];
    scoped.namespace_observed = 3;
    let text = render::status(&scoped, now());
    assert!(
        text.contains("observe audit, dev, enforce the rest; 3 addresses observed"),
        "{text}"
    );
    assert!(
        !render::status(&clustered, now()).contains("Namespaces:"),
        "no scope configured: no line"
    );
    let starting = Status {
        ready: false,
        interfaces: Vec::new(),
        ..status
    };
    let text = render::status(&starting, now());
    assert!(text.starts_with("Ready:           no\n"), "{text}");
    assert!(text.contains("Interfaces:      none attached\n"), "{text}");
}

fn conflict() -> ConflictView {
    ConflictView {
        kind: ConflictKind::EarlyReuse,
        address: "10.77.0.2".parse().unwrap(),
        old_holder: Some(pod_holder()),
        new_holder: Some(Holder::new(6, "vethpb")),
        policy: EarlyReusePolicy::FenceOld,
        outcome: ConflictOutcome::FencedOld,
        at: "2026-11-22T10:00:30Z".into(),
    }
}

#[test]
fn conflicts_show_both_holders_policy_and_outcome() {
    let remote = ConflictView {
        kind: ConflictKind::RemoteClaim,
        address: "fd77::2".parse().unwrap(),
        old_holder: Some(Holder::new(5, "vethpa")),
        new_holder: None,
        policy: EarlyReusePolicy::FenceOld,
        outcome: ConflictOutcome::Reported,
        at: "2026-11-22T10:00:59Z".into(),
    };
    assert_eq!(
        render::conflicts(&[conflict(), remote], now()),
        "\
AT       KIND          ADDRESS    OLD HOLDER            NEW HOLDER  POLICY     OUTCOME
30s ago  early_reuse   10.77.0.2  vethpa default/web-1  vethpb      fence-old  fenced_old
1s ago   remote_claim  fd77::2    vethpa                -           fence-old  reported
"
    );
}

#[test]
fn events_are_one_line_each() {
    let at = "2026-11-22T10:00:30.250Z".to_owned();
    let cases = [
        (
            EventBody::Transition {
                address: "10.77.0.2".parse().unwrap(),
                from: StateName::Active,
                to: StateName::Draining,
                holder: Some(pod_holder()),
            },
            "transition 10.77.0.2 active -> draining holder vethpa default/web-1",
        ),
        (
            EventBody::Transition {
                address: "10.77.0.2".parse().unwrap(),
                from: StateName::Quarantined,
                to: StateName::Free,
                holder: None,
            },
            "transition 10.77.0.2 quarantined -> free",
        ),
        (
            EventBody::Conflict(Box::new(conflict())),
            "conflict early_reuse 10.77.0.2 old vethpa default/web-1 new vethpb \
             policy fence-old outcome fenced_old",
        ),
        (
            EventBody::Sample {
                address: "fd77::2".parse().unwrap(),
                hook: EventHook::TcIngress,
                reason: SampleReason::Fenced,
                action: SampleAction::Dropped,
                state: EntryState::Draining,
                ifindex: 5,
                seen_on: "vethpa".into(),
                holder_ifindex: 6,
                holder: None,
                src_mac: "02:77:00:00:0a:02".into(),
                pkt_len: 98,
            },
            "sample fd77::2 dropped at tc_ingress reason fenced state draining on vethpa \
             holder ifindex 6 from 02:77:00:00:0a:02 98 bytes",
        ),
        (
            EventBody::Hygiene(Box::new(ipq_api::model::HygieneView {
                address: "10.77.0.2".parse().unwrap(),
                trigger: HygieneTrigger::HolderGone,
                at: String::new(),
                conntrack_entries: 4,
                conntrack_flush: Some(ConntrackFlush::Dump),
                neighbours: 1,
                announcements: 0,
                announce_skipped: None,
                skipped: None,
                permanent_neighbours: Vec::new(),
                errors: vec!["conntrack: ctnetlink: the kernel answered EPERM".into()],
            })),
            "hygiene 10.77.0.2 holder_gone: 4 conntrack entries, 1 neighbours, 0 announcements; \
             FAILED: conntrack: ctnetlink: the kernel answered EPERM",
        ),
        (
            EventBody::Hygiene(Box::new(ipq_api::model::HygieneView {
                address: "10.77.0.3".parse().unwrap(),
                trigger: HygieneTrigger::NewHolder,
                at: String::new(),
                conntrack_entries: 0,
                conntrack_flush: Some(ConntrackFlush::Kernel),
                neighbours: 0,
                announcements: 0,
                announce_skipped: Some("rate-limited (announce_per_second = 50)".into()),
                skipped: None,
                permanent_neighbours: Vec::new(),
                errors: Vec::new(),
            })),
            "hygiene 10.77.0.3 new_holder: 0 conntrack entries, 0 neighbours, 0 announcements \
             (announcement rate-limited (announce_per_second = 50))",
        ),
        (
            EventBody::AttachmentLost {
                interface: "vethpa".into(),
                ifindex: 5,
                hook: EventHook::TcEgress,
                what: LostPart::Filter,
                repaired: true,
                error: None,
            },
            "LOST vethpa tc_egress: another tool took ipq's program off (filter); attached again",
        ),
        (
            EventBody::MapRewritten {
                map: CheckedMap::IpqAddrs,
                key: "10.77.0.2".into(),
                found: "active holder 9".into(),
                wanted: "quarantined".into(),
                repaired: false,
                error: Some("EPERM".into()),
                found_by: Some(DriftFoundBy::Comparison),
            },
            "TAMPERED IPQ_ADDRS 10.77.0.2: held active holder 9, ipq wrote quarantined; NOT \
             WRITTEN BACK: EPERM (found by comparing the maps)",
        ),
        (
            EventBody::IpamExhausted {
                network: "pods".into(),
                container_id: "c1".into(),
                answer: ExhaustedAnswer {
                    policy: OnExhausted::ReleaseQuietest,
                    quarantined: 2,
                    draining: 0,
                    next_release: None,
                    released: vec!["10.77.0.9".parse().unwrap()],
                },
            },
            "ipam exhausted \"pods\" (ADD of c1): 2 quarantined, 0 draining held; \
             release-quietest -> released [10.77.0.9]",
        ),
        (EventBody::Lost { n: 3 }, "lost 3 events"),
    ];
    for (seq, (body, want)) in cases.into_iter().enumerate() {
        let event = Event {
            seq: seq as u64 + 40,
            at: at.clone(),
            body,
        };
        let line = render::event_line(&event);
        assert_eq!(line, format!("{at} #{} {want}", seq + 40));
        assert!(!line.contains('\n'));
    }
}

#[test]
fn get_says_when_an_address_is_observe_only() {
    let detail = AddressView {
        holder: Some(Holder::new(6, "vethpb")),
        conflicts: 1,
        observe_only: true,
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:00Z")
    };
    let text = render::address_detail(&detail, now());
    assert!(
        text.contains("Observe only:      yes: an early reuse was let through"),
        "{text}"
    );
    let plain = render::address_detail(
        &view("10.77.0.3", StateName::Active, "2026-11-22T10:00:00Z"),
        now(),
    );
    assert!(!plain.contains("Observe only"), "{plain}");
}

#[test]
fn get_and_status_say_when_a_namespace_is_only_observed() {
    let detail = AddressView {
        holder: Some(Holder::new(6, "vethpb")),
        namespace_observed: true,
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:00Z")
    };
    let text = render::address_detail(&detail, now());
    assert!(
        text.contains("observe: its pod's namespace is only observed"),
        "{text}"
    );
    let plain = render::address_detail(
        &view("10.77.0.3", StateName::Active, "2026-11-22T10:00:00Z"),
        now(),
    );
    assert!(!plain.contains("namespace is only observed"), "{plain}");
}

#[test]
fn get_says_why_a_new_holder_was_not_announced() {
    let detail = AddressView {
        last_flush: Some(ipq_api::model::HygieneView {
            address: "10.77.0.2".parse().unwrap(),
            trigger: HygieneTrigger::NewHolder,
            at: "2026-11-22T10:00:58Z".into(),
            conntrack_entries: 0,
            conntrack_flush: Some(ConntrackFlush::Kernel),
            neighbours: 0,
            announcements: 0,
            announce_skipped: Some("rate-limited (announce_per_second = 50)".into()),
            skipped: None,
            permanent_neighbours: Vec::new(),
            errors: Vec::new(),
        }),
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:00Z")
    };
    let text = render::address_detail(&detail, now());
    let line = "  Announcements:      0; rate-limited (announce_per_second = 50)";
    assert!(text.contains(line), "{line:?} in:\n{text}");
}

#[test]
fn get_shows_the_last_flush_and_what_failed() {
    let detail = AddressView {
        last_flush: Some(ipq_api::model::HygieneView {
            address: "10.77.0.2".parse().unwrap(),
            trigger: HygieneTrigger::NewHolder,
            at: "2026-11-22T10:00:58Z".into(),
            conntrack_entries: 3,
            conntrack_flush: Some(ConntrackFlush::Kernel),
            neighbours: 1,
            announcements: 2,
            announce_skipped: None,
            skipped: None,
            permanent_neighbours: vec!["if4 lladdr 02:00:00:00:00:09".into()],
            errors: vec!["announce: if7: No such device".into()],
        }),
        ..view("10.77.0.2", StateName::Active, "2026-11-22T10:00:00Z")
    };
    let text = render::address_detail(&detail, now());
    for line in [
        "Last flush:             2026-11-22T10:00:58Z (2s ago) (new_holder)",
        "  Conntrack entries:    3 (reported by the kernel's filtered flush: a lower bound)",
        "  Neighbour entries:    1",
        "  Announcements:        2",
        "  Permanent neighbour:  if4 lladdr 02:00:00:00:00:09 (left alone)",
        "  Failed:               announce: if7: No such device",
    ] {
        assert!(text.contains(line), "{line:?} in:\n{text}");
    }
}

#[test]
fn an_address_the_ipam_holds_says_for_whom_and_when_it_goes() {
    let hold = |release: HoldRelease, error: Option<&str>| IpamHoldView {
        network: "pods".into(),
        container_id: "c1".into(),
        ifname: "eth0".into(),
        release,
        error: error.map(Into::into),
    };
    let quarantined = AddressView {
        until: Some("2026-11-22T10:02:00Z".into()),
        ipam_hold: Some(hold(HoldRelease::AfterQuarantine, None)),
        ..view("10.77.0.2", StateName::Quarantined, "2026-11-22T10:00:59Z")
    };
    let detail = render::address_detail(&quarantined, now());
    assert!(
        detail.contains(
            "network pods, container c1 (eth0); released after the quarantine, \
             2026-11-22T10:02:00Z (in 1m)"
        ),
        "{detail}"
    );
    let failing = AddressView {
        ipam_hold: Some(hold(
            HoldRelease::Failing,
            Some("host-local: no such file (3 attempts)"),
        )),
        ..view("10.77.0.3", StateName::Free, "")
    };
    let detail = render::address_detail(&failing, now());
    assert!(
        detail.contains("released failing: host-local: no such file (3 attempts)"),
        "{detail}"
    );
    let list = render::addresses(&[quarantined, failing], now());
    assert!(
        list.lines().next().is_some_and(|h| h.ends_with("IPAM")),
        "{list}"
    );
    assert!(list.contains("held (failing)"), "{list}");
}
