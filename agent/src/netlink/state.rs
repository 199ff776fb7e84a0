//! What the tracker knows of the node's links, host routes, addresses, neighbours and bridge
//! forwarding databases, kept by applying events.
//!
//! Every event costs O(log n) in what is stored, or O(k log n) for the k entries it removes:
//! each (key, interface) collection is indexed by interface, so a link going away removes its
//! own entries only, and neighbours are indexed by MAC, so an FDB entry finds the addresses
//! behind it without scanning every neighbour. Only [`NetState::diff`] (a resync after lost
//! events) and the rescan after the pending-claim queue overflowed walk everything.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::{
    indexed::{ByInterface, InterfaceSet},
    Mac, NetEvent,
};

/// Everything the tracker needs from one dump, and then from the events.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetState {
    links: BTreeMap<u32, String>,
    /// Workload host routes, as many as there are pods: keyed interface first, so that they
    /// need no second index (only ever looked up by (address, interface) or interface).
    host_routes: InterfaceSet<IpAddr>,
    /// Addresses configured on the node's interfaces: (address, interface).
    node_addresses: ByInterface<IpAddr, ()>,
    /// Resolved neighbours: (address, interface) → link-layer address.
    neighbours: ByInterface<IpAddr, Option<Mac>>,
    /// MAC → the neighbours resolved to it: the FDB's way back to addresses.
    neighbours_by_mac: BTreeMap<Mac, BTreeSet<(IpAddr, u32)>>,
    /// Learned (not local) bridge FDB entries: (MAC, port), at most one port per MAC.
    fdb: ByInterface<Mac, ()>,
}

impl NetState {
    /// The name of link `ifindex`, if it exists.
    pub fn link_name(&self, ifindex: u32) -> Option<&str> {
        self.links.get(&ifindex).map(String::as_str)
    }

    pub fn has_link(&self, ifindex: u32) -> bool {
        self.links.contains_key(&ifindex)
    }

    pub fn has_host_route(&self, addr: IpAddr, ifindex: u32) -> bool {
        self.host_routes.contains(addr, ifindex)
    }

