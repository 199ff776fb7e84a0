//! The node's view of the L2 neighbourhood, through an rtnetlink socket of the worker's own:
//! its addresses (never flushed), its links and their bridge masters, its neighbour entries
//! (deleted so that the node resolves a reused address again) and the bridges' forwarding
//! databases (where a holder's MAC is learned).

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
};

use netlink_packet_route::{
    address::{AddressAttribute, AddressMessage},
    link::{LinkAttribute, LinkMessage},
    neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
    AddressFamily, RouteNetlinkMessage,
};
use netlink_sys::protocols::NETLINK_ROUTE;
use thiserror::Error;

use super::{
    link_query::LinkQuery,
    socket::{NlSocket, SocketError},
};

/// The entry was gone by the time its deletion arrived.
const ENOENT: i32 = 2;

#[derive(Debug, Error)]
pub enum NeighbourError {
    #[error("rtnetlink: {0}")]
    Socket(#[from] SocketError),
    #[error(
        "deleting the neighbour entry of {addr} on if{ifindex}: {}",
        std::io::Error::from_raw_os_error(*errno)
    )]
    Delete {
        addr: IpAddr,
        ifindex: u32,
        errno: i32,
    },
}

/// One link of the node: what announcing needs of it, its bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub ifindex: u32,
    /// The bridge it is a port of.
    pub master: Option<u32>,
}

/// A PERMANENT neighbour entry for a reused address that does not point at its new holder: a
/// CNI's, left alone and reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermanentEntry {
    pub ifindex: u32,
    pub mac: Option<[u8; 6]>,
}

/// One of the node's neighbour entries: (ifindex, state, MAC).
pub type NeighbourEntry = (u32, NeighbourState, Option<[u8; 6]>);

/// What deleting an address's neighbour entries did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NeighbourFlush {
    pub deleted: u64,
    pub permanent: Vec<PermanentEntry>,
}

pub struct Neighbours {
    socket: NlSocket,
}

fn link_of(message: LinkMessage) -> Link {
    let master = message
        .attributes
        .into_iter()
        .find_map(|attribute| match attribute {
            LinkAttribute::Controller(master) => Some(master),
            _ => None,
        });
    Link {
        ifindex: message.header.index,
        master,
    }
}

fn mac_of(bytes: &[u8]) -> Option<[u8; 6]> {
    bytes.try_into().ok()
}

impl Neighbours {
    pub fn open() -> Result<Self, NeighbourError> {
        Ok(Self {
            socket: NlSocket::open(NETLINK_ROUTE)?,
        })
    }

    /// Every address configured on the node's interfaces.
    pub fn node_addresses(&mut self) -> Result<BTreeSet<IpAddr>, NeighbourError> {
        let mut addrs = BTreeSet::new();
        let request = RouteNetlinkMessage::GetAddress(AddressMessage::default());
        self.socket.dump(request, |message| {
            if let RouteNetlinkMessage::NewAddress(message) = message {
                for attribute in message.attributes {
                    if let AddressAttribute::Address(a) | AddressAttribute::Local(a) = attribute {
                        addrs.insert(a.to_canonical());
                    }
                }
            }
        })?;
        Ok(addrs)
    }

    /// Link `ifindex` with its bridge master: one request, whatever the number of the node's
    /// links, its answer read for the master alone (see [`LinkQuery`]); `None` when it is gone.
    pub fn link(&mut self, ifindex: u32) -> Result<Option<Link>, NeighbourError> {
        Ok(match self.socket.get(LinkQuery::Get(ifindex))? {
            Some(LinkQuery::Answer(link)) => Some(link),
            _ => None,
        })
    }

    /// The ports of bridge `bridge`: the kernel's dump filtered by master (`IFLA_MASTER`, as
    /// `ip link show master` asks), checked here too, so a kernel that ignored the filter costs
    /// time, never a wrong port.
    pub fn ports_of(&mut self, bridge: u32) -> Result<Vec<Link>, NeighbourError> {
        let mut request = LinkMessage::default();
        request.attributes.push(LinkAttribute::Controller(bridge));
        let mut ports = Vec::new();
        self.socket
            .dump(RouteNetlinkMessage::GetLink(request), |message| {
                if let RouteNetlinkMessage::NewLink(message) = message {
                    let link = link_of(message);
                    if link.master == Some(bridge) {
                        ports.push(link);
                    }
                }
            })?;
        Ok(ports)
    }

