//! The bpf() watcher: another process's link detach, program put ahead of ipq's, or write to
//! ipq's maps reaches the agent as it happens, and is undone long before the periodic
//! verification would find it. Each agent here verifies every 60 s (its first pass is at
//! start): only the watcher can repair within the tests' deadlines. Without it, each test
//! fails at its first deadline.
//!
//! Needs root, bpffs, the `raw_syscalls:sys_enter` raw tracepoint the watcher attaches to (no
//! kprobes) and `target/debug/ipq-agent` on a kernel with TCX and XDP links (Linux 6.6+; this
//! host); `cargo xtask test` provides them.

use std::{net::IpAddr, time::Duration};

use aya::{
    maps::{Array, HashMap, MapData},
    programs::TcAttachType,
};
use ipq_api::{model::EventBody, CheckedMap, DriftFoundBy};
use ipq_common::{
    addr::{AddrEntry, AddrKey, NO_IFINDEX},
    names,
    slots::AddrSlot,
};
use ipq_tests::{
    api,
    attach::wait_tc_upgrades,
    attachments::{self, Attachment},
    lab::{ifindex, poll, udp_burst, Agent, Lab, PEER_V4, POD_A_V4},
    raw_bpf::{detach_through_pin, foreign_program_first, obj_get},
};

/// Far below the 60 s between the agent's periodic passes, far above the watcher's few
/// milliseconds (a loaded test machine included).
const WATCHER_DEADLINE: Duration = Duration::from_secs(2);

/// `lab`'s agent, holding pod a's veth by TCX links and verifying every 60 s, pod a fenced and
/// its traffic to the peer dropped; its status says the watcher is attached.
fn fenced_and_watching(lab: &Lab) -> Agent<'_> {
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "tcx",
        "--verify-interval",
        "60s",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    wait_tc_upgrades(&agent);
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, IpAddr::from(PEER_V4), 10),
        0,
        "fenced"
    );
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("status")
        .json()
        .expect("status json");
    let unannounced = status["unannounced"].as_str().unwrap_or_default();
    assert!(
        unannounced.starts_with("bpf() watcher"),
        "the watcher attached: {unannounced}\n{}",
        agent.log()
    );
    assert_eq!(
        agent
            .metric("ipq_datapath_bpf_watcher", &[])
            .unwrap_or_else(|e| panic!("{e:#}")),
        1.0
    );
    agent
}

fn lost(agent: &Agent, hook: &str) -> f64 {
    agent
        .metric(
            "ipq_datapath_attachments_lost_total",
            &[("hook", hook), ("what", "link")],
        )
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn ipq_tcx_first_on_ingress(lab: &Lab) -> bool {
    attachments::tc(&lab.node, "vethpa", TcAttachType::Ingress)
        .expect("vethpa ingress")
        .iter()
        .find(|a| matches!(a, Attachment::Tcx { .. }))
        .is_some_and(Attachment::is_ipq)
}

fn ipq_xdp_on_uplink(lab: &Lab) -> bool {
    attachments::xdp(&lab.node, "up0")
        .expect("up0 xdp")
        .is_some_and(|a| a.is_ipq())
}

/// Waits (at most [`WATCHER_DEADLINE`]) until `lost{hook}` reached `count` and `back` holds.
fn repaired(agent: &Agent, what: &str, hook: &str, count: f64, back: impl Fn() -> bool) {
    poll(what, WATCHER_DEADLINE, || {
        Ok((lost(agent, hook) == count && back()).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
}

#[test]
fn links_detached_by_another_process_are_repaired_at_once_and_again() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching(&lab);
    let links = lab.bpffs.path().join("links");
    let vethpa = ifindex(&lab.node, "vethpa").expect("ifindex");
    let up0 = ifindex(&lab.node, "up0").expect("ifindex");
    let tcx_pin = links.join(format!("if{vethpa}-tcx-ingress"));

    let before = lost(&agent, "tc_ingress");
    detach_through_pin(&tcx_pin);
    repaired(
        &agent,
        "the TCX link repaired",
        "tc_ingress",
        before + 1.0,
        || ipq_tcx_first_on_ingress(&lab),
    );
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, IpAddr::from(PEER_V4), 10),
        0,
        "fenced again"
    );
    // The same tool again, half a second after the repair (the scenario's own pause, not a
    // wait for anything): the repaired link is watched like the first.
    std::thread::sleep(Duration::from_millis(500));
    detach_through_pin(&tcx_pin);
    repaired(
        &agent,
        "the TCX link repaired a second time",
        "tc_ingress",
        before + 2.0,
        || ipq_tcx_first_on_ingress(&lab),
    );

    let before = lost(&agent, "xdp");
    detach_through_pin(&links.join(format!("if{up0}-xdp")));
    repaired(&agent, "the XDP link repaired", "xdp", before + 1.0, || {
        ipq_xdp_on_uplink(&lab)
    });
    let _ = POD_A_V4;
}

#[test]
fn a_program_put_ahead_by_another_process_is_moved_behind_at_once() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching(&lab);
    let vethpa = ifindex(&lab.node, "vethpa").expect("ifindex");
    let before = lost(&agent, "tc_ingress");
    let (prog, link) = lab.node.run(|| foreign_program_first(vethpa));
    repaired(
        &agent,
        "ipq's TCX program first again",
        "tc_ingress",
        before + 1.0,
        || ipq_tcx_first_on_ingress(&lab),
    );
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, IpAddr::from(PEER_V4), 10),
        0,
        "fenced again"
    );
    // SAFETY: the descriptors foreign_program_first returned, closed once.
    unsafe {
        libc::close(link);
        libc::close(prog);
    }
}

