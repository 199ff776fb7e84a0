//! The tracker without root: an in-memory datapath, a journal in a temporary directory and
//! metrics with no kernel counters behind them.

use std::{net::IpAddr, path::Path};

use ipq_common::addr::{AddrKey, FLAG_OBSERVE_ONLY};
use tokio::sync::oneshot;

use super::{Durable, Observed, Tracker};
use crate::{
    api::{
        command::Command,
        model::{ClaimRequest, ClaimSource, ErrorCode, HolderSpec},
        views::ApiError,
    },
    config::{Config, EarlyReusePolicy},
    datapath::{
        attach::{Attacher, TcMode, WorkerPool},
        MemDatapath, MemTable,
    },
    journal::{Journal, JOURNAL_FILE},
    metrics::Metrics,
    netlink::NetEvent,
    registry::{FakeClock, StateName},
};

const VETH_A: u32 = 11;
const VETH_B: u32 = 12;

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn config(policy: EarlyReusePolicy) -> Config {
    let mut config = Config {
        on_early_reuse: policy,
        ..Config::default()
    };
    config.interfaces.workload = crate::config::Globs::parse(&["veth*", "lo"]).unwrap();
    config
}

/// A tracker over `table`, with `state_dir` its configuration's (ipq-ipam's files); no journal:
/// the agent's loop owns that beside it ([`durable`]).
pub(super) fn tracker_with(mut config: Config, state_dir: &Path, table: MemTable) -> Tracker {
    config.state_dir = state_dir.to_owned();
    let datapath = MemDatapath { table };
    // No workers: the attach jobs the tracker queues wait in the attacher's own queue, never
    // run.
    let (workers, _jobs) = WorkerPool::without_workers(TcMode::Tcx);
    let attacher = Attacher::new(workers);
    let watcher = Err("not started in tests".to_owned());
    Tracker::new(config, datapath, attacher, watcher, Metrics::for_tests())
}

/// The journal in `state_dir`, counted in `t`'s metrics, its retry timer reading
/// `journal_clock`.
pub(super) fn durable_clocked(state_dir: &Path, t: &Tracker, journal_clock: FakeClock) -> Durable {
    let journal = Journal::open(state_dir)
        .expect("journal")
        .with_clock(journal_clock);
    Durable::new(journal, t.metrics.clone())
}

/// The journal in `state_dir`, as the agent's loop keeps it beside `t`.
pub(super) fn durable(state_dir: &Path, t: &Tracker) -> Durable {
    durable_clocked(state_dir, t, FakeClock::new(0))
}

pub(super) fn tracker(policy: EarlyReusePolicy, state_dir: &Path) -> Tracker {
    tracker_with(config(policy), state_dir, MemTable::default())
}

/// [`tracker`], its journal, and the clock its journal's retry timer reads.
pub(super) fn tracker_with_journal_clock(
    policy: EarlyReusePolicy,
    state_dir: &Path,
) -> (Tracker, Durable, FakeClock) {
    let clock = FakeClock::new(0);
    let t = tracker(policy, state_dir);
    let durable = durable_clocked(state_dir, &t, clock.clone());
    (t, durable, clock)
}

fn link(t: &mut Tracker, ifindex: u32, name: &str) {
    t.on_input(Observed::Net(vec![NetEvent::Link {
        ifindex,
        name: name.into(),
    }]));
}

fn route(t: &mut Tracker, addr: &str, ifindex: u32) {
    t.on_input(Observed::Net(vec![NetEvent::HostRoute {
        addr: ip(addr),
        ifindex,
    }]));
}

fn flags(t: &Tracker, addr: &str) -> u32 {
    t.sinks
        .enforcer
        .port()
        .table()
        .get(&AddrKey::from(ip(addr)))
        .map(|e| e.flags)
        .expect("a datapath entry")
}

/// The table as a restarted agent finds it in the pins.
fn pinned(t: &Tracker) -> MemTable {
    MemTable {
        capacity: None,
        entries: t
            .sinks
            .enforcer
            .port()
            .table()
            .entries()
            .unwrap()
            .into_iter()
            .collect(),
    }
}

fn conflicts(t: &Tracker, kind: &str) -> u64 {
    t.metrics.conflicts.with_label_values(&[kind]).get()
}

/// An observed early reuse of 10.0.0.5 (v4) and fd00::5 (v6): pod a, then pod b.
fn observed_reuse(t: &mut Tracker) {
    link(t, VETH_A, "vetha");
    link(t, VETH_B, "vethb");
    for addr in ["10.0.0.5", "fd00::5"] {
        route(t, addr, VETH_A);
        route(t, addr, VETH_B);
    }
}

