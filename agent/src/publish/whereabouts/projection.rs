//! What the projection wants and what it holds, without I/O: the addresses the NodeQuarantine
//! lists (each wants a reservation of ipq's), the reservations ipq holds (by uid), and the
//! addresses to look at again. The task turns [`Projection::take_ops`] into API calls and
//! reports their outcome back; a test drives it directly.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use super::super::PublishedEntry;

/// whereabouts' name for `addr`'s OverlappingRangeIPReservation: `NormalizeIP` of its
/// pkg/storage/kubernetes/ipam.go (v0.9): the address as Go prints it, `:` made `-` (an IPv6
/// address ending in `::` gets a `0` first), prefixed with `<network_name>-` on a named network.
pub fn reservation_name(addr: IpAddr, network_name: &str) -> String {
    let mut text = match addr {
        // Go prints an IPv4-mapped IPv6 address as the IPv4 address.
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => v6.to_string(),
        },
        IpAddr::V4(v4) => v4.to_string(),
    };
    if text.ends_with(':') {
        text.push('0');
    }
    let normalized = text.replace(':', "-");
    if network_name.is_empty() {
        normalized
    } else {
        format!("{network_name}-{normalized}")
    }
}

/// The `namespace/name` of the pod an entry's holder belonged to, as whereabouts writes a
/// `podRef`; `None` when the CNI did not say.
pub fn holder_pod_ref(entry: &PublishedEntry) -> Option<String> {
    entry
        .holder
        .pod()
        .map(|pod| format!("{}/{}", pod.namespace, pod.name))
}

/// One API call the task is to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Make ipq's reservation of `addr` (or adopt the departed holder's own).
    Create {
        addr: IpAddr,
        holder_pod_ref: Option<String>,
    },
    /// Delete ipq's reservation of `addr`, only if it is still the one of `uid`.
    Delete { addr: IpAddr, uid: String },
}

#[derive(Default)]
pub struct Projection {
    /// Each listed address, with its holder's podRef.
    wanted: BTreeMap<IpAddr, Option<String>>,
    /// ipq's reservations, by address: their uids.
    ours: BTreeMap<IpAddr, String>,
    /// Listed addresses whose reservation names another pod.
    foreign: BTreeSet<IpAddr>,
    /// Addresses whose reservation may not be what is wanted.
    dirty: BTreeSet<IpAddr>,
}

impl Projection {
    /// `addr` as the NodeQuarantine now lists it (`None`: not listed).
    pub fn want(&mut self, addr: IpAddr, entry: Option<&PublishedEntry>) {
        match entry {
            Some(entry) => {
                let pod_ref = holder_pod_ref(entry);
                if self.wanted.insert(addr, pod_ref).is_none() {
                    self.dirty.insert(addr);
                }
            }
            None => {
                if self.wanted.remove(&addr).is_some() {
                    self.foreign.remove(&addr);
                    self.dirty.insert(addr);
                }
            }
        }
    }

