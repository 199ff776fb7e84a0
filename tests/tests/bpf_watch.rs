//! The bpf() watcher: another process's link detach, program put ahead of ipq's, or write to
//! ipq's maps reaches the agent as it happens, and is undone long before the periodic
//! verification would find it. Each agent here verifies every 60 s (its first pass is at
//! start): only the watcher can repair within the tests' deadlines. Without it, each test
//! fails at its first deadline.
//!
//! Needs root, bpffs, the kernel's BTF and `target/debug/ipq-agent` on a kernel with TCX and
//! XDP links and BPF trampolines (Linux 6.6+; this host); `cargo xtask test` provides them.

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
    lab::{ifindex, poll, udp_burst, Agent, Lab, PEER_V4, POD_A_V4, WATCHER_DEFAULT},
    raw_bpf::{
        detach_through_pin, foreign_program_first, map_update_by_relative_path,
        map_update_in_forked_child, obj_get,
    },
};

/// Far below the 60 s between the agent's periodic passes, far above the watcher's few
/// milliseconds (a loaded test machine included).
const WATCHER_DEADLINE: Duration = Duration::from_secs(2);

/// How soon a write of ipq's maps by another process is undone, whatever way it reached the
/// map (the watcher's trampolines see it in the kernel).
const REPAIR_DEADLINE: Duration = Duration::from_millis(100);

/// `lab`'s agent, holding pod a's veth by TCX links and verifying every 60 s, pod a fenced and
/// its traffic to the peer dropped; its status says the watcher is attached.
fn fenced_and_watching(lab: &Lab) -> Agent<'_> {
    fenced_and_watching_in(lab, &[], "tcx", "60s")
}

/// [`fenced_and_watching`], the agent started through `wrapper`, attaching TC by `tc_attach`
/// (`auto` where the test does not need TCX: the kernel tier's older kernels have none),
/// verifying every `every`.
fn fenced_and_watching_in<'l>(
    lab: &'l Lab,
    wrapper: &[&str],
    tc_attach: &str,
    every: &str,
) -> Agent<'l> {
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        tc_attach,
        "--verify-interval",
        every,
    ];
    let agent = lab
        .start_agent_wrapped(wrapper, &args)
        .expect("starting ipq-agent");
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

