//! What happened to the pods on this node ([`Happening`], handed over by the agent's loop) and
//! the Events it means for each pod involved ([`Notice`]), named from what the CNI told ipq
//! (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`, `K8S_POD_UID`). A holder the CNI named no pod for (an
//! interface seen only on netlink, an API claim without a pod) gets no Event.

use std::{net::IpAddr, time::SystemTime};

use crate::{
    api::views::Outcome,
    registry::{Conflict, ConflictKind, Holder, PodRef},
};

/// The `reason` of an Event ipq writes: a bounded set, also the label of its counters.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumIter, strum::Display,
)]
pub enum EventReason {
    /// This pod's traffic with an address is dropped: another pod was given it while this one
    /// still runs (`fence-old`), or this pod's claim of it was refused (`refuse-new`).
    IpqFenced,
    /// This pod was given an address another pod on the node still held.
    IpqEarlyReuse,
    /// This pod was given an address still in its quarantine after its last holder left.
    IpqReuseInCooldown,
    /// This pod sent traffic from an address another pod holds.
    IpqDuplicateSource,
    /// Traffic to the address this pod held still arrives after it left: the address stays in
    /// quarantine until it stops.
    IpqQuarantineHeld,
}

impl EventReason {
    /// The Event's `action`: what ipq did.
    pub fn action(self) -> &'static str {
        match self {
            Self::IpqFenced => "Fence",
            Self::IpqEarlyReuse | Self::IpqReuseInCooldown => "Claim",
            Self::IpqDuplicateSource => "Drop",
            Self::IpqQuarantineHeld => "Quarantine",
        }
    }
}

/// Something the agent's loop saw that may concern pods; turned into [`Notice`]s off the loop.
#[derive(Clone, Debug)]
pub enum Happening {
    /// A conflict, with what its policy did.
    Conflict {
        conflict: Box<Conflict>,
        outcome: Outcome,
        at: SystemTime,
    },
    /// A packet of `fenced` with `addr` was dropped (or, observed, would have been).
    FencedTraffic {
        addr: IpAddr,
        fenced: Holder,
        holder: Option<Holder>,
        at: SystemTime,
    },
    /// Traffic to `addr`, in quarantine since `previous` left, arrived.
    StaleTraffic {
        addr: IpAddr,
        previous: Holder,
        at: SystemTime,
    },
}

impl Happening {
    /// Whether any pod is named: what names none is not worth a place in the queue.
    pub fn names_a_pod(&self) -> bool {
        match self {
            Self::Conflict { conflict, .. } => [&conflict.old, &conflict.new]
                .into_iter()
                .flatten()
                .any(|h| h.pod().is_some()),
            Self::FencedTraffic { fenced, .. } => fenced.pod().is_some(),
            Self::StaleTraffic { previous, .. } => previous.pod().is_some(),
        }
    }

    /// The Events it means, one per pod involved, as seen by the agent of `node`.
    pub fn notices(&self, node: &str) -> Vec<Notice> {
        let mut out = Vec::new();
        match self {
            Self::Conflict {
                conflict,
                outcome,
                at,
            } => conflict_notices(conflict, *outcome, node, *at, &mut out),
            Self::FencedTraffic {
                addr,
                fenced,
                holder,
                at,
            } => {
                let by = holder
                    .as_ref()
                    .map_or_else(|| "another holder".to_owned(), who);
                push(
                    &mut out,
                    fenced,
                    EventReason::IpqFenced,
                    format!(
                        "traffic from {addr} dropped: the address was reused by {by} on {node} \
                         while this pod still runs"
                    ),
                    *at,
                );
            }
            Self::StaleTraffic { addr, previous, at } => push(
                &mut out,
                previous,
                EventReason::IpqQuarantineHeld,
                format!(
                    "traffic to {addr} still arrives on {node} after this pod left: the address \
                     stays in quarantine until it stops"
                ),
                *at,
            ),
        }
        out
    }
}

