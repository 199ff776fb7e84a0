use std::net::{Ipv4Addr, Ipv6Addr};

use netlink_packet_route::{
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{
        RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
        RouteType,
    },
};

use super::*;

fn route(family: AddressFamily, prefix: u8, attributes: Vec<RouteAttribute>) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header = RouteHeader {
        address_family: family,
        destination_prefix_length: prefix,
        table: RT_TABLE_MAIN as u8,
        protocol: RouteProtocol::Boot,
        scope: RouteScope::Link,
        kind: RouteType::Unicast,
        ..Default::default()
    };
    msg.attributes = attributes;
    msg
}

fn link(ifindex: u32, name: &str) -> NetEvent {
    NetEvent::Link {
        ifindex,
        name: name.into(),
    }
}

/// The state these events build.
fn state_of(events: &[NetEvent]) -> NetState {
    let mut state = NetState::default();
    for event in events {
        state.apply(event);
    }
    state
}

#[test]
fn host_routes_through_an_interface_are_pod_addresses() {
    let v4 = IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2));
    let msg = route(
        AddressFamily::Inet,
        32,
        vec![
            RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(10, 77, 0, 2))),
            RouteAttribute::Oif(7),
        ],
    );
    assert_eq!(
        route_event(&msg, true),
        Some(NetEvent::HostRoute {
            addr: v4,
            ifindex: 7
        })
    );
    assert_eq!(
        route_event(&msg, false),
        Some(NetEvent::HostRouteGone {
            addr: v4,
            ifindex: 7
        })
    );
    let v6 = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 2);
    let msg = route(
        AddressFamily::Inet6,
        128,
        vec![
            RouteAttribute::Destination(RouteAddress::Inet6(v6)),
            RouteAttribute::Oif(8),
            RouteAttribute::Table(RT_TABLE_MAIN),
        ],
    );
    assert_eq!(
        route_event(&msg, true),
        Some(NetEvent::HostRoute {
            addr: IpAddr::V6(v6),
            ifindex: 8
        })
    );
}

#[test]
fn other_routes_are_not_pod_addresses() {
    let dst = RouteAttribute::Destination(RouteAddress::Inet(Ipv4Addr::new(10, 77, 0, 0)));
    // A prefix.
    assert_eq!(
        route_event(
            &route(
                AddressFamily::Inet,
                24,
                vec![dst.clone(), RouteAttribute::Oif(7)]
            ),
            true
        ),
        None
    );
    // Through a gateway.
    let gw = RouteAttribute::Gateway(RouteAddress::Inet(Ipv4Addr::new(10, 0, 0, 1)));
    assert_eq!(
        route_event(
            &route(
                AddressFamily::Inet,
                32,
                vec![dst.clone(), RouteAttribute::Oif(7), gw]
            ),
            true
        ),
        None
    );
    // Another table.
    let other_table = route(
        AddressFamily::Inet,
        32,
        vec![
            dst.clone(),
            RouteAttribute::Oif(7),
            RouteAttribute::Table(100),
        ],
    );
    assert_eq!(route_event(&other_table, true), None);
    // A local route.
    let mut local = route(
        AddressFamily::Inet,
        32,
        vec![dst.clone(), RouteAttribute::Oif(7)],
    );
    local.header.kind = RouteType::Local;
    assert_eq!(route_event(&local, true), None);
    // The kernel's own route for an address configured on the node (ptp's IPv6 gateway /128).
    let gateway = RouteAttribute::Destination(RouteAddress::Inet6("fd92::1".parse().unwrap()));
    let mut kernel = route(
        AddressFamily::Inet6,
        128,
        vec![gateway, RouteAttribute::Oif(7)],
    );
    kernel.header.protocol = RouteProtocol::Kernel;
    assert_eq!(route_event(&kernel, true), None);
    // No interface.
    assert_eq!(
        route_event(&route(AddressFamily::Inet, 32, vec![dst]), true),
        None
    );
}

#[test]
fn diff_reports_what_changed_removals_first() {
    let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let b = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let before = state_of(&[
        link(3, "veth-a"),
        link(4, "veth-b"),
        NetEvent::HostRoute {
            addr: a,
            ifindex: 3,
        },
    ]);
    let after = state_of(&[
        link(4, "veth-b"),
        link(5, "veth-c"),
        NetEvent::HostRoute {
            addr: b,
            ifindex: 5,
        },
    ]);
    let events = before.diff(&after);
    assert_eq!(
        events,
        vec![
            NetEvent::HostRouteGone {
                addr: a,
                ifindex: 3
            },
            NetEvent::LinkGone { ifindex: 3 },
            NetEvent::Link {
                ifindex: 5,
                name: "veth-c".into()
            },
            NetEvent::HostRoute {
                addr: b,
                ifindex: 5
            },
        ]
    );
    let mut replayed = before.clone();
    for event in &events {
        replayed.apply(event);
    }
    assert_eq!(replayed, after);
}

