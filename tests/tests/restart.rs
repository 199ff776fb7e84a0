//! An agent restart leaves no gap: while no agent runs (after SIGKILL, or after a clean
//! SIGTERM) the pinned programs keep dropping a fenced pod's traffic, and the next agent
//! re-opens the same pins (same link and map ids, one program per hook) instead of attaching a
//! second time.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{collections::BTreeMap, fs, net::IpAddr, path::Path};

use aya::{
    maps::MapData,
    programs::{
        links::{FdLink, PinnedLink},
        SchedClassifier, TcAttachType,
    },
};
use ipq_tests::{
    attach::wait_tc_upgrades,
    lab::{udp_burst, Lab, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6, POD_B_V4, POD_B_V6},
};

const N: usize = 10;

/// Kernel object id of every pin in `dir`, by file name.
fn pinned_ids(
    dir: &Path,
    id_of: impl Fn(&Path) -> anyhow::Result<u32>,
) -> anyhow::Result<BTreeMap<String, u32>> {
    let mut ids = BTreeMap::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        ids.insert(name, id_of(&path)?);
    }
    Ok(ids)
}

fn link_id(path: &Path) -> anyhow::Result<u32> {
    let link: FdLink = PinnedLink::from_pin(path)?.into();
    Ok(link.info()?.id())
}

fn map_id(path: &Path) -> anyhow::Result<u32> {
    Ok(MapData::from_pin(path)?.info()?.id())
}

/// Pod a gets nothing through either way in either family; pod b gets everything. Returns
/// how many datagrams pod a sent and how many were sent to it.
fn check_fenced(lab: &Lab, when: &str) -> (usize, usize) {
    let (mut from_a, mut to_a) = (0, 0);
    let families: [(IpAddr, IpAddr, IpAddr); 2] = [
        (POD_A_V4.into(), POD_B_V4.into(), PEER_V4.into()),
        (POD_A_V6.into(), POD_B_V6.into(), PEER_V6.into()),
    ];
    for (a, b, peer) in families {
        let got = udp_burst(&lab.pod_a, &lab.peer, peer, N);
        assert_eq!(got, 0, "{when}: pod a -> {peer} delivered {got} of {N}");
        from_a += N;
        let got = udp_burst(&lab.peer, &lab.pod_a, a, N);
        assert_eq!(got, 0, "{when}: peer -> {a} delivered {got} of {N}");
        to_a += N;
        let got = udp_burst(&lab.pod_b, &lab.peer, peer, N);
        assert_eq!(got, N, "{when}: pod b -> {peer} delivered {got} of {N}");
        let got = udp_burst(&lab.peer, &lab.pod_b, b, N);
        assert_eq!(got, N, "{when}: peer -> {b} delivered {got} of {N}");
    }
    (from_a, to_a)
}

