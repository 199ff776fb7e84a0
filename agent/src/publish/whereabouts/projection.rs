//! What the projection wants and what it holds, without I/O: the addresses the NodeQuarantine
//! lists (each wants a reservation of ipq's), the reservations ipq holds (by uid), and the
//! addresses to look at again. The task turns [`Projection::take_ops`] into API calls and
//! reports their outcome back; a test drives it directly.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use super::super::{EntryState, PublishedEntry};
use crate::registry::{AddrRecord, AddrStatus, Holder, MonoNs};

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

/// The `namespace/name` of `holder`'s pod, as whereabouts writes a `podRef`; `None` when the
/// CNI did not say.
pub fn pod_ref(holder: &Holder) -> Option<String> {
    holder
        .pod()
        .map(|pod| format!("{}/{}", pod.namespace, pod.name))
}

/// What the projection wants for one address the registry holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// The NodeQuarantine lists it: a reservation must keep it from the next pod.
    pub listed: bool,
    /// The pod of its live holder (Active or Draining), else of the holder that went: the
    /// podRef of the reservation whereabouts made for it.
    pub pod_ref: Option<String>,
    /// That pod's uid, when the CNI said it: a pod of the same name made again (a StatefulSet's)
    /// is another pod.
    pub pod_uid: Option<String>,
    /// The live holder (Active or Draining) of a pod the CNI named; `None` for a quarantine.
    /// What an orphaned entry names, once whereabouts frees its pod's address under it.
    pub live_holder: Option<Holder>,
}

impl Want {
    /// What `record` asks for; `None` when nothing: no listed entry, and no pod whose
    /// reservation could be freed under a live holder.
    pub fn of(record: &AddrRecord) -> Option<Self> {
        let listed = PublishedEntry::of(record).is_some();
        let (holder, live) = match &record.status {
            AddrStatus::Active { holder, .. } | AddrStatus::Draining { holder, .. } => {
                (holder, true)
            }
            AddrStatus::Quarantined { previous, .. } => (previous, false),
        };
        let pod_ref = pod_ref(holder);
        let pod_uid = holder.pod().and_then(|pod| pod.uid.clone());
        let live_holder = (live && pod_ref.is_some()).then(|| holder.clone());
        (listed || pod_ref.is_some()).then_some(Self {
            listed,
            pod_ref,
            pod_uid,
            live_holder,
        })
    }
}

/// One API call the task is to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Make sure a reservation ipq watches keeps `addr`: ipq's own, or the one whereabouts made
    /// for `pod_ref` (labelled, so that its deletion is seen).
    Reserve {
        addr: IpAddr,
        pod_ref: Option<String>,
    },
    /// Label the reservation whereabouts made for `pod_ref`, the live holder, if there is one:
    /// whereabouts may free it (a force delete) while the holder still runs. If there is none
    /// and the pod is gone from the API (force-deleted while this agent was not watching:
    /// whereabouts freed its address then), make ipq's own.
    Watch {
        addr: IpAddr,
        pod_ref: String,
        pod_uid: Option<String>,
    },
    /// Delete ipq's own reservation of `addr`, only if it is still the one of `uid`.
    Delete { addr: IpAddr, uid: String },
}

impl Op {
    pub fn addr(&self) -> IpAddr {
        match self {
            Op::Reserve { addr, .. } | Op::Watch { addr, .. } | Op::Delete { addr, .. } => *addr,
        }
    }
}

/// A reservation ipq watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hold {
    pub uid: String,
    /// ipq's own (made by ipq, deleted by ipq); else whereabouts' own, only labelled.
    pub own: bool,
    /// Of ipq's own: the podRef of the holder it keeps the address for (its `ipq.dev/holder`
    /// annotation). What survives an agent restart: while that holder still holds the
    /// address, its pod was deleted under it and the reservation must stay.
    pub holder: Option<String>,
}