#[test]
fn observe_only_survives_a_restart_and_a_lost_journal() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::Observe, dir.path());
    observed_reuse(&mut t);
    for addr in ["10.0.0.5", "fd00::5"] {
        assert_eq!(
            flags(&t, addr) & FLAG_OBSERVE_ONLY,
            FLAG_OBSERVE_ONLY,
            "{addr}"
        );
        assert!(
            t.core
                .registry
                .records()
                .get(ip(addr))
                .unwrap()
                .observe_only
        );
    }
    durable(dir.path(), &t).persist(t.journaled()).unwrap();
    let table = pinned(&t);

    // A restart: the journal and the pins.
    let mut restarted = tracker_with(config(EarlyReusePolicy::Observe), dir.path(), table);
    recover(&mut restarted, dir.path());
    restarted.reconcile(restarted.core.net.clone());
    for addr in ["10.0.0.5", "fd00::5"] {
        assert_eq!(
            flags(&restarted, addr) & FLAG_OBSERVE_ONLY,
            FLAG_OBSERVE_ONLY
        );
    }
    let table = pinned(&restarted);

    // The journal lost: the pins alone say observe.
    std::fs::remove_file(dir.path().join(JOURNAL_FILE)).unwrap();
    let mut rebuilt = tracker_with(config(EarlyReusePolicy::Observe), dir.path(), table);
    assert_eq!(
        recover(&mut rebuilt, dir.path()),
        super::Recovery::PinnedMaps
    );
    rebuilt.reconcile(rebuilt.core.net.clone());
    for addr in ["10.0.0.5", "fd00::5"] {
        assert!(
            rebuilt
                .core
                .registry
                .records()
                .get(ip(addr))
                .unwrap()
                .observe_only,
            "{addr}"
        );
        assert_eq!(flags(&rebuilt, addr) & FLAG_OBSERVE_ONLY, FLAG_OBSERVE_ONLY);
    }
}

#[test]
fn a_journal_without_the_flag_takes_it_from_the_pins() {
    // An upgrade: the journal an older agent wrote has no observe_only, its map entry has.
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::Observe, dir.path());
    observed_reuse(&mut t);
    let mut snapshot = t.core.registry.lifecycle().snapshot();
    for record in &mut snapshot.records {
        record.observe_only = false;
    }
    Journal::open(dir.path())
        .unwrap()
        .commit(&mut OlderJournal(snapshot.records))
        .unwrap();
    let mut upgraded = tracker_with(config(EarlyReusePolicy::Observe), dir.path(), pinned(&t));
    assert_eq!(recover(&mut upgraded, dir.path()), super::Recovery::Journal);
    assert!(
        upgraded
            .core
            .registry
            .records()
            .get(ip("10.0.0.5"))
            .unwrap()
            .observe_only
    );
    assert_eq!(
        flags(&upgraded, "10.0.0.5") & FLAG_OBSERVE_ONLY,
        FLAG_OBSERVE_ONLY
    );
}

#[test]
fn every_change_to_a_record_needs_a_save() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    link(&mut t, VETH_A, "vetha");
    route(&mut t, "10.0.0.7", VETH_A);
    let mut journal = durable(dir.path(), &t);
    journal.persist(t.journaled()).unwrap();
    assert!(journal.is_saved(t.core.registry.changes().generation()));
    // A duplicate source changes no state and no map entry, only the conflict count.
    let before = t.core.registry.changes().generation();
    let result = t
        .core
        .registry
        .lifecycle_mut()
        .duplicate_source(ip("10.0.0.7"), VETH_B);
    t.sinks.apply(&mut t.core, result.unwrap());
    assert!(t.core.registry.changes().generation() > before);
    assert!(
        !journal.is_saved(t.core.registry.changes().generation()),
        "a conflict count is a change to save"
    );
    journal.persist(t.journaled()).unwrap();
    assert!(journal.is_saved(t.core.registry.changes().generation()));
}

/// Recovery as the agent runs it, with the journal of `state_dir` loaded first.
fn recover(t: &mut Tracker, state_dir: &Path) -> super::Recovery {
    let mut journal = durable(state_dir, t);
    let loaded = journal.journal_mut().load();
    t.recover(loaded, journal.journal_mut())
}

/// A claim through the API for `lo` (the one interface a test's namespace surely has), as
/// answered once saved (these trackers start no flush a claim would wait for).
pub(super) fn claim(
    t: &mut Tracker,
    addr: &str,
) -> Result<crate::api::model::ClaimResponse, ApiError> {
    claim_saved_by(t, None, addr)
}

