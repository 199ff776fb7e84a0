//! The kernel's TC notifications (`RTNLGRP_TC`): what anyone, ipq included, does to clsact
//! qdiscs and to filters at ipq's place.
//!
//! On a node whose hooks hold ipq's netlink filter (`tc_attach = "netlink"`, every 5.10 and 6.1
//! node), `tc qdisc del dev <veth> clsact` (felix switching its eBPF dataplane off, a cleanup
//! script, a troubleshooting step) or `tc filter del ... pref 2` takes ipq's program off the
//! hook, and nothing else would tell. The kernel announces each such change to this multicast
//! group; this module turns the ones that can concern ipq into [`TcNotice`]s for the owner
//! loop, which asks an attach worker to look at the hook and put back what is missing
//! ([`super::JobKind::Repair`]). Nothing here decides: a notice only says where to look, since
//! ipq's own changes (an upgrade removing its filter once the TCX link holds the hook) are
//! announced the same way. A filter added (or deleted) at a priority before ipq's is
//! announced too: one that can end classification there hides every packet it classifies
//! from ipq's program, so the hook is looked at and what the filter does judged
//! ([`super::cotenant`]): `bypassed` if it ends processing, protected if it hands packets on.

use futures::StreamExt as _;
use ipq_common::names::{TC_FILTER_HANDLE, TC_FILTER_PRIORITY};
use log::warn;
use prometheus::IntCounter;
use rtnetlink::{
    packet_core::NetlinkPayload,
    packet_route::{
        tc::{TcAttribute, TcHandle, TcMessage},
        RouteNetlinkMessage,
    },
    MulticastGroup,
};
use tokio::sync::mpsc;

use super::tc_filter::{Direction, Filter};
use crate::paths::AttachPoint;

/// What went, or came, in a way that may have taken ipq's program off a hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcChange {
    /// A clsact qdisc was deleted: every filter under it went, on both hooks.
    ClsactDeleted,
    /// The filters at ipq's priority on a hook were deleted (ipq's by its handle, the whole
    /// priority, or every filter of the hook).
    FilterDeleted(AttachPoint),
    /// A filter that is not ipq's was put at ipq's place on a hook (`tc filter replace`).
    ForeignFilter(AttachPoint),
    /// A filter at a priority before ipq's was added to or deleted from a hook: whether
    /// something now runs before ipq's filter must be looked at again.
    Ahead(AttachPoint),
}

impl TcChange {
    /// The hooks it concerns.
    pub fn points(self) -> &'static [AttachPoint] {
        match self {
            Self::ClsactDeleted => &[AttachPoint::TcxIngress, AttachPoint::TcxEgress],
            Self::FilterDeleted(AttachPoint::TcxEgress)
            | Self::ForeignFilter(AttachPoint::TcxEgress)
            | Self::Ahead(AttachPoint::TcxEgress) => &[AttachPoint::TcxEgress],
            Self::FilterDeleted(_) | Self::ForeignFilter(_) | Self::Ahead(_) => {
                &[AttachPoint::TcxIngress]
            }
        }
    }
}

/// One notification that may concern ipq.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcNotice {
    Change {
        ifindex: u32,
        change: TcChange,
    },
    /// Notifications were lost (the socket's buffer overflowed, or the queue to the owner loop
    /// was full): every hook must be looked at.
    Overrun,
}

fn point_of(direction: Direction) -> AttachPoint {
    match direction {
        Direction::Ingress => AttachPoint::TcxIngress,
        Direction::Egress => AttachPoint::TcxEgress,
    }
}

fn is_clsact(tc: &TcMessage) -> bool {
    tc.header.parent == TcHandle::CLSACT
        || tc
            .attributes
            .iter()
            .any(|a| matches!(a, TcAttribute::Kind(kind) if kind == "clsact"))
}

/// Whether `filter` sits before ipq's on its hook (a lower priority; 0 means every priority).
fn is_ahead(filter: &Filter) -> bool {
    filter.priority != 0 && filter.priority < TC_FILTER_PRIORITY
}