#[derive(Default)]
pub struct Projection {
    wanted: BTreeMap<IpAddr, Want>,
    held: BTreeMap<IpAddr, Hold>,
    /// `held` by uid: a deletion the watch reports is found without a scan.
    held_by_uid: HashMap<String, IpAddr>,
    /// How many of `held` are ipq's own.
    own: usize,
    /// The uids of reservations ipq deleted whose deletion the watch has not reported yet: a
    /// list taken before such a delete (the watcher lists again while calls go on) still has
    /// the reservation, and its deletion, reported after that list, is ipq's, not someone
    /// else's. Pruned at each list (what it lacks was deleted before it and is reported by no
    /// later watch).
    deleted_by_ipq: HashSet<String>,
    /// Live-held addresses whose reservation whereabouts deleted: ipq's own keeps them now.
    needs_own: BTreeSet<IpAddr>,
    /// Live-held addresses with no reservation of their pod's to watch (not whereabouts'):
    /// left alone until their holder changes.
    unmanaged: BTreeSet<IpAddr>,
    /// Addresses that need a reservation and whose reservation names another pod.
    foreign: BTreeSet<IpAddr>,
    /// Addresses whose reservation may not be what is wanted.
    dirty: BTreeSet<IpAddr>,
    /// Live holders whose pod's reservation was freed under them (their pod deleted while they
    /// run), since when this run knew it: the NodeQuarantine lists them as orphaned.
    orphans: BTreeMap<IpAddr, MonoNs>,
    /// Addresses whose orphan state may have changed since [`Projection::settle_orphans`].
    orphans_dirty: BTreeSet<IpAddr>,
}

impl Projection {
    /// `addr` as the registry now has it (`None`: nothing wanted).
    pub fn want(&mut self, addr: IpAddr, want: Option<Want>) {
        let old = self.wanted.get(&addr);
        if old == want.as_ref() {
            return;
        }
        let holder_changed = old.map(|w| &w.pod_ref) != want.as_ref().map(|w| &w.pod_ref);
        if holder_changed {
            self.needs_own.remove(&addr);
            self.unmanaged.remove(&addr);
        }
        match want {
            Some(want) => self.wanted.insert(addr, want),
            None => {
                self.foreign.remove(&addr);
                self.wanted.remove(&addr)
            }
        };
        self.touch(addr);
    }

    /// Whether `addr` must be kept from the next pod: it is listed (quarantined or fenced), or
    /// its live holder's pod reservation was freed under it: seen deleted by this run, or found
    /// as ipq's own made for that same holder (by an earlier run: the reservation is the memory
    /// that survives a restart).
    fn needs_reservation(&self, addr: IpAddr, want: &Want) -> bool {
        want.listed || self.freed_under_holder(addr, want)
    }

    /// Whether `addr`'s pod reservation was freed under its holder: seen deleted by this run,
    /// or found as ipq's own made for that same holder.
    fn freed_under_holder(&self, addr: IpAddr, want: &Want) -> bool {
        self.needs_own.contains(&addr)
            || self.held.get(&addr).is_some_and(|hold| {
                hold.own && hold.holder.is_some() && hold.holder == want.pod_ref
            })
    }

    /// `addr`'s live holder whose pod is gone under it, when it is one the NodeQuarantine does
    /// not list otherwise (a fence or a quarantine says more).
    fn orphaned(&self, addr: IpAddr) -> Option<&Holder> {
        let want = self.wanted.get(&addr)?;
        let holder = want.live_holder.as_ref()?;
        (!want.listed && self.freed_under_holder(addr, want)).then_some(holder)
    }

    /// `addr` may need a call, and its orphan state may have changed.
    fn touch(&mut self, addr: IpAddr) {
        self.dirty.insert(addr);
        self.orphans_dirty.insert(addr);
    }