    /// Every host route: a full scan, for the rare rescan after the pending queue overflowed.
    pub fn host_routes(&self) -> impl Iterator<Item = (IpAddr, u32)> + '_ {
        self.host_routes.iter()
    }

    /// Whether the node itself holds `addr` (configured on any of its interfaces).
    pub fn is_node_address(&self, addr: IpAddr) -> bool {
        self.node_addresses.of_key(addr).next().is_some()
    }

    /// The bridge port behind which `addr` lives: its neighbour entry's MAC, looked up in the
    /// bridge's forwarding database. This is how holders are found on bridge-plugin nodes,
    /// where pod addresses have no host routes.
    pub fn port_of(&self, addr: IpAddr) -> Option<u32> {
        self.neighbours
            .of_key(addr)
            .find_map(|(_, mac)| self.fdb_port(mac.as_ref()?))
    }

    /// The addresses whose neighbour entries resolve to `mac` (each once, in order).
    pub fn addresses_with_mac(&self, mac: &Mac) -> Vec<IpAddr> {
        let mut addrs: Vec<IpAddr> = self
            .neighbours_by_mac
            .get(mac)
            .into_iter()
            .flatten()
            .map(|(addr, _)| *addr)
            .collect();
        addrs.dedup();
        addrs
    }

    fn fdb_port(&self, mac: &Mac) -> Option<u32> {
        self.fdb.of_key(*mac).next().map(|(port, _)| port)
    }

    /// Applies one event; returns whether it changed anything.
    pub fn apply(&mut self, event: &NetEvent) -> bool {
        match event {
            NetEvent::Link { ifindex, name } => {
                self.links.insert(*ifindex, name.clone()).as_ref() != Some(name)
            }
            NetEvent::LinkGone { ifindex } => {
                let removed = self.links.remove(ifindex).is_some();
                self.host_routes.remove_interface(*ifindex);
                self.node_addresses.remove_interface(*ifindex);
                for (addr, mac) in self.neighbours.remove_interface(*ifindex) {
                    self.unindex_mac(addr, *ifindex, mac);
                }
                self.fdb.remove_interface(*ifindex);
                removed
            }
            NetEvent::HostRoute { addr, ifindex } => self.host_routes.insert(*addr, *ifindex),
            NetEvent::HostRouteGone { addr, ifindex } => self.host_routes.remove(*addr, *ifindex),
            NetEvent::NodeAddress { addr, ifindex } => {
                self.node_addresses.insert(*addr, *ifindex, ()).is_none()
            }
            NetEvent::NodeAddressGone { addr, ifindex } => {
                self.node_addresses.remove(*addr, *ifindex).is_some()
            }
            NetEvent::Neighbour { addr, ifindex, mac } => {
                let old = self.neighbours.insert(*addr, *ifindex, *mac);
                if let Some(old) = old {
                    self.unindex_mac(*addr, *ifindex, old);
                }
                if let Some(mac) = mac {
                    self.neighbours_by_mac
                        .entry(*mac)
                        .or_default()
                        .insert((*addr, *ifindex));
                }
                old != Some(*mac)
            }
            NetEvent::NeighbourGone { addr, ifindex } => {
                match self.neighbours.remove(*addr, *ifindex) {
                    Some(mac) => {
                        self.unindex_mac(*addr, *ifindex, mac);
                        true
                    }
                    None => false,
                }
            }
            NetEvent::Fdb { mac, port } => {
                if self.fdb.contains(*mac, *port) {
                    return false;
                }
                // A MAC is behind one port: the one it was learned on last.
                let moved_from: Vec<u32> = self.fdb.of_key(*mac).map(|(p, _)| p).collect();
                for old in moved_from {
                    self.fdb.remove(*mac, old);
                }
                self.fdb.insert(*mac, *port, ());
                true
            }
            NetEvent::FdbGone { mac, port } => self.fdb.remove(*mac, *port).is_some(),
            NetEvent::Overrun => false,
        }
    }

    fn unindex_mac(&mut self, addr: IpAddr, ifindex: u32, mac: Option<Mac>) {
        let Some(mac) = mac else {
            return;
        };
        if let Some(entries) = self.neighbours_by_mac.get_mut(&mac) {
            entries.remove(&(addr, ifindex));
            if entries.is_empty() {
                self.neighbours_by_mac.remove(&mac);
            }
        }
    }

    /// The events that turn `self` into `next`: what a resync reports after lost events.
    /// Removals come first, so that a link recreated under the same index (or renamed) is seen
    /// as new; since its `LinkGone` takes its entries with it, the entries `next` has on it are
    /// all reported again after its `Link`. The node's own addresses come before the routes, so
    /// that none is taken for a workload's. O(n): a resync compares everything, once per
    /// overrun.
    pub fn diff(&self, next: &NetState) -> Vec<NetEvent> {
        let mut events = Vec::new();
        for (addr, ifindex, _) in self.node_addresses.iter() {
            if !next.node_addresses.contains(addr, ifindex) {
                events.push(NetEvent::NodeAddressGone { addr, ifindex });
            }
        }
        for (addr, ifindex) in self.host_routes.iter() {
            if !next.host_routes.contains(addr, ifindex) {
                events.push(NetEvent::HostRouteGone { addr, ifindex });
            }
        }
        for (addr, ifindex, _) in self.neighbours.iter() {
            if !next.neighbours.contains(addr, ifindex) {
                events.push(NetEvent::NeighbourGone { addr, ifindex });
            }
        }
        for (mac, port, _) in self.fdb.iter() {
            if !next.fdb.contains(mac, port) {
                events.push(NetEvent::FdbGone { mac, port });
            }
        }
        let mut gone = BTreeSet::new();
        for (ifindex, name) in &self.links {
            if next.links.get(ifindex) != Some(name) {
                gone.insert(*ifindex);
                events.push(NetEvent::LinkGone { ifindex: *ifindex });
            }
        }
        for (ifindex, name) in &next.links {
            if self.links.get(ifindex) != Some(name) {
                events.push(NetEvent::Link {
                    ifindex: *ifindex,
                    name: name.clone(),
                });
            }
        }
        // What `self` still has once the links in `gone` took their entries with them.
        let kept = |ifindex: u32, present: bool| present && !gone.contains(&ifindex);
        for (addr, ifindex, _) in next.node_addresses.iter() {
            if !kept(ifindex, self.node_addresses.contains(addr, ifindex)) {
                events.push(NetEvent::NodeAddress { addr, ifindex });
            }
        }
        for (addr, ifindex) in next.host_routes.iter() {
            if !kept(ifindex, self.host_routes.contains(addr, ifindex)) {
                events.push(NetEvent::HostRoute { addr, ifindex });
            }
        }
        for (mac, port, _) in next.fdb.iter() {
            if !kept(port, self.fdb.contains(mac, port)) {
                events.push(NetEvent::Fdb { mac, port });
            }
        }
        for (addr, ifindex, &mac) in next.neighbours.iter() {
            if !kept(ifindex, self.neighbours.get(addr, ifindex) == Some(&mac)) {
                events.push(NetEvent::Neighbour { addr, ifindex, mac });
            }
        }
        events
    }

    /// Whether every index lists exactly what its entries say; for tests.
    #[cfg(test)]
    pub fn check_indexes(&self) -> Result<(), NetStateViolation> {
        self.node_addresses.check_index()?;
        self.neighbours.check_index()?;
        self.fdb.check_index()?;
        let mut by_mac: BTreeMap<Mac, BTreeSet<(IpAddr, u32)>> = BTreeMap::new();
        for (addr, ifindex, mac) in self.neighbours.iter() {
            if let Some(mac) = mac {
                by_mac.entry(*mac).or_default().insert((addr, ifindex));
            }
        }
        crate::invariant::same_index("MAC index", &self.neighbours_by_mac, &by_mac)?;
        let mut macs = BTreeSet::new();
        for (mac, _, _) in self.fdb.iter() {
            if !macs.insert(mac) {
                return Err(NetStateViolation::MacBehindTwoPorts { mac });
            }
        }
        Ok(())
    }

    /// How many entries the state holds in all; for tests.
    #[cfg(test)]
    pub fn entry_count(&self) -> usize {
        self.links.len()
            + self.host_routes.len()
            + self.node_addresses.len()
            + self.neighbours.len()
            + self.fdb.len()
    }
}

/// What [`NetState::check_indexes`] found broken; for tests.
#[cfg(test)]
#[derive(Debug, thiserror::Error)]
pub enum NetStateViolation {
    #[error(transparent)]
    Index(#[from] crate::invariant::InvariantViolation),
    /// The FDB keeps one port per MAC.
    #[error("{mac:02x?} behind two ports")]
    MacBehindTwoPorts { mac: Mac },
}
