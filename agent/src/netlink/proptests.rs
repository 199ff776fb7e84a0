//! Properties of [`NetState`] over random event sequences (a handful of addresses, interfaces
//! and MACs, so that every entry is added, moved and removed many times over):
//!
//! 1. the indexes (per interface, neighbours per MAC) always list exactly the entries;
//! 2. every query answers as a plain model does: the same collections without indexes, where
//!    a link going away scans everything (the implementation before the indexes);
//! 3. `diff` then `apply` turns one state into another, whatever both hold.
//!
//! And without randomness: the events a per-event path handles never scan a collection.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use proptest::{prelude::*, test_runner::FileFailurePersistence};

use super::{full_scans, Mac, NetEvent, NetState};

const ADDRS: [&str; 4] = ["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"];
const IFINDEXES: u32 = 4;
const MACS: u8 = 3;

fn addr(i: usize) -> IpAddr {
    ADDRS[i % ADDRS.len()].parse().unwrap()
}

fn mac(i: u8) -> Mac {
    [2, 0, 0, 0, 0, i % MACS]
}

fn event() -> impl Strategy<Value = NetEvent> {
    let a = (0..ADDRS.len()).prop_map(addr);
    let i = 1..=IFINDEXES;
    let m = (0..MACS).prop_map(mac);
    prop_oneof![
        (i.clone(), 0..2u8).prop_map(|(ifindex, n)| NetEvent::Link {
            ifindex,
            name: format!("veth{ifindex}-{n}"),
        }),
        i.clone().prop_map(|ifindex| NetEvent::LinkGone { ifindex }),
        (a.clone(), i.clone()).prop_map(|(addr, ifindex)| NetEvent::HostRoute { addr, ifindex }),
        (a.clone(), i.clone())
            .prop_map(|(addr, ifindex)| NetEvent::HostRouteGone { addr, ifindex }),
        (a.clone(), i.clone()).prop_map(|(addr, ifindex)| NetEvent::NodeAddress { addr, ifindex }),
        (a.clone(), i.clone())
            .prop_map(|(addr, ifindex)| NetEvent::NodeAddressGone { addr, ifindex }),
        (a.clone(), i.clone(), proptest::option::of(m.clone()))
            .prop_map(|(addr, ifindex, mac)| NetEvent::Neighbour { addr, ifindex, mac }),
        (a, i.clone()).prop_map(|(addr, ifindex)| NetEvent::NeighbourGone { addr, ifindex }),
        (m.clone(), i.clone()).prop_map(|(mac, port)| NetEvent::Fdb { mac, port }),
        (m, i).prop_map(|(mac, port)| NetEvent::FdbGone { mac, port }),
    ]
}

/// The state as plain collections, every removal a scan: what the indexes must agree with.
#[derive(Debug, Default)]
struct Model {
    links: BTreeMap<u32, String>,
    host_routes: BTreeSet<(IpAddr, u32)>,
    node_addresses: BTreeSet<(IpAddr, u32)>,
    neighbours: BTreeMap<(IpAddr, u32), Option<Mac>>,
    fdb: BTreeMap<Mac, u32>,
}

impl Model {
    fn apply(&mut self, event: &NetEvent) -> bool {
        match event {
            NetEvent::Link { ifindex, name } => {
                self.links.insert(*ifindex, name.clone()).as_ref() != Some(name)
            }
            NetEvent::LinkGone { ifindex } => {
                let removed = self.links.remove(ifindex).is_some();
                self.host_routes.retain(|(_, i)| i != ifindex);
                self.node_addresses.retain(|(_, i)| i != ifindex);
                self.neighbours.retain(|(_, i), _| i != ifindex);
                self.fdb.retain(|_, port| port != ifindex);
                removed
            }
            NetEvent::HostRoute { addr, ifindex } => self.host_routes.insert((*addr, *ifindex)),
            NetEvent::HostRouteGone { addr, ifindex } => {
                self.host_routes.remove(&(*addr, *ifindex))
            }
            NetEvent::NodeAddress { addr, ifindex } => {
                self.node_addresses.insert((*addr, *ifindex))
            }
            NetEvent::NodeAddressGone { addr, ifindex } => {
                self.node_addresses.remove(&(*addr, *ifindex))
            }
            NetEvent::Neighbour { addr, ifindex, mac } => {
                self.neighbours.insert((*addr, *ifindex), *mac) != Some(*mac)
            }
            NetEvent::NeighbourGone { addr, ifindex } => {
                self.neighbours.remove(&(*addr, *ifindex)).is_some()
            }
            NetEvent::Fdb { mac, port } => self.fdb.insert(*mac, *port) != Some(*port),
            NetEvent::FdbGone { mac, port } => {
                let known = self.fdb.get(mac) == Some(port);
                if known {
                    self.fdb.remove(mac);
                }
                known
            }
            NetEvent::Overrun => false,
        }
    }

    fn port_of(&self, addr: IpAddr) -> Option<u32> {
        self.neighbours
            .iter()
            .filter(|((a, _), _)| *a == addr)
            .find_map(|(_, mac)| self.fdb.get(mac.as_ref()?).copied())
    }