fn map_path(lab: &Lab, name: &str) -> std::path::PathBuf {
    lab.bpffs.path().join("maps").join(name)
}

fn addrs(lab: &Lab) -> HashMap<MapData, AddrKey, AddrEntry> {
    HashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_pin(map_path(lab, names::MAP_ADDRS)).expect("opening IPQ_ADDRS"),
    ))
    .expect("IPQ_ADDRS as a hash map")
}

fn rewritten(agent: &Agent, map: &str) -> f64 {
    agent
        .metric("ipq_datapath_map_entries_rewritten_total", &[("map", map)])
        .unwrap_or(0.0)
}

/// When the last verification pass finished, as `/v1/status` says.
fn verified_at(agent: &Agent) -> serde_json::Value {
    api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .and_then(|r| r.json())
        .map(|status| status["verification"]["at"].clone())
        .unwrap_or_default()
}

/// What `open` returns once the pass its opening of one of ipq's pins asked for is over (the
/// watcher reports the open): a write made after it is the only thing left to find.
fn opened<T>(agent: &Agent, open: impl FnOnce() -> T) -> T {
    let before = verified_at(agent);
    let opened = open();
    poll("the pass the open asked for", WATCHER_DEADLINE, || {
        let now = verified_at(agent);
        Ok((!now.is_null() && now != before).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    opened
}

/// What found each `map_rewritten` event of `map` so far.
fn rewrites(agent: &Agent, map: CheckedMap) -> Vec<Option<DriftFoundBy>> {
    api::events(&agent.api_socket())
        .expect("GET /v1/events")
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::MapRewritten {
                map: rewritten,
                found_by,
                ..
            } if rewritten == map => Some(found_by),
            _ => None,
        })
        .collect()
}

/// A write of one entry is looked at by the key the watcher reported, at once, before the
/// comparison of the whole maps (50 ms later) would find it: what repaired it says so.
fn repaired_by_its_key(agent: &Agent, map: CheckedMap) {
    let found_by = rewrites(agent, map);
    let last = found_by
        .last()
        .unwrap_or_else(|| panic!("no map_rewritten event of {map}:\n{}", agent.log()));
    assert_eq!(
        *last,
        Some(DriftFoundBy::ReportedWrite),
        "{map} repaired by the write's reported key, not by the comparison: {found_by:?}"
    );
}

#[test]
fn map_writes_by_another_process_are_undone_at_once() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching(&lab);
    let pod_a = AddrKey::from(IpAddr::from(POD_A_V4));

    // IPQ_ADDRS: pod a's entry unfenced (the pin opened, one write: what bpftool does).
    let before = rewritten(&agent, names::MAP_ADDRS);
    let mut map = opened(&agent, || addrs(&lab));
    let mut entry = map.get(&pod_a, 0).expect("pod a's entry");
    assert_ne!(entry.fenced_ifindex, NO_IFINDEX, "fenced to begin with");
    entry.fenced_ifindex = NO_IFINDEX;
    map.insert(pod_a, entry, 0).expect("writing IPQ_ADDRS");
    poll("IPQ_ADDRS written back", WATCHER_DEADLINE, || {
        let fenced = map
            .get(&pod_a, 0)
            .is_ok_and(|e| e.fenced_ifindex != NO_IFINDEX);
        Ok((fenced && rewritten(&agent, names::MAP_ADDRS) == before + 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    repaired_by_its_key(&agent, CheckedMap::IpqAddrs);

    // IPQ_SLOTS, the copy the programs read first: the slot of pod a unfenced.
    let before = rewritten(&agent, names::MAP_SLOTS);
    let mut table: Array<MapData, AddrSlot> = opened(&agent, || {
        Array::try_from(aya::maps::Map::Array(
            MapData::from_pin(map_path(&lab, names::MAP_SLOTS)).expect("opening IPQ_SLOTS"),
        ))
        .expect("IPQ_SLOTS as an array")
    });
    let slot_of_a = (0..table.len())
        .find(|i| {
            table
                .get(i, 0)
                .is_ok_and(|s| s.entry.state != 0 && s.key == pod_a)
        })
        .expect("pod a in a slot");
    let mut slot = table.get(&slot_of_a, 0).expect("reading the slot");
    slot.entry.fenced_ifindex = NO_IFINDEX;
    table.set(slot_of_a, slot, 0).expect("writing IPQ_SLOTS");
    poll("IPQ_SLOTS written back", WATCHER_DEADLINE, || {
        let fenced = table
            .get(&slot_of_a, 0)
            .is_ok_and(|s| s.key == pod_a && s.entry.fenced_ifindex != NO_IFINDEX);
        Ok((fenced && rewritten(&agent, names::MAP_SLOTS) == before + 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    repaired_by_its_key(&agent, CheckedMap::IpqSlots);
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, IpAddr::from(PEER_V4), 10),
        0,
        "fenced again"
    );
}

/// Calls the watcher's ring (64 KiB: under 500 records) cannot hold while its reader is
/// stopped: `BPF_OBJ_GET`s of a path that does not exist, each reported and each failing.
const RING_FLOOD: usize = 5000;

#[test]
fn calls_lost_to_a_full_ring_are_answered_by_verifying_everything() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching(&lab);
    let pod_a = AddrKey::from(IpAddr::from(POD_A_V4));
    let before = rewritten(&agent, names::MAP_ADDRS);
    assert_eq!(
        agent
            .metric("ipq_datapath_bpf_watcher_lost_calls_total", &[])
            .unwrap_or_else(|e| panic!("{e:#}")),
        0.0,
        "nothing lost yet"
    );

    // The agent stopped, its ring is filled past its size; what comes after is lost: the open
    // of IPQ_ADDRS's pin and the write that unfences pod a. Only the count of lost calls can
    // tell the agent to look before its periodic pass, 60 s away. (A SIGKILL at the end of the
    // test ends a stopped agent too.)
    let pid = agent.pid() as i32;
    // SAFETY: signals the test's own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "SIGSTOP");
    let missing = lab.bpffs.path().join("no-such-pin");
    for _ in 0..RING_FLOOD {
        let e = obj_get(&missing).expect_err("no such pin");
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }
    // Read through this descriptor from now on: opening the pin again would be a call the
    // watcher reports, and would make the agent look for that reason.
    let mut map = addrs(&lab);
    let mut entry = map.get(&pod_a, 0).expect("pod a's entry");
    assert_ne!(entry.fenced_ifindex, NO_IFINDEX, "fenced to begin with");
    entry.fenced_ifindex = NO_IFINDEX;
    map.insert(pod_a, entry, 0).expect("writing IPQ_ADDRS");
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0, "SIGCONT");

    poll(
        "IPQ_ADDRS written back after the lost calls",
        WATCHER_DEADLINE,
        || {
            let fenced = map
                .get(&pod_a, 0)
                .is_ok_and(|e| e.fenced_ifindex != NO_IFINDEX);
            Ok((fenced && rewritten(&agent, names::MAP_ADDRS) == before + 1.0).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let lost = agent
        .metric("ipq_datapath_bpf_watcher_lost_calls_total", &[])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        lost > 0.0 && lost <= RING_FLOOD as f64 + 2.0,
        "the lost calls counted: {lost}"
    );
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("status")
        .json()
        .expect("status json");
    let unannounced = status["unannounced"].as_str().unwrap_or_default();
    assert!(
        unannounced.contains(&format!("{lost} calls lost to its full ring")),
        "status says calls were lost: {unannounced}"
    );
    assert!(
        agent.log().contains("calls lost to a full ring"),
        "logged:\n{}",
        agent.log()
    );
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, IpAddr::from(PEER_V4), 10),
        0,
        "fenced again"
    );
}