#[test]
fn link_gone_drops_its_routes_and_neighbours() {
    let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let mut state = NetState::default();
    state.apply(&NetEvent::Link {
        ifindex: 3,
        name: "veth-a".into(),
    });
    state.apply(&NetEvent::HostRoute {
        addr: a,
        ifindex: 3,
    });
    state.apply(&NetEvent::Neighbour {
        addr: a,
        ifindex: 3,
        mac: Some([2, 0, 0, 0, 0, 1]),
    });
    state.apply(&NetEvent::Fdb {
        mac: [2, 0, 0, 0, 0, 1],
        port: 3,
    });
    assert!(state.apply(&NetEvent::LinkGone { ifindex: 3 }));
    assert_eq!(state, NetState::default());
}

#[test]
fn bridge_port_of_an_address_comes_from_neighbour_and_fdb() {
    let pod = IpAddr::V4(Ipv4Addr::new(10, 88, 0, 5));
    let mac = [0x02, 0x42, 0, 0, 0, 5];
    let mut state = NetState::default();
    // The bridge (if 2) resolved the pod's address to its MAC...
    state.apply(&NetEvent::Neighbour {
        addr: pod,
        ifindex: 2,
        mac: Some(mac),
    });
    assert_eq!(state.port_of(pod), None);
    // ... and learned that MAC behind port if 7.
    state.apply(&NetEvent::Fdb { mac, port: 7 });
    assert_eq!(state.port_of(pod), Some(7));
    // The MAC moves to another port (a new pod got the address and the old MAC left).
    state.apply(&NetEvent::Fdb { mac, port: 9 });
    assert_eq!(state.port_of(pod), Some(9));
    state.apply(&NetEvent::FdbGone { mac, port: 7 });
    assert_eq!(
        state.port_of(pod),
        Some(9),
        "a stale removal for the old port is ignored"
    );
    state.apply(&NetEvent::LinkGone { ifindex: 9 });
    assert_eq!(state.port_of(pod), None);
}

fn neighbour(
    family: AddressFamily,
    state: NeighbourState,
    attributes: Vec<NeighbourAttribute>,
) -> NeighbourMessage {
    let mut msg = NeighbourMessage::default();
    msg.header.family = family;
    msg.header.ifindex = 4;
    msg.header.state = state;
    msg.attributes = attributes;
    msg
}

#[test]
fn neighbour_messages_are_translated() {
    let mac = vec![2, 0, 0, 0, 0, 9];
    let ip = Ipv4Addr::new(10, 88, 0, 9);
    let dst = NeighbourAttribute::Destination(NeighbourAddress::Inet(ip));
    let lladdr = NeighbourAttribute::LinkLayerAddress(mac.clone());
    let msg = neighbour(
        AddressFamily::Inet,
        NeighbourState::Reachable,
        vec![dst.clone(), lladdr.clone()],
    );
    assert_eq!(
        neighbour_event(&msg, true),
        Some(NetEvent::Neighbour {
            addr: IpAddr::V4(ip),
            ifindex: 4,
            mac: Some([2, 0, 0, 0, 0, 9])
        })
    );
    // Unresolved entries are not neighbours.
    let failed = neighbour(
        AddressFamily::Inet,
        NeighbourState::Failed,
        vec![dst, lladdr.clone()],
    );
    assert_eq!(
        neighbour_event(&failed, true),
        Some(NetEvent::NeighbourGone {
            addr: IpAddr::V4(ip),
            ifindex: 4
        })
    );
    // Link-local and multicast addresses never name a workload.
    let ll = NeighbourAttribute::Destination(NeighbourAddress::Inet6(Ipv6Addr::new(
        0xfe80, 0, 0, 0, 0, 0, 0, 1,
    )));
    assert_eq!(
        neighbour_event(
            &neighbour(AddressFamily::Inet6, NeighbourState::Reachable, vec![ll]),
            true
        ),
        None
    );
    // Bridge FDB: learned entries name a port, the bridge's own permanent ones do not.
    let fdb = neighbour(
        AddressFamily::Bridge,
        NeighbourState::Reachable,
        vec![lladdr.clone()],
    );
    assert_eq!(
        neighbour_event(&fdb, true),
        Some(NetEvent::Fdb {
            mac: [2, 0, 0, 0, 0, 9],
            port: 4
        })
    );
    let local = neighbour(
        AddressFamily::Bridge,
        NeighbourState::Permanent,
        vec![lladdr],
    );
    assert_eq!(neighbour_event(&local, true), None);
}