/// What `open` returns once the pass its opening of one of ipq's pins asked for is over (the
/// watcher reports the open): a write made after it is the only thing left to find.
fn opened<T>(agent: &Agent, open: impl FnOnce() -> T) -> T {
    let before = agent.verified_at();
    let opened = open();
    poll("the pass the open asked for", WATCHER_DEADLINE, || {
        let now = agent.verified_at();
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

/// The watcher's mode, as the metric says: exactly one of them is 1.
fn watcher_mode(agent: &Agent) -> &'static str {
    agent.bpf_watcher_mode().unwrap_or_else(|e| panic!("{e:#}"))
}

/// A test of what only the trampolines see: fails, saying why, where they are not the watcher
/// (a kernel that refuses tracing programs, as some sandboxes' do, or lacks a hooked function).
fn assert_trampolines(agent: &Agent) {
    let mode = watcher_mode(agent);
    assert_eq!(
        mode,
        "trampolines",
        "this needs the watcher's trampolines (fentry on the kernel's bpf() path); the agent \
         says why they are not the watcher here:\n{}",
        agent
            .log()
            .lines()
            .filter(|line| line.contains("bpf() watcher"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

fn passes(agent: &Agent, cause: &str) -> f64 {
    ["compared", "not_compared"]
        .iter()
        .map(|maps| {
            agent
                .metric(
                    "ipq_datapath_verify_passes_total",
                    &[("cause", cause), ("maps", maps)],
                )
                .unwrap_or_else(|e| panic!("{e:#}"))
        })
        .sum()
}

/// Pod a's `IPQ_ADDRS` key and its entry unfenced: what the writes below put there.
fn pod_a_unfenced(map: &HashMap<MapData, AddrKey, AddrEntry>) -> (AddrKey, AddrEntry) {
    let pod_a = AddrKey::from(IpAddr::from(POD_A_V4));
    let mut entry = map.get(&pod_a, 0).expect("pod a's entry");
    assert_ne!(entry.fenced_ifindex, NO_IFINDEX, "fenced to begin with");
    entry.fenced_ifindex = NO_IFINDEX;
    (pod_a, entry)
}

fn bytes_of<T>(value: &T) -> &[u8] {
    // SAFETY: the plain-data map types of ipq_common (repr(C), no padding), read as bytes.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
}

/// Waits until pod a is fenced again in `IPQ_ADDRS` and one more entry was rewritten than
/// `before`, and says it took no longer than [`REPAIR_DEADLINE`] after `written`.
fn repaired_within_deadline(
    agent: &Agent,
    map: &HashMap<MapData, AddrKey, AddrEntry>,
    before: f64,
    written: std::time::Instant,
    how: &str,
) {
    let pod_a = AddrKey::from(IpAddr::from(POD_A_V4));
    poll(how, WATCHER_DEADLINE, || {
        let fenced = map
            .get(&pod_a, 0)
            .is_ok_and(|e| e.fenced_ifindex != NO_IFINDEX);
        Ok((fenced && rewritten(agent, names::MAP_ADDRS) == before + 1.0).then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let took = written.elapsed();
    // Stretched like every deadline of the tests where they run slower (the kernel tier's
    // emulated guests: IPQ_TEST_TIME_SCALE); 100 ms as it is on a node.
    let deadline = ipq_tests::time::scaled(REPAIR_DEADLINE);
    assert!(
        took <= deadline,
        "{how}: undone {took:?} after the write, over {deadline:?}\n{}",
        agent.log()
    );
}

/// As the DaemonSet runs it, in a PID namespace of its own (where it is pid 1), the agent's
/// own opens of its pins at each pass are not reported to it as another process's: the
/// passes stay at the periodic rate, none asked for by the watcher. (Left out by its host
/// tgid, every pass's opens asked for the next one 50 ms later: 12.6 passes a second.) And
/// another process's write is still undone within [`REPAIR_DEADLINE`].
#[test]
fn in_a_pid_namespace_of_its_own_the_agents_own_calls_are_not_reported() {
    let lab = Lab::new().expect("building the lab");
    // The lab starts every agent in PID and mount namespaces of its own, as the DaemonSet's
    // pod does (ipq_tests::lab::namespaces): no wrapper needed, and one is checked.
    let agent = fenced_and_watching_in(&lab, &[], "auto", "1s");
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid()))
        .expect("the agent's status");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("NSpid:") && l.split_whitespace().last() == Some("1")),
        "the agent is not pid 1 of a PID namespace of its own:\n{status}"
    );
    assert_ne!(watcher_mode(&agent), "none", "{}", agent.log());
    let (periodic, poked) = (passes(&agent, "periodic"), passes(&agent, "watcher"));
    // The scenario's length: passes enough at 1 s to see a rate, not a wait for an event.
    std::thread::sleep(Duration::from_secs(4));
    let (periodic, poked) = (
        passes(&agent, "periodic") - periodic,
        passes(&agent, "watcher") - poked,
    );
    assert!(
        (2.0..=6.0).contains(&periodic),
        "periodic passes over 4 s at 1 s: {periodic}\n{}",
        agent.log()
    );
    // Reported to itself, the agent's own opens would ask for a pass every 50 ms (80 in 4 s):
    // each pass's opens ask for the next, a loop that never stops. Other processes of a shared
    // test machine ask for some (the other tests' agents attach links to their own veths, and
    // the raw tracepoint, where it is the watcher, cannot tell whose interface that is): 9
    // were seen in a full `cargo xtask test`. A fifth of the loop's rate tells the two apart.
    assert!(
        poked <= 16.0,
        "passes the watcher asked for in 4 s with nobody writing ipq's maps: {poked}\n{}",
        agent.log()
    );

    let before = rewritten(&agent, names::MAP_ADDRS);
    let mut map = opened(&agent, || addrs(&lab));
    let (pod_a, entry) = pod_a_unfenced(&map);
    map.insert(pod_a, entry, 0).expect("writing IPQ_ADDRS");
    let written = std::time::Instant::now();
    repaired_within_deadline(&agent, &map, before, written, "IPQ_ADDRS written back");
}

/// A 32-bit `bpf()` (the compat entry, `int 0x80`, number 357) writing `IPQ_ADDRS` is seen
/// like a 64-bit one: the trampolines are on the kernel's path both take (the raw tracepoint
/// is not: where it is the watcher, this fails with the reason the agent gives).
#[cfg(target_arch = "x86_64")]
#[test]
fn a_compat_bpf_write_is_undone_at_once() {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching_in(&lab, &[], "auto", "60s");
    assert_trampolines(&agent);
    let before = rewritten(&agent, names::MAP_ADDRS);
    let map = opened(&agent, || addrs(&lab));
    let (pod_a, entry) = pod_a_unfenced(&map);
    let fd = opened(&agent, || map_fd(&lab));
    ipq_tests::raw_bpf::compat_map_update(
        fd.fd().as_fd().as_raw_fd(),
        bytes_of(&pod_a),
        bytes_of(&entry),
    )
    .expect("the compat BPF_MAP_UPDATE_ELEM");
    let written = std::time::Instant::now();
    repaired_within_deadline(&agent, &map, before, written, "the compat write undone");
}

/// A descriptor of `IPQ_ADDRS` of the test's own, opened by its pin.
fn map_fd(lab: &Lab) -> MapData {
    let path = map_path(lab, names::MAP_ADDRS);
    MapData::from_pin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A process that opens `IPQ_ADDRS`'s pin by a path relative to the maps directory (its
/// working directory) and writes it: the absolute path is in no call. Only the trampolines
/// see that (they know the map).
#[test]
fn a_write_through_a_pin_opened_by_a_relative_path_is_undone_at_once() {
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching_in(&lab, &[], "auto", "60s");
    assert_trampolines(&agent);
    let before = rewritten(&agent, names::MAP_ADDRS);
    let map = opened(&agent, || addrs(&lab));
    let (pod_a, entry) = pod_a_unfenced(&map);
    map_update_by_relative_path(
        &lab.bpffs.path().join("maps"),
        names::MAP_ADDRS,
        bytes_of(&pod_a),
        bytes_of(&entry),
    )
    .expect("the write through the relative path");
    let written = std::time::Instant::now();
    repaired_within_deadline(&agent, &map, before, written, "the write undone");
}

/// A child forked after its parent opened `IPQ_ADDRS` writes through the inherited
/// descriptor: another process than the one that opened it. Only the trampolines see that
/// (they know the map, not the process): where the raw tracepoint is the watcher, this fails
/// with the reason the agent gives.
#[test]
fn a_write_by_a_child_forked_after_the_open_is_undone_at_once() {
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let lab = Lab::new().expect("building the lab");
    let agent = fenced_and_watching_in(&lab, &[], "auto", "60s");
    assert_trampolines(&agent);
    let before = rewritten(&agent, names::MAP_ADDRS);
    let map = opened(&agent, || addrs(&lab));
    // Reported too: its pass is over before the child writes.
    let fd = opened(&agent, || map_fd(&lab));
    let (pod_a, entry) = pod_a_unfenced(&map);
    map_update_in_forked_child(
        fd.fd().as_fd().as_raw_fd(),
        bytes_of(&pod_a),
        bytes_of(&entry),
    )
    .expect("the child's write");
    let written = std::time::Instant::now();
    repaired_within_deadline(&agent, &map, before, written, "the child's write undone");
}

/// `bpf_watcher`: the raw tracepoint stays off every other system call of the node unless the
/// operator asks for it (`auto`): by default and with `trampolines` the agent takes the
/// trampolines where the kernel does, else no watcher; `off` none. Whatever `auto` gets on this
/// kernel, no other choice leaves a link on `sys_enter` in the agent's hands, and where no
/// watcher runs `ipq status` says the periodic verification is alone, and why.
#[test]
fn the_operator_can_keep_the_raw_tracepoint_off_every_system_call() {
    let lab = Lab::new().expect("lab");
    let mut agent = lab
        .start_agent(&["--bpf-watcher", "auto"])
        .expect("starting ipq-agent");
    let auto = watcher_mode(&agent);
    let kinds = agent.bpf_link_kinds().expect("the agent's links");
    assert_eq!(
        kinds.iter().any(|k| k == "raw_tracepoint"),
        auto == "raw_tracepoint",
        "auto: {auto}, links held: {kinds:?}"
    );
    agent.terminate().expect("stopping the agent");
    drop(agent);

    let only_trampolines = if auto == "trampolines" {
        "trampolines"
    } else {
        "none"
    };
    // (what the operator wrote, the key's value the agent then runs, what it attaches)
    for (written, choice, expected) in [
        ("nothing (the default)", "trampolines", only_trampolines),
        ("trampolines", "trampolines", only_trampolines),
        ("off", "off", "none"),
    ] {
        let agent = if written == "trampolines" || written == "off" {
            lab.start_agent(&["--bpf-watcher", written])
        } else {
            Agent::start_configured(&lab, WATCHER_DEFAULT, &[], &[])
        };
        let mut agent = agent.expect("starting ipq-agent");
        let mode = watcher_mode(&agent);
        assert_eq!(mode, expected, "bpf_watcher: {written} (auto: {auto})");
        let kinds = agent.bpf_link_kinds().expect("the agent's links");
        assert!(
            !kinds.iter().any(|k| k == "raw_tracepoint"),
            "bpf_watcher = {choice}: the agent holds a raw tracepoint link ({kinds:?})"
        );
        assert_eq!(
            kinds.iter().any(|k| k == "tracing"),
            mode == "trampolines",
            "bpf_watcher = {choice}: links held {kinds:?}"
        );
        assert_eq!(
            agent
                .metric("ipq_datapath_bpf_watcher", &[])
                .unwrap_or_else(|e| panic!("{e:#}")),
            f64::from(u8::from(mode != "none")),
        );
        let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
            .expect("status")
            .json()
            .expect("status json");
        let unannounced = status["unannounced"].as_str().unwrap_or_default();
        if mode == "none" {
            assert!(
                unannounced.starts_with("periodic verification only")
                    && unannounced.contains(&format!("bpf_watcher = {choice}")),
                "bpf_watcher = {choice}: {unannounced}"
            );
        }
        agent.terminate().expect("stopping the agent");
    }
}