    fn addresses_with_mac(&self, mac: &Mac) -> Vec<IpAddr> {
        let mut addrs: Vec<IpAddr> = self
            .neighbours
            .iter()
            .filter(|(_, m)| m.as_ref() == Some(mac))
            .map(|((addr, _), _)| *addr)
            .collect();
        addrs.dedup();
        addrs
    }
}

/// Every query of `state` answers as `model` does.
fn agrees(state: &NetState, model: &Model) -> Result<(), TestCaseError> {
    for ifindex in 1..=IFINDEXES {
        prop_assert_eq!(
            state.link_name(ifindex),
            model.links.get(&ifindex).map(String::as_str)
        );
        prop_assert_eq!(state.has_link(ifindex), model.links.contains_key(&ifindex));
    }
    for a in (0..ADDRS.len()).map(addr) {
        for ifindex in 1..=IFINDEXES {
            prop_assert_eq!(
                state.has_host_route(a, ifindex),
                model.host_routes.contains(&(a, ifindex))
            );
        }
        prop_assert_eq!(
            state.is_node_address(a),
            model.node_addresses.iter().any(|(n, _)| *n == a)
        );
        prop_assert_eq!(state.port_of(a), model.port_of(a), "port of {}", a);
    }
    for m in (0..MACS).map(mac) {
        prop_assert_eq!(state.addresses_with_mac(&m), model.addresses_with_mac(&m));
    }
    let mut routes: Vec<(IpAddr, u32)> = state.host_routes().collect();
    routes.sort_unstable();
    let modelled: Vec<(IpAddr, u32)> = model.host_routes.iter().copied().collect();
    prop_assert_eq!(routes, modelled);
    let entries = model.links.len()
        + model.host_routes.len()
        + model.node_addresses.len()
        + model.neighbours.len()
        + model.fdb.len();
    prop_assert_eq!(state.entry_count(), entries);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn indexes_follow_every_event_and_answer_as_a_scan_would(
        events in proptest::collection::vec(event(), 0..80)
    ) {
        let mut state = NetState::default();
        let mut model = Model::default();
        for event in &events {
            let changed = state.apply(event);
            prop_assert_eq!(changed, model.apply(event), "{:?}", event);
            if let Err(problem) = state.check_indexes() {
                return Err(TestCaseError::fail(format!("after {event:?}: {problem}")));
            }
            agrees(&state, &model)?;
        }
    }

    #[test]
    fn a_diff_replayed_turns_one_state_into_the_other(
        before in proptest::collection::vec(event(), 0..40),
        after in proptest::collection::vec(event(), 0..40),
    ) {
        let mut from = NetState::default();
        for event in &before {
            from.apply(event);
        }
        let mut to = NetState::default();
        for event in &after {
            to.apply(event);
        }
        let mut replayed = from.clone();
        for event in from.diff(&to) {
            replayed.apply(&event);
        }
        prop_assert!(replayed.check_indexes().is_ok());
        prop_assert_eq!(replayed, to);
    }
}

/// A node with `links` workload links, each with a host route, a node address, a neighbour
/// and an FDB entry of its own.
fn crowded(links: u32) -> NetState {
    let mut state = NetState::default();
    for ifindex in 1..=links {
        let [_, _, hi, lo] = ifindex.to_be_bytes();
        let pod = IpAddr::from([10, 1, hi, lo]);
        let gw = IpAddr::from([10, 2, hi, lo]);
        let pod_mac = [2, 0, 0, 0, hi, lo];
        for event in [
            NetEvent::Link {
                ifindex,
                name: format!("veth{ifindex}"),
            },
            NetEvent::HostRoute { addr: pod, ifindex },
            NetEvent::NodeAddress { addr: gw, ifindex },
            NetEvent::Neighbour {
                addr: pod,
                ifindex,
                mac: Some(pod_mac),
            },
            NetEvent::Fdb {
                mac: pod_mac,
                port: ifindex,
            },
        ] {
            state.apply(&event);
        }
    }
    state
}

#[test]
fn per_event_paths_never_scan_what_is_stored() {
    let mut state = crowded(2000);
    let scans = full_scans();
    let pod_mac = [2, 0, 0, 0, 0, 9];
    // The queries the tracker makes per event, and every event but a resync.
    assert_eq!(state.port_of(IpAddr::from([10, 1, 0, 9])), Some(9));
    assert_eq!(
        state.addresses_with_mac(&pod_mac),
        vec![IpAddr::from([10, 1, 0, 9])]
    );
    assert!(state.is_node_address(IpAddr::from([10, 2, 0, 9])));
    assert!(state.apply(&NetEvent::Fdb {
        mac: pod_mac,
        port: 10
    }));
    assert!(state.apply(&NetEvent::FdbGone {
        mac: pod_mac,
        port: 10
    }));
    let before = state.entry_count();
    assert!(state.apply(&NetEvent::LinkGone { ifindex: 7 }));
    assert_eq!(
        full_scans(),
        scans,
        "a per-event path scanned a whole collection"
    );
    // The link and its four entries went, nothing else.
    assert_eq!(state.entry_count(), before - 5);
    assert_eq!(state.port_of(IpAddr::from([10, 1, 0, 8])), Some(8));
    state.check_indexes().expect("indexes after the link went");
    // A resync's diff is the one place that walks everything.
    let _ = state.diff(&NetState::default());
    assert!(full_scans() > scans);
}