    /// The calls that bring every dirty address to what is wanted; they are no longer dirty.
    pub fn take_ops(&mut self) -> Vec<Op> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .filter_map(
                |addr| match (self.wanted.get(&addr), self.ours.get(&addr)) {
                    (Some(holder_pod_ref), None) => Some(Op::Create {
                        addr,
                        holder_pod_ref: holder_pod_ref.clone(),
                    }),
                    (None, Some(uid)) => Some(Op::Delete {
                        addr,
                        uid: uid.clone(),
                    }),
                    _ => None,
                },
            )
            .collect()
    }

    /// Whether anything waits for a call.
    pub fn has_work(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// ipq holds `addr`'s reservation, of `uid` (made, adopted, or found at a relist).
    pub fn held(&mut self, addr: IpAddr, uid: String) {
        self.foreign.remove(&addr);
        self.ours.insert(addr, uid);
        // Unlisted meanwhile: it goes again.
        if !self.wanted.contains_key(&addr) {
            self.dirty.insert(addr);
        }
    }

    /// `addr`'s reservation names another pod: left alone until [`Projection::recheck_foreign`].
    pub fn held_by_another(&mut self, addr: IpAddr) {
        if self.wanted.contains_key(&addr) {
            self.foreign.insert(addr);
        }
    }

    /// ipq's reservation of `addr` is gone (deleted by ipq, or found not to be ipq's).
    pub fn released(&mut self, addr: IpAddr) {
        self.ours.remove(&addr);
        if self.wanted.contains_key(&addr) {
            self.dirty.insert(addr);
        }
    }

    /// A call for `addr` failed: it is tried again.
    pub fn failed(&mut self, addr: IpAddr) {
        self.dirty.insert(addr);
    }

    /// Someone deleted ipq's reservation of `uid`. The address it was for, when it is still
    /// listed (it is then made again).
    pub fn deleted(&mut self, uid: &str) -> Option<IpAddr> {
        let addr = self
            .ours
            .iter()
            .find_map(|(addr, held)| (held == uid).then_some(*addr))?;
        self.ours.remove(&addr);
        self.wanted.contains_key(&addr).then(|| {
            self.dirty.insert(addr);
            addr
        })
    }

    /// What a fresh list of ipq's reservations found: it replaces what was held, and every
    /// address, listed or held, is looked at again.
    pub fn relisted(&mut self, listed: impl IntoIterator<Item = (IpAddr, String)>) {
        self.ours = listed.into_iter().collect();
        self.foreign.clear();
        self.dirty.extend(self.wanted.keys().copied());
        self.dirty.extend(self.ours.keys().copied());
    }

    /// The addresses held by another pod are looked at again (it may have gone).
    pub fn recheck_foreign(&mut self) {
        self.dirty.extend(std::mem::take(&mut self.foreign));
    }

    pub fn held_count(&self) -> usize {
        self.ours.len()
    }

    pub fn foreign_count(&self) -> usize {
        self.foreign.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        publish::EntryState,
        registry::{Holder, PodRef},
    };

    fn entry(pod: &str) -> PublishedEntry {
        PublishedEntry {
            state: EntryState::Quarantined,
            since: 1,
            until: Some(2),
            holder: Holder::new(3, "veth3").with_identity(
                None,
                Some("eth0".into()),
                None,
                None,
                Some(PodRef {
                    namespace: "default".into(),
                    name: pod.into(),
                    uid: None,
                }),
            ),
        }
    }

    fn addr(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn names_are_whereabouts_normalized_ips() {
        assert_eq!(reservation_name(addr("10.88.0.10"), ""), "10.88.0.10");
        assert_eq!(
            reservation_name(addr("10.88.0.10"), "wb-net"),
            "wb-net-10.88.0.10"
        );
        assert_eq!(reservation_name(addr("fd00:10::5"), ""), "fd00-10--5");
        // Go's `net.IP.String()` ends such an address in `::`; whereabouts adds a 0.
        assert_eq!(reservation_name(addr("fd00:10::"), ""), "fd00-10--0");
        assert_eq!(reservation_name(addr("::ffff:10.0.0.1"), ""), "10.0.0.1");
    }

    #[test]
    fn a_listed_address_is_reserved_and_released_when_unlisted() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, Some(&entry("web-1")));
        assert_eq!(
            p.take_ops(),
            [Op::Create {
                addr: a,
                holder_pod_ref: Some("default/web-1".into())
            }]
        );
        p.held(a, "uid-1".into());
        assert!(p.take_ops().is_empty(), "held: nothing to do");
        // A change of the entry (fenced -> quarantined) is no new call.
        p.want(a, Some(&entry("web-1")));
        assert!(!p.has_work());
        p.want(a, None);
        assert_eq!(
            p.take_ops(),
            [Op::Delete {
                addr: a,
                uid: "uid-1".into()
            }]
        );
        p.released(a);
        assert!(p.take_ops().is_empty());
        assert_eq!(p.held_count(), 0);
    }

    #[test]
    fn a_reservation_deleted_by_someone_else_is_made_again_while_listed_only() {
        let mut p = Projection::default();
        let (a, b) = (addr("10.88.0.10"), addr("10.88.0.11"));
        p.want(a, Some(&entry("web-1")));
        p.want(b, Some(&entry("web-2")));
        p.take_ops();
        p.held(a, "uid-a".into());
        p.held(b, "uid-b".into());
        assert_eq!(p.deleted("uid-a"), Some(a));
        assert!(matches!(&p.take_ops()[..], [Op::Create { addr, .. }] if *addr == a));
        // Unlisted, then deleted by whereabouts before ipq's delete: nothing to make.
        p.want(b, None);
        assert_eq!(p.deleted("uid-b"), None);
        assert!(p.take_ops().is_empty());
        assert_eq!(p.deleted("unknown"), None);
    }

    #[test]
    fn another_pods_reservation_is_left_alone_until_rechecked() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, Some(&entry("web-1")));
        p.take_ops();
        p.held_by_another(a);
        assert_eq!(p.foreign_count(), 1);
        assert!(!p.has_work());
        p.recheck_foreign();
        assert!(matches!(&p.take_ops()[..], [Op::Create { .. }]));
        // Unlisted while held by another: forgotten, no delete (it is not ipq's).
        p.held_by_another(a);
        p.want(a, None);
        assert_eq!(p.foreign_count(), 0);
        assert!(p.take_ops().is_empty());
    }

    #[test]
    fn a_reservation_made_after_its_address_was_unlisted_goes_again() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, Some(&entry("web-1")));
        p.take_ops();
        p.want(a, None);
        p.held(a, "uid-1".into());
        assert_eq!(
            p.take_ops(),
            [Op::Delete {
                addr: a,
                uid: "uid-1".into()
            }]
        );
    }

    #[test]
    fn a_relist_takes_over_what_a_previous_run_left() {
        let mut p = Projection::default();
        let (kept, stale) = (addr("10.88.0.10"), addr("10.88.0.12"));
        p.want(kept, Some(&entry("web-1")));
        p.relisted([(kept, "uid-k".into()), (stale, "uid-s".into())]);
        assert_eq!(
            p.take_ops(),
            [Op::Delete {
                addr: stale,
                uid: "uid-s".into()
            }]
        );
        assert_eq!(p.held_count(), 2);
    }
}
