//! What the kernel's routing tables say about workloads: links, per-pod host routes and
//! neighbours, from a dump and then from the rtnetlink multicast groups, IPv4 and IPv6.
//!
//! This module only observes and translates; deciding what an event means for an address is
//! the tracker's job. Message translation is pure so it is unit tested without a kernel.

mod indexed;
mod state;

use std::net::IpAddr;

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::{
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType},
    AddressFamily, RouteNetlinkMessage,
};
use rtnetlink::{
    packet_core::NetlinkPayload, Handle, IpVersion, MulticastGroup, RouteMessageBuilder,
};
use thiserror::Error;
use tokio::sync::mpsc;

use crate::addr_class::is_workload_address;

#[cfg(test)]
pub use indexed::full_scans;
pub use state::NetState;

#[derive(Debug, Error)]
pub enum NetlinkError {
    #[error("opening a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("netlink dump of {what}: {source}")]
    Dump {
        what: &'static str,
        source: rtnetlink::Error,
    },
}

/// Routing table `main`: where CNIs put per-pod host routes.
const RT_TABLE_MAIN: u32 = 254;

/// One change the kernel reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetEvent {
    /// A link appeared or changed (a rename included).
    Link {
        ifindex: u32,
        name: String,
    },
    /// A link was deleted (or left this namespace, which is the same for its holder).
    LinkGone {
        ifindex: u32,
    },
    /// A host route (/32, /128) through an interface, with no gateway: a pod's address as the
    /// ptp plugin and routed CNIs install it.
    HostRoute {
        addr: IpAddr,
        ifindex: u32,
    },
    HostRouteGone {
        addr: IpAddr,
        ifindex: u32,
    },
    /// An address configured on one of the node's own interfaces: the node holds it, so no
    /// workload ever does (the ptp plugin puts its gateway on every host-side veth).
    NodeAddress {
        addr: IpAddr,
        ifindex: u32,
    },
    NodeAddressGone {
        addr: IpAddr,
        ifindex: u32,
    },
    /// A resolved neighbour on an interface, with its link-layer address.
    Neighbour {
        addr: IpAddr,
        ifindex: u32,
        mac: Option<Mac>,
    },
    NeighbourGone {
        addr: IpAddr,
        ifindex: u32,
    },
    /// A MAC address a bridge learned behind one of its ports (the bridge plugin's pods).
    Fdb {
        mac: Mac,
        port: u32,
    },
    FdbGone {
        mac: Mac,
        port: u32,
    },
    /// Events were lost (the socket overran): the state must be rebuilt from a fresh dump.
    Overrun,
}

/// An Ethernet address.
pub type Mac = [u8; 6];

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

fn event_of(message: RouteNetlinkMessage) -> Option<NetEvent> {
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

/// Dumps links, the node's addresses, host routes (IPv4 and IPv6) and neighbours, on a
/// connection of its own that closes with it: the connection's response queue grows to hold
/// a whole dump (11 MB for 64k routes) and never shrinks, so a connection kept for the next
/// dump would keep that memory for the agent's lifetime.
pub async fn dump() -> Result<NetState, NetlinkError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Socket)?;
    // Ends once `handle` is dropped (no requester left) at the end of this function.
    tokio::spawn(connection);
    dump_on(&handle).await
}