/// [`claim`], saved by `journal` (none: a save that succeeds).
pub(super) fn claim_saved_by(
    t: &mut Tracker,
    journal: Option<&mut Durable>,
    addr: &str,
) -> Result<crate::api::model::ClaimResponse, ApiError> {
    let (reply, mut answer) = oneshot::channel();
    let request = ClaimRequest {
        addresses: vec![ip(addr)],
        holder: HolderSpec {
            interface: "lo".into(),
            container_id: Some("c0ffee".into()),
            ..HolderSpec::default()
        },
        source: ClaimSource::Api,
    };
    let answer_fn = t.handle(Command::Claim { request, reply });
    let saved = match journal {
        Some(journal) => journal.persist(t.journaled()).map_err(|e| e.to_string()),
        None => Ok(()),
    };
    answer_fn(saved.as_ref().map(|_| ()).map_err(String::as_str));
    futures::FutureExt::now_or_never(answer.try_recv().expect("answered"))
        .expect("answered without waiting for a flush")
}

#[test]
fn addresses_of_the_node_are_never_a_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    link(&mut t, VETH_A, "vetha");
    link(&mut t, VETH_B, "vethb");
    // An older agent took ptp's IPv6 gateway on veth a for a pod's address.
    route(&mut t, "fd92::1", VETH_A);
    assert_eq!(
        t.core.registry.records().state(ip("fd92::1")),
        StateName::Active
    );
    for ifindex in [VETH_A, VETH_B] {
        t.on_input(Observed::Net(vec![NetEvent::NodeAddress {
            addr: ip("fd92::1"),
            ifindex,
        }]));
    }
    assert_eq!(
        t.core.registry.records().state(ip("fd92::1")),
        StateName::Free
    );
    route(&mut t, "fd92::1", VETH_B);
    assert_eq!(
        t.core.registry.records().state(ip("fd92::1")),
        StateName::Free
    );
    // Nor through the API.
    let error = claim(&mut t, "fd92::1").unwrap_err();
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    assert!(error.0.message.contains("fd92::1"), "{}", error.0.message);

    // A dual-stack pod's addresses, reused by another pod: exactly two conflicts.
    for addr in ["10.92.0.2", "fd92::2"] {
        route(&mut t, addr, VETH_A);
    }
    for addr in ["10.92.0.2", "fd92::2"] {
        route(&mut t, addr, VETH_B);
    }
    assert_eq!(conflicts(&t, "early_reuse"), 2);
}

#[test]
fn a_claim_refused_for_a_full_registry_is_made_when_space_frees() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(EarlyReusePolicy::FenceOld);
    config.capacity = 1;
    let mut t = tracker_with(config, dir.path(), MemTable::default());
    link(&mut t, VETH_A, "vetha");
    link(&mut t, VETH_B, "vethb");
    route(&mut t, "10.0.0.1", VETH_A);
    route(&mut t, "10.0.0.2", VETH_B);
    assert_eq!(
        t.core.registry.records().state(ip("10.0.0.2")),
        StateName::Free
    );
    assert_eq!(t.metrics.addresses_unprotected.get(), 1);

    // 10.0.0.1 goes Free: the waiting claim takes the room.
    let (reply, _answer) = oneshot::channel();
    let answer = t.handle(Command::Release {
        addr: ip("10.0.0.1"),
        force: true,
        reply,
    });
    answer(Ok(()));
    assert_eq!(
        t.core.registry.records().state(ip("10.0.0.2")),
        StateName::Active
    );
    assert_eq!(t.metrics.addresses_unprotected.get(), 0);

    // A waiting claim whose route went away is not made.
    route(&mut t, "10.0.0.3", VETH_A);
    assert_eq!(t.metrics.addresses_unprotected.get(), 1);
    t.on_input(Observed::Net(vec![NetEvent::HostRouteGone {
        addr: ip("10.0.0.3"),
        ifindex: VETH_A,
    }]));
    assert_eq!(t.metrics.addresses_unprotected.get(), 0);
}

