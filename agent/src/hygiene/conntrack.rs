//! Conntrack entries of reused addresses, deleted over ctnetlink, in one of two ways.
//!
//! - The dump ([`Conntrack::flush`]): one dump of the whole table (IPv4 and IPv6, every zone),
//!   then a deletion of each entry whose original or reply tuple carries one of the addresses,
//!   by its original tuple, zone and id (the way `conntrack -D` does it), so that an entry
//!   recreated meanwhile is left alone. Exact counts; its cost is the size of the hash table.
//! - The kernel's filtered flush ([`Conntrack::flush_in_kernel`], see `kernel_flush`): four
//!   deletions per address that the kernel carries out itself, far cheaper; used only where the
//!   start-up probe proved the kernel honours the filter.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use netlink_packet_core::{DefaultNla, Nla};
use netlink_packet_netfilter::{
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, Tuple},
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use thiserror::Error;

use super::{
    kernel_flush,
    socket::{NlSocket, SocketError},
};

/// `CTA_ZONE` and `CTA_ID` (linux/netfilter/nfnetlink_conntrack.h); the crate leaves them raw.
const CTA_ZONE: u16 = 18;
const CTA_ID: u16 = 12;

/// The entry was gone by the time its deletion arrived (it expired, or another flush took it).
const ENOENT: i32 = 2;

#[derive(Debug, Error)]
pub enum ConntrackError {
    #[error("ctnetlink: {0}")]
    Socket(#[from] SocketError),
    #[error("ctnetlink: deleting {failed} of {tried} entries failed (first errno {errno})")]
    Delete {
        failed: usize,
        tried: usize,
        errno: i32,
    },
}

/// One conntrack entry as needed to delete it.
#[derive(Clone, Debug)]
struct Entry {
    family: NetfilterProtoFamily,
    orig: Vec<Tuple>,
    zone: Option<DefaultNla>,
    id: Option<DefaultNla>,
    /// Every address of both tuples.
    addrs: Vec<IpAddr>,
}

/// The node's conntrack table, through a ctnetlink socket of its own.
pub struct Conntrack {
    socket: NlSocket,
}

/// The deletions of one flush that the kernel refused (ENOENT, already gone, is not one).
#[derive(Default)]
struct Refusals {
    failed: usize,
    first_errno: i32,
}

impl Refusals {
    fn note(&mut self, errno: i32) {
        self.failed += 1;
        if self.first_errno == 0 {
            self.first_errno = errno;
        }
    }

    /// Any refusal fails the flush: nothing is assumed flushed.
    fn check(self, tried: usize) -> Result<(), ConntrackError> {
        if self.failed == 0 {
            return Ok(());
        }
        Err(ConntrackError::Delete {
            failed: self.failed,
            tried,
            errno: self.first_errno,
        })
    }
}

impl Conntrack {
    pub fn open() -> Result<Self, ConntrackError> {
        Ok(Self {
            socket: NlSocket::open(NETLINK_NETFILTER)?,
        })
    }

    /// Deletes every entry that carries one of `targets` in either tuple; returns how many were
    /// deleted per address (an entry between two targets counts for both).
    pub fn flush(
        &mut self,
        targets: &BTreeSet<IpAddr>,
    ) -> Result<BTreeMap<IpAddr, u64>, ConntrackError> {
        let mut matching = Vec::new();
        let request = NetfilterMessage::new(
            NetfilterHeader::new(NetfilterProtoFamily::Unspec, 0, 0),
            ConntrackMessage::Get(Vec::new()),
        );
        self.socket.dump(request, |message: NetfilterMessage| {
            if let Some(entry) = entry_of(message) {
                if entry.addrs.iter().any(|a| targets.contains(a)) {
                    matching.push(entry);
                }
            }
        })?;
        let requests: Vec<NetfilterMessage> = matching.iter().map(deletion).collect();
        let outcomes = self.socket.acked(&requests)?;
        let mut flushed: BTreeMap<IpAddr, u64> = BTreeMap::new();
        let mut refusals = Refusals::default();
        for (entry, outcome) in matching.iter().zip(outcomes) {
            match outcome {
                Ok(()) => {
                    let mut counted = BTreeSet::new();
                    for addr in entry.addrs.iter().filter(|a| targets.contains(a)) {
                        if counted.insert(*addr) {
                            *flushed.entry(*addr).or_default() += 1;
                        }
                    }
                }
                Err(ENOENT) => {}
                Err(errno) => refusals.note(errno),
            }
        }
        refusals.check(matching.len())?;
        Ok(flushed)
    }
}

impl Conntrack {
    /// Deletes every entry (any zone) carrying `addr` in either tuple, by the kernel's filtered
    /// flush; returns how many deletions the kernel reported (`NLM_F_ECHO`). The kernel reports
    /// a deletion only for an entry that carries conntrack's event extension, so this is a
    /// lower bound (see docs/hygiene.md). Any refusal is an error: nothing is assumed flushed.
    pub fn flush_in_kernel(&mut self, addr: IpAddr) -> Result<u64, ConntrackError> {
        let deletions = kernel_flush::deletions(addr);
        // The four deletions in one send, their acknowledgements read together: a claim's
        // flush is one round trip, not four. Should their echoes overflow the socket's buffer,
        // the deletions are sent again one at a time (each idempotent), counting what arrived.
        let outcomes = match self.socket.acked_with(
            &deletions,
            netlink_packet_core::NLM_F_ECHO,
            kernel_flush::is_destroy_event,
        ) {
            Ok(outcomes) => outcomes,
            Err(e) if e.is_overflow() => {
                let mut drained = self.socket.drain_counting(kernel_flush::is_destroy_event);
                let mut outcomes = Vec::with_capacity(deletions.len());
                for deletion in &deletions {
                    let (outcome, echoed) = self.delete_filtered(deletion)?;
                    outcomes.push((outcome, echoed + std::mem::take(&mut drained)));
                }
                outcomes
            }
            Err(e) => return Err(e.into()),
        };
        let mut reported = 0;
        let mut refusals = Refusals::default();
        for (outcome, echoed) in outcomes {
            reported += echoed;
            if let Err(errno) = outcome {
                refusals.note(errno);
            }
        }
        refusals.check(deletions.len())?;
        Ok(reported)
    }