    /// The MACs the bridge learned behind `port` (its forwarding database, without the port's
    /// own permanent entries).
    pub fn learned_macs(&mut self, port: u32) -> Result<Vec<[u8; 6]>, NeighbourError> {
        let mut request = NeighbourMessage::default();
        request.header.family = AddressFamily::Bridge;
        let mut macs = Vec::new();
        self.socket
            .dump(RouteNetlinkMessage::GetNeighbour(request), |message| {
                let RouteNetlinkMessage::NewNeighbour(message) = message else {
                    return;
                };
                if message.header.ifindex != port
                    || message.header.state == NeighbourState::Permanent
                {
                    return;
                }
                for attribute in message.attributes {
                    if let NeighbourAttribute::LinkLayerAddress(mac) = attribute {
                        macs.extend(mac_of(&mac));
                    }
                }
            })?;
        Ok(macs)
    }

    /// The node's neighbour entries of each of `addrs`, on every interface: one dump per
    /// family for a whole batch of addresses, not one per address (the table holds an entry per
    /// peer of every interface, and a burst of claims would read it once per claim).
    pub fn entries_of(
        &mut self,
        addrs: &BTreeSet<IpAddr>,
    ) -> Result<HashMap<IpAddr, Vec<NeighbourEntry>>, NeighbourError> {
        let mut found: HashMap<IpAddr, Vec<NeighbourEntry>> = HashMap::new();
        for family in [AddressFamily::Inet, AddressFamily::Inet6] {
            let wanted = |a: &IpAddr| match a {
                IpAddr::V4(_) => family == AddressFamily::Inet,
                IpAddr::V6(_) => family == AddressFamily::Inet6,
            };
            if !addrs.iter().any(wanted) {
                continue;
            }
            let mut request = NeighbourMessage::default();
            request.header.family = family;
            self.socket
                .dump(RouteNetlinkMessage::GetNeighbour(request), |message| {
                    let RouteNetlinkMessage::NewNeighbour(message) = message else {
                        return;
                    };
                    let mut dst = None;
                    let mut mac = None;
                    for attribute in &message.attributes {
                        match attribute {
                            NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                                dst = Some(IpAddr::V4(*a))
                            }
                            NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                                dst = Some(IpAddr::V6(*a).to_canonical())
                            }
                            NeighbourAttribute::LinkLayerAddress(bytes) => mac = mac_of(bytes),
                            _ => {}
                        }
                    }
                    if let Some(dst) = dst.filter(|d| addrs.contains(d)) {
                        found.entry(dst).or_default().push((
                            message.header.ifindex,
                            message.header.state,
                            mac,
                        ));
                    }
                })?;
        }
        Ok(found)
    }

    /// Deletes the node's non-permanent neighbour entries for `addr` on every interface, so
    /// that the node resolves it again; reports the permanent ones that do not point at the new
    /// holder's `holder_mac` (none when there is no new holder or its MAC is unknown), which
    /// belong to a CNI and stay.
    /// `entries` are the address's entries as [`Neighbours::entries_of`] found them.
    pub fn flush(
        &mut self,
        addr: IpAddr,
        entries: &[NeighbourEntry],
        holder_mac: Option<[u8; 6]>,
    ) -> Result<NeighbourFlush, NeighbourError> {
        let mut result = NeighbourFlush::default();
        let mut deletions = Vec::new();
        for &(ifindex, state, mac) in entries {
            match state {
                NeighbourState::Permanent | NeighbourState::Noarp => {
                    if holder_mac.is_some_and(|h| mac != Some(h)) {
                        result.permanent.push(PermanentEntry { ifindex, mac });
                    }
                }
                _ => deletions.push(ifindex),
            }
        }
        let requests: Vec<RouteNetlinkMessage> = deletions
            .iter()
            .map(|ifindex| {
                let mut message = NeighbourMessage::default();
                message.header.family = family(addr);
                message.header.ifindex = *ifindex;
                message
                    .attributes
                    .push(NeighbourAttribute::Destination(match addr {
                        IpAddr::V4(a) => NeighbourAddress::Inet(a),
                        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
                    }));
                RouteNetlinkMessage::DelNeighbour(message)
            })
            .collect();
        for (ifindex, outcome) in deletions.iter().zip(self.socket.acked(&requests)?) {
            match outcome {
                Ok(()) => result.deleted += 1,
                Err(ENOENT) => {}
                Err(errno) => {
                    return Err(NeighbourError::Delete {
                        addr,
                        ifindex: *ifindex,
                        errno,
                    })
                }
            }
        }
        Ok(result)
    }
}

fn family(addr: IpAddr) -> AddressFamily {
    match addr {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}
