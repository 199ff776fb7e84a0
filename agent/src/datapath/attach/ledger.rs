//! The attachment ledger: every wanted interface ([`Target`]), where its protection stands and
//! what holds ipq's program on each of its hooks, and what follows from that for the gauges,
//! `ipq status`, `/readyz` and the verification (the hooks ipq's netlink filter holds).
//!
//! The ledger only records; the attacher changes it as reports, notices and verifications
//! arrive, and queues the jobs.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use super::{
    cotenant::Verdict, retry::Backoff, upgrade, Mechanism, Protection, Role, Target, TcMode,
};
use crate::{datapath::verify::NetlinkHooks, paths::AttachPoint};

/// How long an interface may stay `attaching` before `/readyz` counts it as unprotected (a
/// normal attach takes milliseconds; this only keeps pod churn from flapping readiness).
pub const ATTACHING_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Every wanted interface, by ifindex.
pub struct Ledger {
    mode: TcMode,
    targets: BTreeMap<u32, Target>,
    /// The hooks held by ipq's netlink filter, for the verification to look at off the loop.
    netlink_hooks: NetlinkHooks,
}

impl Ledger {
    pub(super) fn new(mode: TcMode) -> Self {
        Self {
            mode,
            targets: BTreeMap::new(),
            netlink_hooks: Default::default(),
        }
    }

    /// Records `ifindex` as wanted in `role`, under `name`, `attaching` from now and tagged
    /// `generation`, in place of whatever was wanted of it before.
    pub(super) fn want(
        &mut self,
        ifindex: u32,
        name: &str,
        role: Role,
        generation: u64,
    ) -> &Target {
        let target = Target {
            name: name.to_owned(),
            role,
            protection: Protection::Attaching,
            attached: BTreeMap::new(),
            last_error: None,
            failures: 0,
            since: Instant::now(),
            generation,
            backoff: Backoff::default(),
            retry_at: None,
            upgrade: upgrade::Upgrade::default(),
            lost: BTreeSet::new(),
            looked_at: None,
            bypassed: BTreeSet::new(),
            ahead: BTreeMap::new(),
        };
        self.targets.insert(ifindex, target);
        &self.targets[&ifindex]
    }

    /// Forgets `ifindex`; whether it was wanted.
    pub(super) fn remove(&mut self, ifindex: u32) -> bool {
        self.targets.remove(&ifindex).is_some()
    }

    pub(super) fn get_mut(&mut self, ifindex: u32) -> Option<&mut Target> {
        self.targets.get_mut(&ifindex)
    }

    pub(super) fn targets_mut(&mut self) -> impl Iterator<Item = &mut Target> + '_ {
        self.targets.values_mut()
    }

    pub fn targets(&self) -> &BTreeMap<u32, Target> {
        &self.targets
    }

    pub fn target(&self, ifindex: u32) -> Option<&Target> {
        self.targets.get(&ifindex)
    }

    /// Every wanted (ifindex, attach point): what a prune keeps.
    pub(super) fn wanted_points(&self) -> BTreeSet<(u32, AttachPoint)> {
        self.targets
            .iter()
            .flat_map(|(i, t)| t.role.points().iter().map(move |p| (*i, *p)))
            .collect()
    }

    /// Every attach point in place, for the attached-interface gauge.
    pub fn attached_points(&self) -> impl Iterator<Item = AttachPoint> + '_ {
        self.targets
            .values()
            .flat_map(|t| t.attached.keys().copied())
    }

    /// Every wanted attach point not in place: (ifindex, target, point).
    pub fn unprotected_points(&self) -> impl Iterator<Item = (u32, &Target, AttachPoint)> + '_ {
        self.targets.iter().flat_map(|(ifindex, t)| {
            t.role
                .points()
                .iter()
                .filter(|p| {
                    !t.attached.contains_key(p)
                        || t.lost.contains(p)
                        || t.bypassed.contains(p)
                        || t.unverified().any(|u| u == **p)
                })
                .map(move |p| (*ifindex, t, *p))
        })
    }

    /// Hooks with a co-tenant ahead of ipq's program, by interface, and its verdict.
    pub fn cotenants_ahead(&self) -> impl Iterator<Item = (u32, AttachPoint, &Verdict)> + '_ {
        self.targets
            .iter()
            .flat_map(|(ifindex, t)| t.ahead.iter().map(move |(p, v)| (*ifindex, *p, v)))
    }

    /// Hooks bypassed by a filter or program ahead of ipq's, by interface.
    pub fn bypassed_points(&self) -> impl Iterator<Item = (u32, AttachPoint)> + '_ {
        self.targets
            .iter()
            .flat_map(|(ifindex, t)| t.bypassed.iter().map(move |p| (*ifindex, *p)))
    }

    /// Why `/readyz` must say not ready, if it must: an interface failed, or attaching for
    /// longer than [`ATTACHING_GRACE`].
    pub fn readiness_blocker(&self, now: Instant) -> Option<String> {
        let blocking: Vec<String> = self
            .targets
            .iter()
            .filter(|(_, t)| match t.protection {
                Protection::Protected => false,
                // The agent never sets `Unknown` (it is how an older client reads a newer
                // agent's state); were it set, it would not be protected.
                Protection::Failed
                | Protection::Repairing
                | Protection::Bypassed
                | Protection::Unverified
                | Protection::Unknown => true,
                Protection::Attaching => now.duration_since(t.since) > ATTACHING_GRACE,
            })
            .map(|(ifindex, t)| {
                format!(
                    "{} (if{ifindex}) {}{}",
                    t.name,
                    t.protection.as_ref(),
                    t.last_error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        (!blocking.is_empty()).then(|| {
            format!(
                "{} interface(s) unprotected: {}",
                blocking.len(),
                blocking.join("; ")
            )
        })
    }

    /// Whether any interface's attach is still under way (not yet reported once).
    pub fn attaching(&self) -> bool {
        self.targets
            .values()
            .any(|t| t.protection == Protection::Attaching)
    }

    /// Protected interfaces whose netlink filters still wait for their TCX links (always 0
    /// outside [`TcMode::NetlinkThenTcx`]).
    pub fn pending_upgrades(&self) -> usize {
        if self.mode != TcMode::NetlinkThenTcx {
            return 0;
        }
        self.targets.values().filter(|t| upgrade::wanted(t)).count()
    }

    /// The hooks held by ipq's netlink filter, shared with the verification: kept in step
    /// with every report and every interface forgotten, O(1) each.
    pub fn netlink_hooks(&self) -> NetlinkHooks {
        self.netlink_hooks.clone()
    }

    /// Shares what holds `ifindex`'s hooks now with the verification.
    pub(super) fn share_netlink_hooks(&self, ifindex: u32) {
        let points: Vec<AttachPoint> = self.targets.get(&ifindex).map_or_else(Vec::new, |t| {
            t.attached
                .iter()
                .filter(|(_, m)| **m == Mechanism::Netlink)
                .map(|(p, _)| *p)
                .collect()
        });
        let mut hooks = self
            .netlink_hooks
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if points.is_empty() {
            hooks.remove(&ifindex);
        } else {
            hooks.insert(ifindex, points);
        }
    }
}
