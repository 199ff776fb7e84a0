//! ipq's maps written by another process (a raw `bpf()` write through a pin, which nothing
//! announces): the verification compares `IPQ_ADDRS`, `IPQ_SLOTS` and `IPQ_IFACES` with what
//! the agent wrote, writes its own back, and says so (a counter per map, an event, a WARN
//! line, `ipq status`); and at start-up a tampered copy never loosens what the other copy
//! enforces (the stricter wins).
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides them.

use std::{net::IpAddr, path::Path, time::Duration};

use aya::maps::{Array, HashMap, MapData};
use ipq_api::{model::EventBody, CheckedMap};
use ipq_common::{
    addr::{AddrEntry, AddrKey, NO_IFINDEX},
    iface::{iface_slot, IfaceEntry},
    names,
    slots::AddrSlot,
};
use ipq_tests::{
    api,
    flows::Flows,
    lab::{ifindex, poll, udp_burst, Agent, Lab, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6},
};

fn map_path(lab: &Lab, name: &str) -> std::path::PathBuf {
    lab.bpffs.path().join("maps").join(name)
}

fn slots(path: &Path) -> Array<MapData, AddrSlot> {
    Array::try_from(aya::maps::Map::Array(
        MapData::from_pin(path).expect("opening IPQ_SLOTS"),
    ))
    .expect("IPQ_SLOTS as an array")
}

/// Another process's `bpf(BPF_MAP_UPDATE_ELEM)` on `IPQ_SLOTS`: the slot holding `addr` keeps
/// its key and counters, its entry loses its fence.
fn unfence_slot(lab: &Lab, addr: IpAddr) {
    let mut table = slots(&map_path(lab, names::MAP_SLOTS));
    let key = AddrKey::from(addr);
    for i in 0..table.len() {
        let mut slot = table.get(&i, 0).expect("reading a slot");
        if slot.entry.state != 0 && slot.key == key {
            slot.entry.fenced_ifindex = NO_IFINDEX;
            table.set(i, slot, 0).expect("writing the slot");
            return;
        }
    }
    panic!("{addr} is in no slot of IPQ_SLOTS");
}

/// The same on `IPQ_ADDRS`.
fn unfence_hashed(lab: &Lab, addr: IpAddr) {
    let mut map: HashMap<MapData, AddrKey, AddrEntry> = HashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_pin(map_path(lab, names::MAP_ADDRS)).unwrap(),
    ))
    .expect("IPQ_ADDRS as a hash map");
    let key = AddrKey::from(addr);
    let mut entry = map.get(&key, 0).expect("pod a's entry");
    entry.fenced_ifindex = NO_IFINDEX;
    map.insert(key, entry, 0).expect("writing IPQ_ADDRS");
}

fn delete_hashed(lab: &Lab, addr: IpAddr) {
    let mut map: HashMap<MapData, AddrKey, AddrEntry> = HashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_pin(map_path(lab, names::MAP_ADDRS)).unwrap(),
    ))
    .expect("IPQ_ADDRS as a hash map");
    map.remove(&AddrKey::from(addr))
        .expect("deleting from IPQ_ADDRS");
}

/// Gives vethpa's own fast-path slot in `IPQ_IFACES` the address `addr`: its packets skip
/// every lookup and pass.
fn list_in_fast_path(lab: &Lab, addr: IpAddr) {
    let vethpa = ifindex(&lab.node, "vethpa").expect("ifindex");
    let mut map: Array<MapData, IfaceEntry> = Array::try_from(aya::maps::Map::Array(
        MapData::from_pin(map_path(lab, names::MAP_IFACES)).unwrap(),
    ))
    .expect("IPQ_IFACES as an array");
    let mut value = IfaceEntry {
        ifindex: vethpa,
        ..IfaceEntry::default()
    };
    value.own[0] = AddrKey::from(addr);
    map.set(iface_slot(vethpa), value, 0)
        .expect("writing IPQ_IFACES");
}

fn rewritten(agent: &Agent, map: &str) -> f64 {
    agent
        .metric("ipq_datapath_map_entries_rewritten_total", &[("map", map)])
        .unwrap_or(0.0)
}

fn status(agent: &Agent) -> serde_json::Value {
    api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("GET /v1/status")
        .json()
        .expect("status JSON")
}