    /// Brings the orphans up to date with every address touched since the last call (the new
    /// ones orphaned since `now`); whether any orphan came, went or changed its holder.
    /// O(addresses touched).
    pub fn settle_orphans(&mut self, now: MonoNs) -> bool {
        let mut changed = false;
        for addr in std::mem::take(&mut self.orphans_dirty) {
            let orphaned = self.orphaned(addr).is_some();
            let was = self.orphans.contains_key(&addr);
            match (orphaned, was) {
                (true, false) => {
                    self.orphans.insert(addr, now);
                }
                (false, true) => {
                    self.orphans.remove(&addr);
                }
                // Its holder (an interface, a name) may have changed: sent again.
                (true, true) => {}
                (false, false) => continue,
            }
            changed = true;
        }
        changed
    }

    /// The orphaned entries, as the NodeQuarantine lists them. O(orphans).
    pub fn orphan_entries(&self) -> BTreeMap<IpAddr, PublishedEntry> {
        self.orphans
            .iter()
            .filter_map(|(&addr, &since)| {
                let holder = self.orphaned(addr)?.clone();
                Some((
                    addr,
                    PublishedEntry {
                        state: EntryState::Orphaned,
                        since,
                        until: None,
                        holder,
                    },
                ))
            })
            .collect()
    }

    /// The calls that bring every dirty address to what is wanted; they are no longer dirty.
    pub fn take_ops(&mut self) -> Vec<Op> {
        let dirty = std::mem::take(&mut self.dirty);
        let mut ops = Vec::new();
        for addr in dirty {
            let want = self.wanted.get(&addr);
            let hold = self.held.get(&addr);
            match (want, hold) {
                (Some(want), None) if self.needs_reservation(addr, want) => {
                    ops.push(Op::Reserve {
                        addr,
                        pod_ref: want.pod_ref.clone(),
                    });
                }
                (
                    Some(Want {
                        pod_ref: Some(pod_ref),
                        pod_uid,
                        ..
                    }),
                    None,
                ) if !self.unmanaged.contains(&addr) => ops.push(Op::Watch {
                    addr,
                    pod_ref: pod_ref.clone(),
                    pod_uid: pod_uid.clone(),
                }),
                (Some(want), Some(hold)) if hold.own && !self.needs_reservation(addr, want) => {
                    ops.push(Op::Delete {
                        addr,
                        uid: hold.uid.clone(),
                    });
                }
                (None, Some(hold)) if hold.own => ops.push(Op::Delete {
                    addr,
                    uid: hold.uid.clone(),
                }),
                // whereabouts' own, no longer of interest: forgotten, left as it is.
                (None, Some(_)) => {
                    self.unhold(addr);
                }
                _ => {}
            }
        }
        ops
    }

