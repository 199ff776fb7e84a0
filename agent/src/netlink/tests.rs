use std::net::{Ipv4Addr, Ipv6Addr};

use netlink_packet_route::route::{RouteHeader, RouteProtocol, RouteScope};

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
    let mut before = NetState::default();
    before.links.insert(3, "veth-a".into());
    before.links.insert(4, "veth-b".into());
    before.host_routes.insert((a, 3));
    let mut after = NetState::default();
    after.links.insert(4, "veth-b".into());
    after.links.insert(5, "veth-c".into());
    after.host_routes.insert((b, 5));
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
    });
    assert!(state.apply(&NetEvent::LinkGone { ifindex: 3 }));
    assert_eq!(state, NetState::default());
}