fn conflict_notices(
    conflict: &Conflict,
    outcome: Outcome,
    node: &str,
    at: SystemTime,
    out: &mut Vec<Notice>,
) {
    let addr = conflict.addr;
    let old = conflict
        .old
        .as_ref()
        .map_or_else(|| "another holder".to_owned(), who);
    let new = conflict
        .new
        .as_ref()
        .map_or_else(|| "another holder".to_owned(), who);
    let done = match outcome {
        Outcome::FencedOld => "the old holder's traffic with it is dropped (fence-old)",
        Outcome::RefusedNew | Outcome::BlockedNew => {
            "this pod's traffic with it is dropped until it is free (refuse-new)"
        }
        Outcome::Observed => "observed only: nothing is dropped",
        Outcome::Dropped => "the packets are dropped",
        Outcome::Claimed | Outcome::Reported | Outcome::Unknown => "reported",
    };
    match conflict.kind {
        ConflictKind::EarlyReuse => {
            if let Some(claimant) = &conflict.new {
                push(
                    out,
                    claimant,
                    EventReason::IpqEarlyReuse,
                    format!(
                        "{addr} was given to this pod while {old} on {node} still runs: {done}"
                    ),
                    at,
                );
            }
            if let (Outcome::FencedOld, Some(fenced)) = (outcome, &conflict.old) {
                push(
                    out,
                    fenced,
                    EventReason::IpqFenced,
                    format!(
                        "traffic from {addr} dropped: the address was reused by {new} on {node} \
                         while this pod still runs"
                    ),
                    at,
                );
            }
            if let (Outcome::RefusedNew | Outcome::BlockedNew, Some(refused)) =
                (outcome, &conflict.new)
            {
                push(
                    out,
                    refused,
                    EventReason::IpqFenced,
                    format!(
                        "traffic from {addr} dropped: {old} on {node} still holds the address \
                         (refuse-new)"
                    ),
                    at,
                );
            }
        }
        ConflictKind::ReuseInCooldown => {
            if let Some(claimant) = &conflict.new {
                push(
                    out,
                    claimant,
                    EventReason::IpqReuseInCooldown,
                    format!(
                        "{addr} was given to this pod during its quarantine on {node}, after {old} \
                         left: stale traffic for the old holder may reach this pod ({done})"
                    ),
                    at,
                );
            }
        }
        ConflictKind::DuplicateSource => {
            if let Some(sender) = &conflict.new {
                push(
                    out,
                    sender,
                    EventReason::IpqDuplicateSource,
                    format!(
                        "this pod sent traffic from {addr}, which {old} holds on {node}: {done}"
                    ),
                    at,
                );
            }
        }
        // Another machine claimed the address: the pod here is fenced when it was Draining, or
        // Active under fence-old with its pod gone from the API server (or no answer).
        ConflictKind::RemoteClaim => {
            if let (Outcome::FencedOld, Some(fenced)) = (outcome, &conflict.old) {
                push(
                    out,
                    fenced,
                    EventReason::IpqFenced,
                    format!(
                        "traffic from {addr} dropped: another machine on the network claimed \
                         the address this pod still holds on {node}"
                    ),
                    at,
                );
            }
        }
    }
}

/// A holder as a note names it: its pod, else its interface.
fn who(holder: &Holder) -> String {
    match holder.pod() {
        Some(pod) => format!("{}/{}", pod.namespace, pod.name),
        None => format!("interface {}", holder.ifname),
    }
}

fn push(out: &mut Vec<Notice>, holder: &Holder, reason: EventReason, note: String, at: SystemTime) {
    if let Some(pod) = holder.pod() {
        out.push(Notice {
            pod: pod.clone(),
            reason,
            note,
            observed_at: at,
        });
    }
}

/// One Event's worth for one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub pod: PodRef,
    pub reason: EventReason,
    /// The Event's `note` (at most 1 kB: the API server refuses longer).
    pub note: String,
    pub observed_at: SystemTime,
}

/// What a series is kept by: the pod (its uid too: a pod of the same name made again is another
/// pod) and the reason.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub reason: EventReason,
}

impl Notice {
    pub fn key(&self) -> SeriesKey {
        SeriesKey {
            namespace: self.pod.namespace.clone(),
            name: self.pod.name.clone(),
            uid: self.pod.uid.clone(),
            reason: self.reason,
        }
    }
}