#[test]
fn agent_restarts_leave_no_gap_and_reuse_the_pins() {
    let lab = Lab::new().expect("building the lab");
    let args = ["--workload", "vethp*", "--uplink", "up0"];
    let mut first = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    check_fenced(&lab, "first agent");
    // The pods were protected by netlink filters first; their TCX links come right after.
    wait_tc_upgrades(&first);

    let links_dir = lab.bpffs.path().join("links");
    let maps_dir = lab.bpffs.path().join("maps");
    let links = pinned_ids(&links_dir, link_id).expect("reading link pins");
    let maps = pinned_ids(&maps_dir, map_id).expect("reading map pins");
    // vethpa and vethpb: TCX ingress + egress each; up0: XDP.
    assert_eq!(links.len(), 5, "link pins: {links:?}");
    assert!(!maps.is_empty(), "no map pins");

    let (in_before, eg_before) = first.fenced_drops();
    first.kill9();

    // The gap: no agent runs, the pinned programs alone enforce.
    let (gap_from_a, gap_to_a) = check_fenced(&lab, "no agent running");

    let mut second = lab.start_agent(&args).expect("restarting ipq-agent");
    // The per-CPU counters live in a pinned map: what the gap dropped is still counted.
    let (in_after, eg_after) = second.fenced_drops();
    assert_eq!(
        (in_after - in_before, eg_after - eg_before),
        (gap_from_a as f64, gap_to_a as f64),
        "fenced drops during the gap (tc_ingress, tc_egress)"
    );
    let (from_a, to_a) = check_fenced(&lab, "second agent");
    let (in_now, eg_now) = second.fenced_drops();
    assert_eq!(
        (in_now - in_after, eg_now - eg_after),
        (from_a as f64, to_a as f64),
        "fenced drops after the restart (tc_ingress, tc_egress)"
    );

    assert_eq!(
        pinned_ids(&links_dir, link_id).expect("reading link pins"),
        links,
        "the restarted agent must update the pinned links, not make new ones"
    );
    assert_eq!(
        pinned_ids(&maps_dir, map_id).expect("reading map pins"),
        maps,
        "the restarted agent must reuse the pinned maps"
    );

    // Exactly one program per TCX hook: the old one was replaced, not joined by a second.
    for ifname in ["vethpa", "vethpb"] {
        for attach in [TcAttachType::Ingress, TcAttachType::Egress] {
            let (_, progs) = lab
                .node
                .run(|| SchedClassifier::query_tcx(ifname, attach))
                .unwrap_or_else(|e| panic!("query_tcx {ifname} {attach:?}: {e}"));
            let names: Vec<String> = progs
                .iter()
                .map(|p| p.name_as_str().unwrap_or("?").to_owned())
                .collect();
            assert_eq!(names.len(), 1, "{ifname} {attach:?} programs: {names:?}");
            assert!(
                names[0].starts_with("ipq_tc"),
                "{ifname} {attach:?} runs {names:?}"
            );
        }
    }

    // A clean stop (as for an upgrade) exits 0 and leaves the programs enforcing.
    second.terminate().expect("stopping ipq-agent with SIGTERM");
    check_fenced(&lab, "after SIGTERM");
}

/// An operator's `ipq events --follow` across a restart loses nothing of the old agent's last
/// moments: a follower gets every event the agent published before its stop (here the drain
/// made just before SIGTERM), then the end of its stream, not a cut connection.
#[test]
fn a_follower_gets_the_last_events_before_the_stop_then_the_end_of_its_stream() {
    use std::{
        io::{Read as _, Write as _},
        os::unix::net::UnixStream,
        time::Duration,
    };

    let lab = Lab::new().expect("lab");
    let mut agent = lab.start_agent(&[]).expect("starting ipq-agent");
    ipq_tests::lab::wait_claimed_at_start(&lab, Duration::from_secs(10));
    let socket = agent.api_socket();

    let mut follower = UnixStream::connect(&socket).expect("connecting to the API");
    follower
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("read timeout");
    follower
        .write_all(b"GET /v1/events?follow=true HTTP/1.1\r\nHost: ipq\r\nConnection: close\r\n\r\n")
        .expect("asking to follow the events");
    // The answer's head comes once the agent subscribed this stream: what follows is live.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        follower.read_exact(&mut byte).expect("the answer's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");

    let pod_a = IpAddr::from(POD_A_V4);
    let drained = ipq_tests::api::request(
        &socket,
        "POST",
        &format!("/v1/addresses/{pod_a}/drain"),
        None,
    )
    .expect("draining pod a");
    assert_eq!(drained.status, 200, "{}", drained.body);
    agent.terminate().expect("stopping ipq-agent with SIGTERM");

    let mut rest = Vec::new();
    follower
        .read_to_end(&mut rest)
        .expect("the stream, to its end");
    let rest = String::from_utf8_lossy(&rest);
    let drain_seen = rest.lines().any(|line| {
        serde_json::from_str::<serde_json::Value>(line).is_ok_and(|event| {
            event["type"] == "transition"
                && event["address"] == pod_a.to_string()
                && event["to"] == "draining"
        })
    });
    assert!(
        drain_seen,
        "the drain made before the stop is not in the stream:\n{rest}"
    );
    assert!(
        rest.ends_with("0\r\n\r\n"),
        "the stream was cut instead of ended:\n{rest}"
    );
}
