//! rtnetlink messages translated into [`NetEvent`]s: pure, so unit-tested without a kernel.
//! Only what can name a workload's address passes (host routes through an interface, the
//! node's own addresses, neighbours and forwarding-database entries); the rest is `None`.

use std::net::IpAddr;

use netlink_packet_route::{
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType},
    AddressFamily, RouteNetlinkMessage,
};

use super::{Mac, NetEvent, RT_TABLE_MAIN};
use crate::addr_class::is_workload_address;

pub fn link_event(msg: &LinkMessage, new: bool) -> Option<NetEvent> {
    let ifindex = msg.header.index;
    if !new {
        return Some(NetEvent::LinkGone { ifindex });
    }
    let name = msg.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })?;
    Some(NetEvent::Link { ifindex, name })
}

/// A host route through an interface, or `None` for any other route (prefixes, gateways,
/// other tables, local/broadcast routes, and routes the kernel made for an address of the
/// node's own, `proto kernel`: the IPv6 `/128` of an address configured on a veth is one).
pub fn route_event(msg: &RouteMessage, new: bool) -> Option<NetEvent> {
    let header = &msg.header;
    if header.protocol == RouteProtocol::Kernel {
        return None;
    }
    let full = match header.address_family {
        AddressFamily::Inet => 32,
        AddressFamily::Inet6 => 128,
        _ => return None,
    };
    if header.destination_prefix_length != full || header.kind != RouteType::Unicast {
        return None;
    }
    let mut table = u32::from(header.table);
    let mut addr = None;
    let mut ifindex = None;
    for attribute in &msg.attributes {
        match attribute {
            RouteAttribute::Destination(RouteAddress::Inet(a)) => addr = Some(IpAddr::V4(*a)),
            RouteAttribute::Destination(RouteAddress::Inet6(a)) => addr = Some(IpAddr::V6(*a)),
            RouteAttribute::Oif(i) => ifindex = Some(*i),
            RouteAttribute::Table(t) => table = *t,
            // Through a gateway: the address lives behind another machine, not on a local link.
            RouteAttribute::Gateway(_) | RouteAttribute::Via(_) | RouteAttribute::MultiPath(_) => {
                return None
            }
            _ => {}
        }
    }
    if table != RT_TABLE_MAIN {
        return None;
    }
    let (addr, ifindex) = (addr?, ifindex?);
    if !is_workload_address(addr) {
        return None;
    }
    Some(if new {
        NetEvent::HostRoute { addr, ifindex }
    } else {
        NetEvent::HostRouteGone { addr, ifindex }
    })
}

/// An address configured on one of the node's interfaces.
pub fn address_event(msg: &AddressMessage, new: bool) -> Option<NetEvent> {
    let ifindex = msg.header.index;
    // IFA_LOCAL is the interface's own address on point-to-point links, where IFA_ADDRESS is
    // the peer's; elsewhere the two are the same.
    let local = msg.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(addr) => Some(*addr),
        _ => None,
    });
    let addr = local.or_else(|| {
        msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(addr) => Some(*addr),
            _ => None,
        })
    })?;
    Some(if new {
        NetEvent::NodeAddress { addr, ifindex }
    } else {
        NetEvent::NodeAddressGone { addr, ifindex }
    })
}

pub fn neighbour_event(msg: &NeighbourMessage, new: bool) -> Option<NetEvent> {
    let ifindex = msg.header.ifindex;
    let mac = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(bytes) => <Mac>::try_from(bytes.as_slice()).ok(),
        _ => None,
    });
    if msg.header.family == AddressFamily::Bridge {
        // The bridge's own (local, permanent) entries are its ports' addresses, not pods.
        if msg.header.state == NeighbourState::Permanent {
            return None;
        }
        let mac = mac?;
        return Some(if new {
            NetEvent::Fdb { mac, port: ifindex }
        } else {
            NetEvent::FdbGone { mac, port: ifindex }
        });
    }
    let addr = msg.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some(IpAddr::V4(*a)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
        _ => None,
    })?;
    if !is_workload_address(addr) {
        return None;
    }
    let resolved = matches!(
        msg.header.state,
        NeighbourState::Reachable
            | NeighbourState::Stale
            | NeighbourState::Delay
            | NeighbourState::Probe
            | NeighbourState::Permanent
            | NeighbourState::Noarp
    );
    Some(if new && resolved {
        NetEvent::Neighbour { addr, ifindex, mac }
    } else {
        NetEvent::NeighbourGone { addr, ifindex }
    })
}

pub(super) fn event_of(message: RouteNetlinkMessage) -> Option<NetEvent> {
    match message {
        RouteNetlinkMessage::NewLink(m) => link_event(&m, true),
        RouteNetlinkMessage::DelLink(m) => link_event(&m, false),
        RouteNetlinkMessage::NewRoute(m) => route_event(&m, true),
        RouteNetlinkMessage::DelRoute(m) => route_event(&m, false),
        RouteNetlinkMessage::NewAddress(m) => address_event(&m, true),
        RouteNetlinkMessage::DelAddress(m) => address_event(&m, false),
        RouteNetlinkMessage::NewNeighbour(m) => neighbour_event(&m, true),
        RouteNetlinkMessage::DelNeighbour(m) => neighbour_event(&m, false),
        _ => None,
    }
}