#[test]
fn a_foreign_write_to_ipqs_maps_is_found_written_back_and_reported() {
    let lab = Lab::new().expect("building the lab");
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--verify-interval",
        "200ms",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let (v4, v6) = (IpAddr::from(POD_A_V4), IpAddr::from(POD_A_V6));
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, PEER_V4.into(), 10), 0);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, PEER_V6.into(), 10), 0);

    // Pod a's v4 address unfenced in both copies of the table; its v6 address put on
    // vethpa's fast path. Either lets every packet of the fenced pod through.
    unfence_hashed(&lab, v4);
    unfence_slot(&lab, v4);
    list_in_fast_path(&lab, v6);

    poll(
        "the maps written back, counted, and pod a fenced again",
        Duration::from_secs(10),
        || {
            let counted = [names::MAP_ADDRS, names::MAP_SLOTS, names::MAP_IFACES]
                .iter()
                .all(|map| rewritten(&agent, map) >= 1.0);
            Ok((counted
                && udp_burst(&lab.pod_a, &lab.peer, PEER_V4.into(), 10) == 0
                && udp_burst(&lab.pod_a, &lab.peer, PEER_V6.into(), 10) == 0)
                .then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));

    let status = status(&agent);
    // ipq status says what finds map writes, and how late: the bpf() watcher where it is
    // attached (tests/tests/bpf_watch.rs), the periodic verification in any case.
    assert!(
        status["unannounced"].as_str().is_some_and(|u| {
            (u.starts_with("bpf() watcher") || u.starts_with("periodic verification only"))
                && u.contains("every 200ms")
        }),
        "{status}"
    );
    // The last pass that found something (the writes above may fall into two passes).
    let found = status["verification"]["last_found"].to_string();
    assert!(
        found.contains("IPQ_SLOTS 10.77.0.2") || found.contains("IPQ_IFACES slot"),
        "ipq status names what was written back: {found}"
    );
    let log = agent.log();
    assert!(
        log.contains("IPQ_SLOTS: 1 entries differed from what ipq wrote"),
        "one WARN line per map:\n{log}"
    );
    let rewritten_maps: Vec<CheckedMap> = api::events(&agent.api_socket())
        .expect("GET /v1/events")
        .into_iter()
        .filter_map(|e| match e.body {
            EventBody::MapRewritten { map, .. } => Some(map),
            _ => None,
        })
        .collect();
    for map in [
        CheckedMap::IpqAddrs,
        CheckedMap::IpqSlots,
        CheckedMap::IpqIfaces,
    ] {
        assert!(
            rewritten_maps.contains(&map),
            "a map_rewritten event of {map}: {rewritten_maps:?}"
        );
    }
    // Written back exactly: no further pass finds anything.
    let before = rewritten(&agent, names::MAP_SLOTS);
    poll("two more passes", Duration::from_secs(5), || {
        let at = agent.verified_at();
        Ok((at != status["verification"]["at"]).then_some(()))
    })
    .expect("a later verification");
    assert_eq!(rewritten(&agent, names::MAP_SLOTS), before);
    assert_eq!(agent.readyz().expect("readyz").0, 200);
}

#[test]
fn a_tampered_map_loosens_nothing_across_a_restart() {
    let lab = Lab::new().expect("building the lab");
    // No verification during the test: the start-up alone must keep pod a fenced.
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--verify-interval",
        "1h",
    ];
    let mut first = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, PEER_V4.into(), 10), 0);

    let flows = Flows::start(&lab);
    // The hash map loses pod a's entries; the programs still judge from IPQ_SLOTS.
    for addr in [IpAddr::from(POD_A_V4), POD_A_V6.into()] {
        delete_hashed(&lab, addr);
    }
    first.terminate().expect("TERM");
    let second = lab.start_agent(&args).expect("restarting ipq-agent");
    flows.stop_and_check(100, "across a restart over a tampered IPQ_ADDRS");
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, PEER_V4.into(), 10), 0);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, PEER_V6.into(), 10), 0);

    let status = status(&second);
    let problems = status["recovery"]["problems"].to_string();
    assert!(
        problems.contains("10.77.0.2: IPQ_SLOTS has draining holder")
            && problems.contains("kept IPQ_SLOTS's (stricter)"),
        "the disagreement is reported: {problems}"
    );
    let log = second.log();
    assert!(!log.contains("adopting the datapath's"), "{log}");
}