#[test]
fn node_addresses_are_known_and_come_before_routes_in_a_diff() {
    use netlink_packet_route::address::{AddressAttribute, AddressMessage};
    let gw: IpAddr = "fd92::1".parse().unwrap();
    let mut msg = AddressMessage::default();
    msg.header.index = 7;
    msg.header.prefix_len = 128;
    msg.attributes = vec![AddressAttribute::Address(gw)];
    let event = address_event(&msg, true).expect("an address event");
    assert_eq!(
        event,
        NetEvent::NodeAddress {
            addr: gw,
            ifindex: 7
        }
    );
    assert_eq!(
        address_event(&msg, false),
        Some(NetEvent::NodeAddressGone {
            addr: gw,
            ifindex: 7
        })
    );
    // IFA_LOCAL is the node's own address where IFA_ADDRESS names a point-to-point peer.
    let local: IpAddr = "10.9.0.1".parse().unwrap();
    msg.attributes = vec![
        AddressAttribute::Address("10.9.0.2".parse().unwrap()),
        AddressAttribute::Local(local),
    ];
    assert_eq!(
        address_event(&msg, true),
        Some(NetEvent::NodeAddress {
            addr: local,
            ifindex: 7
        })
    );

    let mut state = NetState::default();
    assert!(!state.is_node_address(gw));
    state.apply(&event);
    assert!(state.is_node_address(gw));
    let next = state_of(&[
        NetEvent::HostRoute {
            addr: gw,
            ifindex: 8,
        },
        NetEvent::NodeAddress {
            addr: gw,
            ifindex: 8,
        },
    ]);
    let events = NetState::default().diff(&next);
    assert_eq!(
        events,
        vec![
            NetEvent::NodeAddress {
                addr: gw,
                ifindex: 8
            },
            NetEvent::HostRoute {
                addr: gw,
                ifindex: 8
            },
        ]
    );
    state.apply(&NetEvent::LinkGone { ifindex: 7 });
    assert!(!state.is_node_address(gw));
}

#[test]
fn a_link_recreated_under_its_index_keeps_its_routes_after_a_resync() {
    // Events were lost while veth 3 was deleted and a new one took its index and the same pod
    // address: the resync's `LinkGone` takes the old entries, so the route must come again.
    let pod = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let route = NetEvent::HostRoute {
        addr: pod,
        ifindex: 3,
    };
    let before = state_of(&[link(3, "veth-old"), route.clone()]);
    let after = state_of(&[link(3, "veth-new"), route.clone()]);
    let events = before.diff(&after);
    assert_eq!(
        events,
        vec![
            NetEvent::LinkGone { ifindex: 3 },
            link(3, "veth-new"),
            route
        ]
    );
    let mut replayed = before.clone();
    for event in &events {
        replayed.apply(event);
    }
    assert_eq!(replayed, after);
}

/// The event socket's buffer is widened past `rmem_max` (the agent runs with CAP_NET_ADMIN, as
/// these tests do): the kernel reports twice the size set.
#[test]
fn the_event_socket_buffer_outgrows_rmem_max() {
    use std::os::fd::AsRawFd;
    crate::needs_root::needs_root("set a netlink socket's buffer past net.core.rmem_max");
    let socket = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE).unwrap();
    widen_receive_buffer(&socket);
    let mut size: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: a live socket and an out-value of the length given.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut size as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    assert!(
        size >= 2 * EVENT_RCVBUF,
        "SO_RCVBUF {size}: needs CAP_NET_ADMIN (run as root) to pass rmem_max"
    );
}

/// The queue of netlink events owes the loop an overrun once full, and delivers it as soon as a
/// slot frees, even if no event comes after (the queue this replaced said it only before the
/// next event that fit, so a burst's last dropped events went unseen on a quiet node).
#[tokio::test]
async fn a_full_event_queue_drops_and_says_overrun_in_the_next_free_slot() {
    let (input, events) = futures::channel::mpsc::unbounded();
    let (tx, mut rx) = mpsc::channel(2);
    let overflows = crate::queues::Overflows::new()
        .unwrap()
        .of(crate::queues::Queue::NetlinkEvents);
    tokio::spawn(crate::queues::forward_or_resync(
        events,
        tx,
        || NetEvent::Overrun,
        overflows.clone(),
    ));
    let link = |ifindex| NetEvent::LinkGone { ifindex };
    for ifindex in 1..=3 {
        input.unbounded_send(link(ifindex)).unwrap();
    }
    for _ in 0..100_000 {
        if overflows.get() == 1 {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(overflows.get(), 1, "the third event found the queue full");
    assert_eq!(rx.recv().await, Some(link(1)));
    assert_eq!(rx.recv().await, Some(link(2)));
    assert_eq!(rx.recv().await, Some(NetEvent::Overrun));
    input.unbounded_send(link(4)).unwrap();
    assert_eq!(rx.recv().await, Some(link(4)));
    assert_eq!(overflows.get(), 1);
}