/// The notice a TC notification makes, if it can concern ipq.
pub fn notice_of(message: &RouteNetlinkMessage) -> Option<TcNotice> {
    let (tc, change) = match message {
        RouteNetlinkMessage::DelQueueDiscipline(tc) if is_clsact(tc) => {
            (tc, TcChange::ClsactDeleted)
        }
        RouteNetlinkMessage::DelTrafficFilter(tc) => {
            let point = point_of(Direction::of_parent(tc.header.parent)?);
            let filter = Filter::from_message(tc);
            // Priority 0: every filter of the hook; handle 0: every filter of the priority.
            let priority = filter.priority == 0 || filter.priority == TC_FILTER_PRIORITY;
            let handle = filter.handle == 0 || filter.handle == TC_FILTER_HANDLE;
            if is_ahead(&filter) {
                return Some(TcNotice::Change {
                    ifindex: u32::try_from(tc.header.index).ok()?,
                    change: TcChange::Ahead(point),
                });
            }
            if !(priority && handle) {
                return None;
            }
            (tc, TcChange::FilterDeleted(point))
        }
        RouteNetlinkMessage::NewTrafficFilter(tc) => {
            let point = point_of(Direction::of_parent(tc.header.parent)?);
            let filter = Filter::from_message(tc);
            if filter.is_ipq() {
                return None;
            }
            if is_ahead(&filter) {
                (tc, TcChange::Ahead(point))
            } else if filter.at_ipq_place() {
                (tc, TcChange::ForeignFilter(point))
            } else {
                return None;
            }
        }
        _ => return None,
    };
    let ifindex = u32::try_from(tc.header.index).ok()?;
    Some(TcNotice::Change { ifindex, change })
}

/// TC notices waiting for the owner loop. ipq's own new filters make none (filtered out above)
/// and its own deletions (a hook moved to TCX) come one per link create, paced by `rtnl_lock`;
/// the loop takes each burst whole. 1024 holds a few hundred workload interfaces losing their
/// clsact qdiscs (and the filters under them) at once to a script; beyond it the notices are
/// folded into one [`TcNotice::Overrun`], a look at every hook, which finds whatever they said.
pub const NOTICE_QUEUE: usize = 1024;

/// Subscribes to `RTNLGRP_TC`; the notices arrive on the returned receiver. Subscribe before
/// the first attach, so that nothing done in between is missed. A notice that finds the queue
/// full is dropped and counted in `overflows`, and an [`TcNotice::Overrun`] takes the next free
/// slot (see [`crate::queues::forward_or_resync`]).
pub fn subscribe(overflows: IntCounter) -> std::io::Result<mpsc::Receiver<TcNotice>> {
    let (mut connection, _handle, messages) =
        rtnetlink::new_multicast_connection(&[MulticastGroup::Tc])?;
    // ipq's own attaches announce themselves here too (2 per workload interface at a cold
    // start): a wide buffer keeps them from overrunning it, which would mean a look at every hook.
    crate::netlink::widen_receive_buffer(netlink_sys::AsyncSocket::socket_mut(
        connection.socket_mut(),
    ));
    tokio::spawn(connection);
    let (tx, rx) = mpsc::channel(NOTICE_QUEUE);
    let notices = messages.filter_map(|(message, _)| {
        futures::future::ready(match &message.payload {
            NetlinkPayload::InnerMessage(inner) => notice_of(inner),
            NetlinkPayload::Overrun(_) => Some(TcNotice::Overrun),
            _ => None,
        })
    });
    tokio::spawn(async move {
        let ended =
            crate::queues::forward_or_resync(notices, tx, || TcNotice::Overrun, overflows).await;
        if ended == crate::queues::Ended::Source {
            warn!(
                "the TC notification socket closed: deletions of ipq's filters are no longer seen"
            );
        }
    });
    Ok(rx)
}