    /// One filtered deletion, sent on its own so that only its echoes must fit in the socket's
    /// buffer. If they overflow it, the acknowledgement may be lost with them: the deletion is
    /// sent again (it is idempotent; the kernel deletes what still matches), and the echoes
    /// that did arrive still count.
    fn delete_filtered(
        &mut self,
        deletion: &kernel_flush::FilteredDeletion,
    ) -> Result<(Result<(), i32>, u64), ConntrackError> {
        let mut echoed = 0;
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.socket.acked_with(
                std::slice::from_ref(deletion),
                netlink_packet_core::NLM_F_ECHO,
                kernel_flush::is_destroy_event,
            ) {
                Ok(outcomes) => {
                    let (outcome, n) = outcomes.into_iter().next().unwrap_or((Ok(()), 0));
                    return Ok((outcome, echoed + n));
                }
                Err(e) if e.is_overflow() && attempts < MAX_OVERFLOW_RETRIES => {
                    echoed += self.socket.drain_counting(kernel_flush::is_destroy_event);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// How many times a filtered deletion is sent again after its echoes overflowed the socket.
const MAX_OVERFLOW_RETRIES: u32 = 4;

/// The parts of a dumped entry a deletion needs, or `None` for anything else.
fn entry_of(message: NetfilterMessage) -> Option<Entry> {
    let NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)) = message.inner else {
        return None;
    };
    let mut entry = Entry {
        family: message.header.family,
        orig: Vec::new(),
        zone: None,
        id: None,
        addrs: Vec::new(),
    };
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuples) => {
                entry.addrs.extend(tuple_addrs(&tuples));
                entry.orig = tuples;
            }
            ConntrackAttribute::CtaTupleReply(tuples) => entry.addrs.extend(tuple_addrs(&tuples)),
            ConntrackAttribute::Other(nla) if nla.kind() == CTA_ZONE => entry.zone = Some(nla),
            ConntrackAttribute::Other(nla) if nla.kind() == CTA_ID => entry.id = Some(nla),
            _ => {}
        }
    }
    (!entry.orig.is_empty()).then_some(entry)
}

fn tuple_addrs(tuples: &[Tuple]) -> impl Iterator<Item = IpAddr> + '_ {
    tuples
        .iter()
        .filter_map(|t| match t {
            Tuple::Ip(ips) => Some(ips),
            _ => None,
        })
        .flatten()
        .filter_map(|ip| match ip {
            IPTuple::SourceAddress(a) | IPTuple::DestinationAddress(a) => Some(a.to_canonical()),
            _ => None,
        })
}

/// `IPCTNL_MSG_CT_DELETE` of exactly `entry`: its family, original tuple, zone and id.
fn deletion(entry: &Entry) -> NetfilterMessage {
    let mut attributes = vec![ConntrackAttribute::CtaTupleOrig(entry.orig.clone())];
    attributes.extend(entry.zone.clone().map(ConntrackAttribute::Other));
    attributes.extend(entry.id.clone().map(ConntrackAttribute::Other));
    NetfilterMessage::new(
        NetfilterHeader::new(entry.family, 0, 0),
        ConntrackMessage::Delete(attributes),
    )
}