    /// Whether anything waits for a call.
    pub fn has_work(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// ipq watches `addr`'s reservation now (made, labelled, or found at a relist).
    pub fn held(&mut self, addr: IpAddr, hold: Hold) {
        self.foreign.remove(&addr);
        self.hold(addr, hold);
        // Changed meanwhile: looked at again.
        self.touch(addr);
    }

    fn hold(&mut self, addr: IpAddr, hold: Hold) {
        self.unhold(addr);
        self.own += usize::from(hold.own);
        self.held_by_uid.insert(hold.uid.clone(), addr);
        self.held.insert(addr, hold);
    }

    fn unhold(&mut self, addr: IpAddr) -> Option<Hold> {
        let hold = self.held.remove(&addr)?;
        self.own -= usize::from(hold.own);
        if self.held_by_uid.get(&hold.uid) == Some(&addr) {
            self.held_by_uid.remove(&hold.uid);
        }
        Some(hold)
    }

    /// `addr`'s reservation names another pod (or, for a live-held address, there is none of
    /// its pod's): left alone; one that needs a reservation is looked at again by
    /// [`Projection::recheck_foreign`].
    pub fn not_held(&mut self, addr: IpAddr) {
        match self.wanted.get(&addr) {
            Some(want) if self.needs_reservation(addr, want) => {
                self.foreign.insert(addr);
            }
            Some(_) => {
                self.unmanaged.insert(addr);
            }
            None => {}
        }
    }

    /// ipq's reservation of `addr`, of `uid`, is gone (deleted by ipq, or found not to be
    /// ipq's).
    pub fn released(&mut self, addr: IpAddr, uid: &str) {
        self.deleted_by_ipq.insert(uid.to_owned());
        self.unhold(addr);
        self.orphans_dirty.insert(addr);
        if self.wanted.contains_key(&addr) {
            self.dirty.insert(addr);
        }
    }

    /// A call for `addr` failed: it is tried again.
    pub fn failed(&mut self, addr: IpAddr) {
        self.dirty.insert(addr);
    }

    /// Someone deleted the reservation of `uid` ipq watched. The address it kept, when that is
    /// still wanted (ipq's own then keeps it).
    pub fn deleted(&mut self, uid: &str) -> Option<IpAddr> {
        if self.deleted_by_ipq.remove(uid) {
            return None;
        }
        let addr = *self.held_by_uid.get(uid)?;
        self.unhold(addr);
        self.wanted.contains_key(&addr).then(|| {
            self.needs_own.insert(addr);
            self.touch(addr);
            addr
        })
    }

    /// What a fresh list of the reservations ipq watches found: it replaces what was held, and
    /// every address, wanted or held, is looked at again.
    pub fn relisted(&mut self, listed: Vec<(IpAddr, Hold)>) {
        let uids: HashSet<&str> = listed.iter().map(|(_, hold)| hold.uid.as_str()).collect();
        self.deleted_by_ipq
            .retain(|uid| uids.contains(uid.as_str()));
        self.held.clear();
        self.held_by_uid.clear();
        self.own = 0;
        for (addr, hold) in listed {
            // Deleted by ipq since the list was taken: its deletion is on its way.
            if !self.deleted_by_ipq.contains(&hold.uid) {
                self.hold(addr, hold);
            }
        }
        self.foreign.clear();
        self.unmanaged.clear();
        self.dirty.extend(self.wanted.keys().copied());
        self.dirty.extend(self.held.keys().copied());
        self.orphans_dirty.extend(self.held.keys().copied());
        self.orphans_dirty.extend(self.orphans.keys().copied());
    }

    /// The addresses held by another pod are looked at again (it may have gone).
    pub fn recheck_foreign(&mut self) {
        self.dirty.extend(std::mem::take(&mut self.foreign));
    }

    /// ipq's own reservations.
    pub fn own_count(&self) -> usize {
        self.own
    }

    pub fn foreign_count(&self) -> usize {
        self.foreign.len()
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    fn listed(pod: &str) -> Option<Want> {
        Some(Want {
            listed: true,
            pod_ref: Some(format!("default/{pod}")),
            pod_uid: None,
            live_holder: None,
        })
    }

    fn live(pod: &str) -> Option<Want> {
        Some(Want {
            listed: false,
            pod_ref: Some(format!("default/{pod}")),
            pod_uid: None,
            live_holder: Some(pod_holder(pod)),
        })
    }

    /// The live holder of `pod`'s address, as the CNI named it.
    pub(in crate::publish::whereabouts) fn pod_holder(pod: &str) -> Holder {
        Holder::new(7, format!("veth-{pod}")).with_identity(
            Some(format!("sandbox-{pod}")),
            Some("eth0".into()),
            None,
            None,
            Some(crate::registry::PodRef {
                namespace: "default".into(),
                name: pod.into(),
                uid: None,
            }),
        )
    }

    fn own(uid: &str) -> Hold {
        Hold {
            uid: uid.into(),
            own: true,
            holder: None,
        }
    }

    /// ipq's own, made for `pod`'s live holder (its pod deleted under it).
    fn own_for(uid: &str, pod: &str) -> Hold {
        Hold {
            holder: Some(format!("default/{pod}")),
            ..own(uid)
        }
    }

    fn labelled(uid: &str) -> Hold {
        Hold {
            uid: uid.into(),
            own: false,
            holder: None,
        }
    }

    fn addr(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    /// The one call that deletes ipq's own of `addr`, of `uid`.
    fn deletes(addr: IpAddr, uid: &str) -> [Op; 1] {
        [Op::Delete {
            addr,
            uid: uid.into(),
        }]
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
    fn a_quarantine_is_reserved_and_released_when_it_ends() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, listed("web-1"));
        assert_eq!(
            p.take_ops(),
            [Op::Reserve {
                addr: a,
                pod_ref: Some("default/web-1".into())
            }]
        );
        p.held(a, own("uid-1"));
        assert!(p.take_ops().is_empty(), "held: nothing to do");
        p.want(a, listed("web-1"));
        assert!(!p.has_work(), "the same want is no new call");
        p.want(a, None);
        assert_eq!(p.take_ops(), deletes(a, "uid-1"));
        p.released(a, "uid-1");
        assert!(p.take_ops().is_empty());
        assert_eq!(p.own_count(), 0);
    }

    #[test]
    fn a_live_holders_reservation_is_watched_and_replaced_when_whereabouts_frees_it() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, live("web-1"));
        assert_eq!(
            p.take_ops(),
            [Op::Watch {
                addr: a,
                pod_ref: "default/web-1".into(),
                pod_uid: None,
            }]
        );
        p.held(a, labelled("wb-uid"));
        assert!(p.take_ops().is_empty());
        // The Pod's DELETE: whereabouts' control loop frees the address while the holder runs.
        assert_eq!(p.deleted("wb-uid"), Some(a));
        assert_eq!(
            p.take_ops(),
            [Op::Reserve {
                addr: a,
                pod_ref: Some("default/web-1".into())
            }]
        );
        p.held(a, own("uid-1"));
        // The holder goes: the quarantine keeps ipq's reservation; when it ends, it goes.
        p.want(a, listed("web-1"));
        assert!(p.take_ops().is_empty());
        p.want(a, None);
        assert!(matches!(&p.take_ops()[..], [Op::Delete { uid, .. }] if uid == "uid-1"));
    }

