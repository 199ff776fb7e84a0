//! What the kernel's routing tables say about workloads: links, per-pod host routes and
//! neighbours, from a dump and then from the rtnetlink multicast groups, IPv4 and IPv6.
//!
//! This module only observes and translates; deciding what an event means for an address is
//! the tracker's job. Message translation is pure so it is unit tested without a kernel.

mod indexed;
mod messages;
mod state;

use std::net::IpAddr;

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::AddressFamily;
use prometheus::IntCounter;
use rtnetlink::{
    packet_core::NetlinkPayload, Handle, IpVersion, MulticastGroup, RouteMessageBuilder,
};
use thiserror::Error;
use tokio::sync::mpsc;

#[cfg(test)]
pub use indexed::full_scans;
use messages::event_of;
pub use messages::{address_event, link_event, neighbour_event, route_event};
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
pub(super) const RT_TABLE_MAIN: u32 = 254;

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
    /// Events were lost (the socket overran, or the queue to the owner loop was full): the
    /// state must be rebuilt from a fresh dump.
    Overrun,
}

/// An Ethernet address.
pub type Mac = [u8; 6];

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
/// loop resyncs from a dump instead of memory growing without bound (counted in
/// `ipq_queue_overflows_total{queue="netlink_events"}`). 64 Ki events (a few MB) hold the
/// 48k-route bursts seen when a node fills up.
const EVENT_QUEUE: usize = 64 * 1024;

/// Subscribes to link, route and neighbour changes. Events arrive on the returned channel in
/// kernel order; `NetEvent::Overrun` means some were lost (by the socket or by a full queue,
/// each of the latter counted in `overflows`).
pub fn subscribe(overflows: IntCounter) -> Result<mpsc::Receiver<NetEvent>, NetlinkError> {
    let (connection, _handle, messages) = rtnetlink::new_multicast_connection(&[
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
    let events = messages.filter_map(|(message, _)| {
        futures::future::ready(match message.payload {
            NetlinkPayload::InnerMessage(inner) => event_of(inner),
            NetlinkPayload::Overrun(_) => Some(NetEvent::Overrun),
            _ => None,
        })
    });
    tokio::spawn(async move {
        crate::queues::forward_or_resync(events, tx, || NetEvent::Overrun, overflows).await;
    });
    Ok(rx)
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