#[test]
fn bridge_and_link_events_never_scan_the_nodes_neighbours_or_routes() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    const BRIDGE: u32 = 2;
    link(&mut t, BRIDGE, "br0");
    link(&mut t, VETH_A, "vetha");
    link(&mut t, VETH_B, "vethb");
    // Many pods behind the bridge, resolved but not (yet) learned behind a port.
    for n in 0..2000u32 {
        let [_, _, hi, lo] = n.to_be_bytes();
        t.on_input(Observed::Net(vec![NetEvent::Neighbour {
            addr: IpAddr::from([10, 88, hi, lo]),
            ifindex: BRIDGE,
            mac: Some([2, 0x42, 0, 0, hi, lo]),
        }]));
        t.on_input(Observed::Net(vec![NetEvent::HostRoute {
            addr: IpAddr::from([10, 99, hi, lo]),
            ifindex: VETH_B,
        }]));
    }
    let scans = crate::netlink::full_scans();
    // The bridge learns one pod's MAC behind veth a: that pod is claimed for it.
    t.on_input(Observed::Net(vec![NetEvent::Fdb {
        mac: [2, 0x42, 0, 0, 0, 7],
        port: VETH_A,
    }]));
    assert_eq!(
        t.core.registry.records().state(ip("10.88.0.7")),
        StateName::Active
    );
    assert_eq!(
        t.core.registry.records().state(ip("10.88.0.8")),
        StateName::Free
    );
    // Veth a goes away with its entries, leaving veth b's 2000 routes alone.
    t.on_input(Observed::Net(vec![NetEvent::LinkGone { ifindex: VETH_A }]));
    assert_eq!(
        t.core.registry.records().state(ip("10.88.0.7")),
        StateName::Quarantined
    );
    assert_eq!(
        crate::netlink::full_scans(),
        scans,
        "an FDB or link event scanned every neighbour or route"
    );
}

#[test]
fn protection_gauges_follow_links_but_routes_and_requests_never_walk_the_interfaces() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    let unprotected = |t: &Tracker, hook: &str| {
        t.metrics
            .unprotected_interfaces
            .with_label_values(&[hook])
            .get()
    };
    for n in 0..200 {
        link(&mut t, 100 + n, &format!("veth{n}"));
    }
    // No attach worker runs: every veth still waits for its TC ingress and egress programs.
    // The first claim for `lo` attaches it (a new interface to protect).
    claim(&mut t, "10.8.0.1").expect("claimed");
    assert_eq!(unprotected(&t, "tc_ingress"), 201);
    let observed = t.protection.observed.get();
    // A link event that changes nothing ipq wants (carrier, operstate) is not a change.
    link(&mut t, 100, "veth0");
    for n in 0..200u32 {
        let [_, _, hi, lo] = n.to_be_bytes();
        t.on_input(Observed::Net(vec![NetEvent::HostRoute {
            addr: IpAddr::from([10, 7, hi, lo]),
            ifindex: 100 + n,
        }]));
    }
    claim(&mut t, "10.8.0.2").expect("claimed");
    assert_eq!(
        t.protection.observed.get(),
        observed,
        "a route event or a request walked every interface"
    );
    t.on_input(Observed::Net(vec![NetEvent::LinkGone { ifindex: 100 }]));
    assert_eq!(unprotected(&t, "tc_ingress"), 200);
    t.on_input(Observed::Tick);
    assert_eq!(t.protection.observed.get(), observed + 2);
    // A resync that brings 300 new links walks the interfaces once, not once per link.
    let mut dump = crate::netlink::NetState::default();
    for n in 0..300 {
        dump.apply(&NetEvent::Link {
            ifindex: 1000 + n,
            name: format!("vethr{n}"),
        });
    }
    t.reconcile(dump);
    assert_eq!(t.protection.observed.get(), observed + 3);
    assert_eq!(unprotected(&t, "tc_ingress"), 300);
}

/// Records as an older agent journaled them, written through the journal's own commit.
struct OlderJournal(Vec<crate::registry::AddrRecord>);

impl crate::journal::Contents<crate::registry::AddrRecord> for OlderJournal {
    fn take_changed(&mut self) -> Vec<IpAddr> {
        self.0.iter().map(|r| r.addr).collect()
    }
    fn get(&self, key: &IpAddr) -> Option<&crate::registry::AddrRecord> {
        self.0.iter().find(|r| r.addr == *key)
    }
    fn all(&self) -> Vec<crate::registry::AddrRecord> {
        self.0.clone()
    }
}

/// `ipq status` says what finds another tool's changes as it is now: a watcher whose ring
/// reader stopped after start is reported as stopped, not as attached.
#[test]
fn a_bpf_watcher_that_stopped_is_reported_as_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut t = tracker(EarlyReusePolicy::FenceOld, dir.path());
    let pokes = std::sync::Arc::new(crate::datapath::bpf_watch::Pokes::new(
        ipq_common::watch::WatchMode::Trampolines,
        None,
    ));
    t.protection.bpf_watcher = Ok(pokes.clone());
    let attached = t.api().status().unannounced;
    assert!(attached.starts_with("bpf() watcher"), "{attached}");
    pokes.stop("polling the bpf() watcher's ring buffer: EBADF".to_owned());
    let stopped = t.api().status().unannounced;
    assert!(
        stopped.starts_with("periodic verification only")
            && stopped.contains("STOPPED: polling the bpf() watcher's ring buffer: EBADF"),
        "{stopped}"
    );
}