async fn dump_on(handle: &Handle) -> Result<NetState, NetlinkError> {
    let mut state = NetState::default();
    let mut links = handle.link().get().execute();
    while let Some(msg) = links
        .try_next()
        .await
        .map_err(|source| NetlinkError::Dump {
            what: "links",
            source,
        })?
    {
        if let Some(event) = link_event(&msg, true) {
            state.apply(&event);
        }
    }
    let mut addresses = handle.address().get().execute();
    while let Some(msg) = addresses
        .try_next()
        .await
        .map_err(|source| NetlinkError::Dump {
            what: "addresses",
            source,
        })?
    {
        if let Some(event) = address_event(&msg, true) {
            state.apply(&event);
        }
    }
    for version in [IpVersion::V4, IpVersion::V6] {
        let request = match version {
            IpVersion::V4 => RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            IpVersion::V6 => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let mut routes = handle.route().get(request).execute();
        while let Some(msg) = routes
            .try_next()
            .await
            .map_err(|source| NetlinkError::Dump {
                what: "routes",
                source,
            })?
        {
            if let Some(event) = route_event(&msg, true) {
                state.apply(&event);
            }
        }
    }
    // IPv4 and IPv6 neighbours (AF_UNSPEC), then the bridges' forwarding databases.
    for family in [AddressFamily::Unspec, AddressFamily::Bridge] {
        let mut neighbours = handle
            .neighbours()
            .get()
            .set_address_family(family)
            .execute();
        while let Some(msg) = neighbours
            .try_next()
            .await
            .map_err(|source| NetlinkError::Dump {
                what: "neighbours",
                source,
            })?
        {
            if let Some(event) = neighbour_event(&msg, true) {
                state.apply(&event);
            }
        }
    }
    Ok(state)
}

/// How many events wait for the owner loop at most. A queue that fills (a loop slower than a
/// burst) drops events exactly as an overrun socket does, and says so the same way, so the
/// loop resyncs from a dump instead of memory growing without bound. 64 Ki events (a few MB)
/// hold the 48k-route bursts seen when a node fills up.
const EVENT_QUEUE: usize = 64 * 1024;

/// Subscribes to link, route and neighbour changes. Events arrive on the returned channel in
/// kernel order; `NetEvent::Overrun` means some were lost (by the socket or by a full queue).
pub fn subscribe() -> Result<mpsc::Receiver<NetEvent>, NetlinkError> {
    let (connection, _handle, mut messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Route,
        MulticastGroup::Ipv6Route,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
        MulticastGroup::Neigh,
    ])
    .map_err(NetlinkError::Socket)?;
    let mut connection = connection;
    widen_receive_buffer(netlink_sys::AsyncSocket::socket_mut(
        connection.socket_mut(),
    ));
    tokio::spawn(connection);
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    tokio::spawn(async move {
        let mut queue = BoundedQueue::new(tx);
        while let Some((message, _)) = messages.next().await {
            let event = match message.payload {
                NetlinkPayload::InnerMessage(inner) => event_of(inner),
                NetlinkPayload::Overrun(_) => Some(NetEvent::Overrun),
                _ => None,
            };
            if let Some(event) = event {
                if queue.push(event).is_err() {
                    break;
                }
            }
        }
    });
    Ok(rx)
}

/// The loop's side is gone.
struct Closed;

/// The sending side of the event queue: an event that does not fit is dropped, and the next
/// one that fits is preceded by `NetEvent::Overrun`.
struct BoundedQueue {
    tx: mpsc::Sender<NetEvent>,
    lost: bool,
}

impl BoundedQueue {
    fn new(tx: mpsc::Sender<NetEvent>) -> Self {
        Self { tx, lost: false }
    }

    fn push(&mut self, event: NetEvent) -> Result<(), Closed> {
        use mpsc::error::TrySendError;
        if self.lost {
            match self.tx.try_send(NetEvent::Overrun) {
                Ok(()) => self.lost = false,
                Err(TrySendError::Full(_)) => return Ok(()),
                Err(TrySendError::Closed(_)) => return Err(Closed),
            }
        }
        match self.tx.try_send(event) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.lost = true;
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(Closed),
        }
    }
}

/// The event socket's receive buffer. A burst of 48k host routes (a node filling up, a
/// CNI re-creating its routes) overran the default 208 KiB and forced a full resync, which
/// at 64k addresses costs far more than the memory: the kernel only charges what is queued.
const EVENT_RCVBUF: libc::c_int = 32 * 1024 * 1024;

/// Sets [`EVENT_RCVBUF`] past `net.core.rmem_max` (SO_RCVBUFFORCE, CAP_NET_ADMIN, which the
/// agent has), falling back to what SO_RCVBUF allows. Best effort: a smaller buffer only
/// means an overrun, which the agent detects and answers with a resync.
pub(crate) fn widen_receive_buffer(socket: &netlink_sys::Socket) {
    use std::os::fd::AsRawFd;
    let fd = socket.as_raw_fd();
    let size = EVENT_RCVBUF;
    let set = |option| {
        // SAFETY: `fd` is the open netlink socket `socket` owns for this call's duration, and
        // the option value is a live c_int of the length given.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    if set(libc::SO_RCVBUFFORCE) != 0 && set(libc::SO_RCVBUF) != 0 {
        log::warn!(
            "netlink events: the receive buffer keeps its default size ({}); a burst of \
             route changes may overrun it and cost a full resync",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