    #[test]
    fn an_address_not_whereabouts_manages_costs_one_look_per_holder() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, live("web-1"));
        assert_eq!(p.take_ops().len(), 1);
        p.not_held(a);
        p.recheck_foreign();
        assert!(p.take_ops().is_empty(), "not looked at again");
        p.want(a, live("web-2"));
        assert_eq!(p.take_ops().len(), 1, "a new holder is looked at");
        // Unwanted while labelled: forgotten, never deleted (it is whereabouts').
        p.held(a, labelled("wb"));
        p.take_ops();
        p.want(a, None);
        assert!(p.take_ops().is_empty());
    }

    #[test]
    fn a_reservation_deleted_by_someone_else_is_made_again_while_wanted_only() {
        let mut p = Projection::default();
        let (a, b) = (addr("10.88.0.10"), addr("10.88.0.11"));
        p.want(a, listed("web-1"));
        p.want(b, listed("web-2"));
        p.take_ops();
        p.held(a, own("uid-a"));
        p.held(b, own("uid-b"));
        p.take_ops();
        assert_eq!(p.deleted("uid-a"), Some(a));
        assert!(matches!(&p.take_ops()[..], [Op::Reserve { addr, .. }] if *addr == a));
        // Unwanted, then deleted by whereabouts before ipq's delete: nothing to make.
        p.want(b, None);
        assert_eq!(p.deleted("uid-b"), None);
        assert!(p.take_ops().is_empty());
        assert_eq!(p.deleted("unknown"), None);
    }

    #[test]
    fn another_pods_reservation_is_left_alone_until_rechecked() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, listed("web-1"));
        p.take_ops();
        p.not_held(a);
        assert_eq!(p.foreign_count(), 1);
        assert!(!p.has_work());
        p.recheck_foreign();
        assert!(matches!(&p.take_ops()[..], [Op::Reserve { .. }]));
        // Unwanted while held by another: forgotten, no delete (it is not ipq's).
        p.not_held(a);
        p.want(a, None);
        assert_eq!(p.foreign_count(), 0);
        assert!(p.take_ops().is_empty());
    }

    #[test]
    fn a_reservation_made_after_its_address_was_unwanted_goes_again() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, listed("web-1"));
        p.take_ops();
        p.want(a, None);
        p.held(a, own("uid-1"));
        assert_eq!(p.take_ops(), deletes(a, "uid-1"));
    }

    #[test]
    fn a_relist_takes_over_what_a_previous_run_left() {
        let mut p = Projection::default();
        let (kept, stale, theirs) = (addr("10.88.0.10"), addr("10.88.0.12"), addr("10.88.0.13"));
        p.want(kept, listed("web-1"));
        p.relisted(vec![
            (kept, own("uid-k")),
            (stale, own("uid-s")),
            (theirs, labelled("uid-t")),
        ]);
        assert_eq!(
            p.take_ops(),
            deletes(stale, "uid-s"),
            "a stale own one goes; whereabouts' labelled one is only forgotten"
        );
        assert_eq!(p.own_count(), 2);
    }

    #[test]
    fn a_restarted_agent_keeps_its_own_reservation_while_the_holder_it_was_made_for_lives() {
        let mut p = Projection::default();
        let (kept, moved_on) = (addr("10.88.0.10"), addr("10.88.0.11"));
        // A new run: the registry says both holders live; the reservations say an earlier run
        // made ipq's own for web-1 (its pod was force-deleted under it) and for web-2, whose
        // address has another pod now.
        p.want(kept, live("web-1"));
        p.want(moved_on, live("web-3"));
        p.relisted(vec![
            (kept, own_for("uid-k", "web-1")),
            (moved_on, own_for("uid-m", "web-2")),
        ]);
        assert_eq!(
            p.take_ops(),
            deletes(moved_on, "uid-m"),
            "only the one whose holder went"
        );
        // Its quarantine keeps it; it goes when the quarantine ends.
        p.want(kept, listed("web-1"));
        assert!(p.take_ops().is_empty());
        p.want(kept, None);
        assert!(matches!(&p.take_ops()[..], [Op::Delete { uid, .. }] if uid == "uid-k"));
    }

    /// The watcher lists again (a watch that expired) while the task goes on calling: a list
    /// taken before ipq deleted its own still has it, and the deletion is reported after the
    /// list. Neither makes the address look freed under its holder.
    #[test]
    fn a_list_taken_before_ipqs_own_delete_does_not_bring_it_back() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, listed("web-1"));
        p.take_ops();
        p.held(a, own_for("uid-1", "web-1"));
        p.take_ops();
        // The quarantine ends; the address has a new live holder: ipq's own goes.
        p.want(a, live("web-2"));
        assert_eq!(p.take_ops(), deletes(a, "uid-1"));
        p.released(a, "uid-1");
        // The list the watcher took before that delete, then the delete's event.
        p.relisted(vec![(a, own_for("uid-1", "web-1"))]);
        assert_eq!(p.own_count(), 0, "not held again");
        assert!(
            matches!(&p.take_ops()[..], [Op::Watch { pod_ref, .. }] if pod_ref == "default/web-2"),
            "the new holder's reservation is looked at, nothing deleted or made"
        );
        assert_eq!(p.deleted("uid-1"), None, "ipq's own deletion");
        assert!(p.take_ops().is_empty());
        // Its deletion seen, the next list forgets it; another's deletion counts again.
        p.held(a, labelled("wb-uid"));
        p.take_ops();
        assert_eq!(p.deleted("wb-uid"), Some(a));
    }

    #[test]
    fn a_deletion_seen_before_the_list_that_lacks_it_is_forgotten_by_that_list() {
        let mut p = Projection::default();
        let a = addr("10.88.0.10");
        p.want(a, listed("web-1"));
        p.take_ops();
        p.held(a, own("uid-1"));
        p.want(a, None);
        p.take_ops();
        p.released(a, "uid-1");
        // The watch expired before reporting the deletion; the fresh list lacks it.
        p.relisted(Vec::new());
        assert!(
            p.deleted_by_ipq.is_empty(),
            "nothing kept for a deletion never reported"
        );
        assert_eq!(p.own_count(), 0);
    }
}
