//! A datapath write the kernel refuses: `IPQ_ADDRS` filled to its `max_entries` by another
//! process (raw `bpf()` writes through the pin), then a claim of a new address. The claim is
//! answered `unavailable`, not `ok`; the refused write is counted, retried on every tick,
//! shown in `ipq status` and the address's view, and `/readyz` fails while it pends; once the
//! other process's entries are gone, the retry writes the entry and everything says so.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides them.

use std::{net::IpAddr, time::Duration};

use aya::maps::{HashMap, MapData};
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    names,
};
use ipq_tests::{
    api,
    lab::{poll, Agent, Lab},
};
use serde_json::{json, Value};

/// The map's size for this test: small, so another process fills it with a few writes.
const CAPACITY: u32 = 8;
const CLAIMED: &str = "10.77.0.60";

fn addrs_map(lab: &Lab) -> HashMap<MapData, AddrKey, AddrEntry> {
    let path = lab.bpffs.path().join("maps").join(names::MAP_ADDRS);
    HashMap::try_from(aya::maps::Map::HashMap(
        MapData::from_pin(path).expect("opening IPQ_ADDRS"),
    ))
    .expect("IPQ_ADDRS as a hash map")
}

/// Another process's entries, written through `map`, until the kernel refuses one more (the
/// map is full); their addresses.
fn fill(map: &mut HashMap<MapData, AddrKey, AddrEntry>) -> Vec<IpAddr> {
    let mut written = Vec::new();
    for i in 0..=CAPACITY {
        let addr = IpAddr::from([10, 99, 0, i as u8 + 1]);
        if map
            .insert(AddrKey::from(addr), AddrEntry::default(), 0)
            .is_err()
        {
            return written;
        }
        written.push(addr);
    }
    panic!("IPQ_ADDRS took {} entries beyond its size", written.len());
}

/// Whether `addr` has no entry, read through the descriptor opened under the earlier agent:
/// opening the pin again (as `Lab::datapath_entry` does) is a `bpf()` call the watcher reports,
/// and the verification it starts would take the other process's entries out.
fn not_in(map: &HashMap<MapData, AddrKey, AddrEntry>, addr: IpAddr) -> bool {
    matches!(
        map.get(&AddrKey::from(addr), 0),
        Err(aya::maps::MapError::KeyNotFound)
    )
}

fn unfill(lab: &Lab, foreign: &[IpAddr]) {
    let mut map = addrs_map(lab);
    for addr in foreign {
        map.remove(&AddrKey::from(*addr))
            .expect("removing another process's entry");
    }
}

fn claim(agent: &Agent) -> api::HttpResponse {
    let body = json!({
        "addresses": [CLAIMED],
        "holder": {"interface": "vethpa", "container_id": "c0ffee60"},
        "source": "cni",
    });
    api::request(
        &agent.api_socket(),
        "POST",
        "/v1/claims",
        Some(&body.to_string()),
    )
    .expect("POST /v1/claims")
}

fn failures(agent: &Agent) -> f64 {
    agent
        .metric("ipq_datapath_write_failures_total", &[("op", "update")])
        .expect("ipq_datapath_write_failures_total{op=\"update\"}")
}

fn get(agent: &Agent) -> Value {
    api::request(
        &agent.api_socket(),
        "GET",
        &format!("/v1/addresses/{CLAIMED}"),
        None,
    )
    .expect("GET the claimed address")
    .json()
    .expect("its view")
}

#[test]
fn a_write_refused_by_a_full_map_is_retried_until_it_goes_through() {
    let lab = Lab::new().expect("building the lab");
    let capacity = CAPACITY.to_string();
    // The verification would also take the foreign entries out (another process's writes):
    // kept out of the way, so that only the test ends the fault. Its periodic pass is an hour
    // away, and the bpf() watcher does not see the writes: they go through a descriptor
    // opened under an earlier agent (the watcher's set of processes that opened ipq's maps is
    // the running agent's own), the one way past it that docs/kernels.md names.
    let args = [
        "--workload",
        "vethp*",
        "--capacity",
        &capacity,
        "--verify-interval",
        "1h",
    ];
    let mut earlier = lab
        .start_agent(&args)
        .expect("starting the earlier ipq-agent");
    let mut opened_before = addrs_map(&lab);
    earlier.terminate().expect("stopping the earlier ipq-agent");
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    let addr: IpAddr = CLAIMED.parse().unwrap();
    let foreign = fill(&mut opened_before);
    assert!(!foreign.is_empty(), "the agent's map had no room at all");

    claim(&agent).assert_error(
        "a claim whose entry the full map refused",
        503,
        "unavailable",
        &["refused its datapath entry", CLAIMED],
    );
    assert!(not_in(&opened_before, addr));
    let view = get(&agent);
    assert_eq!(view["state"], "active", "{view}");
    assert_eq!(view["pending_write"]["op"], "update", "{view}");
    let (status, body) = agent.readyz().expect("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("datapath writes refused"), "{body}");
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(status["ready"], false, "{status}");
    assert_eq!(status["datapath_writes_pending"], 1, "{status}");
    assert_eq!(status["pending_writes"][0]["address"], CLAIMED, "{status}");
    let table = api::ipq(&agent.api_socket(), &["status"]).unwrap();
    assert!(
        table
            .ok()
            .contains("Datapath:        1 addresses NOT WRITTEN; 10.77.0.60: update refused"),
        "ipq status:\n{}",
        table.ok()
    );
    assert_eq!(
        agent.metric("ipq_datapath_writes_pending", &[]).unwrap(),
        1.0
    );

    // The ticks retry it, and each refusal is counted.
    let refused_once = failures(&agent);
    assert!(refused_once >= 1.0);
    poll("a retry on a tick", Duration::from_secs(10), || {
        Ok((failures(&agent) > refused_once).then_some(()))
    })
    .unwrap();
    assert!(not_in(&opened_before, addr));

    // The other process's entries gone: the next tick writes the entry.
    unfill(&lab, &foreign);
    lab.maps()
        .wait_entry(addr, Duration::from_secs(10), "written by a retry", |e| {
            e.is_some_and(|e| e.state == "active")
        })
        .unwrap();
    poll("the agent ready again", Duration::from_secs(10), || {
        Ok((agent.readyz()?.0 == 200).then_some(()))
    })
    .unwrap();
    assert_eq!(
        agent.metric("ipq_datapath_writes_pending", &[]).unwrap(),
        0.0
    );
    assert!(get(&agent)["pending_write"].is_null());
    let answered = claim(&agent);
    assert_eq!(answered.status, 200, "{:?}", answered.json());
}
