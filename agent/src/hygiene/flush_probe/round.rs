//! One round of the probe, in the throwaway namespace: the entries it creates for a family
//! (the test address in each of the four tuple places, in two zones, beside entries that must
//! stay), the production flush of the test address, and the check of every entry.

use std::net::IpAddr;

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_netfilter::{
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple},
    NetfilterHeader, NetfilterMessage,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::{
    super::{
        conntrack::{Conntrack, ConntrackError},
        kernel_flush::family_of,
        socket::NlSocket,
    },
    FlushProbeError, Verdict,
};

/// `CTA_ZONE`: the probe's entries live in the default zone and in this one.
const CTA_ZONE: u16 = 18;
const OTHER_ZONE: u16 = 4242;

/// One probe entry: its original and reply tuples (UDP), its zone, and whether a flush of the
/// target must take it.
pub(super) struct Entry {
    orig: (IpAddr, u16, IpAddr, u16),
    reply: (IpAddr, u16, IpAddr, u16),
    zone: u16,
    carries_target: bool,
}

/// The entries for one family: the target in each of the four places (two of them in another
/// zone), and entries of other addresses in both zones.
/// (`round` shifts the ports, so that each family's round has entries of its own.)
pub(super) fn entries(addrs: [IpAddr; 5], round: u16) -> (IpAddr, Vec<Entry>) {
    let [t, p1, p2, p3, vip] = addrs;
    let e = |(a, ap, b, bp): (IpAddr, u16, IpAddr, u16),
             (c, cp, d, dp): (IpAddr, u16, IpAddr, u16),
             zone,
             carries_target| Entry {
        orig: (a, ap + round, b, bp + round),
        reply: (c, cp + round, d, dp + round),
        zone,
        carries_target,
    };
    let list = vec![
        // SNAT from the target: original source only.
        e((t, 1001, p1, 2001), (p1, 2001, p2, 40001), 0, true),
        // DNAT to the target (a Service backend): reply source only.
        e((p1, 1002, vip, 2002), (t, 2002, p1, 1002), OTHER_ZONE, true),
        // SNAT to the target: reply destination only.
        e((p2, 1003, p1, 2003), (p1, 2003, t, 40003), 0, true),
        // DNAT away from the target: original destination only.
        e((p1, 1004, t, 2004), (p3, 2004, p1, 1004), OTHER_ZONE, true),
        // Other addresses, in both zones.
        e((p1, 1005, p2, 2005), (p2, 2005, p1, 1005), 0, false),
        e(
            (p1, 1006, p2, 2006),
            (p2, 2006, p1, 1006),
            OTHER_ZONE,
            false,
        ),
        e((p3, 1007, vip, 2007), (p2, 2007, p3, 1007), 0, false),
    ];
    (t, list)
}

pub(super) fn v4() -> [IpAddr; 5] {
    [
        "192.0.2.10",
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.100",
    ]
    .map(|a| a.parse().unwrap())
}

pub(super) fn v6() -> [IpAddr; 5] {
    [
        "2001:db8::10",
        "2001:db8::1",
        "2001:db8::2",
        "2001:db8::3",
        "2001:db8::100",
    ]
    .map(|a| a.parse().unwrap())
}

fn tuple((src, sport, dst, dport): (IpAddr, u16, IpAddr, u16)) -> Vec<Tuple> {
    vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(src),
            IPTuple::DestinationAddress(dst),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::SourcePort(sport),
            ProtoTuple::DestinationPort(dport),
        ]),
    ]
}

fn zone_attr(zone: u16) -> Option<ConntrackAttribute> {
    (zone != 0)
        .then(|| ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, zone.to_be_bytes().to_vec())))
}

fn creation(entry: &Entry) -> NetfilterMessage {
    let mut attrs = vec![
        ConntrackAttribute::CtaTupleOrig(tuple(entry.orig)),
        ConntrackAttribute::CtaTupleReply(tuple(entry.reply)),
        ConntrackAttribute::CtaTimeout(300),
    ];
    attrs.extend(zone_attr(entry.zone));
    NetfilterMessage::new(
        NetfilterHeader::new(family_of(entry.orig.0), 0, 0),
        ConntrackMessage::New(attrs),
    )
}

fn lookup(entry: &Entry) -> NetfilterMessage {
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple(entry.orig))];
    attrs.extend(zone_attr(entry.zone));
    NetfilterMessage::new(
        NetfilterHeader::new(family_of(entry.orig.0), 0, 0),
        ConntrackMessage::Get(attrs),
    )
}

/// One family's round: creates `family`'s entries and `other`'s, flushes `family`'s target
/// with the production code, and checks every entry.
pub(super) fn probe_family(family: &(IpAddr, Vec<Entry>), other: &(IpAddr, Vec<Entry>)) -> Verdict {
    match try_probe(family, other) {
        Ok(verdict) => verdict,
        Err(why) => Verdict::Unavailable(why.to_string()),
    }
}

fn try_probe(
    (target, own): &(IpAddr, Vec<Entry>),
    (_, other): &(IpAddr, Vec<Entry>),
) -> Result<Verdict, FlushProbeError> {
    let mut socket = NlSocket::open(NETLINK_NETFILTER)?;
    let mut conntrack = Conntrack::open()?;
    let all: Vec<&Entry> = own.iter().chain(other).collect();
    let creations: Vec<NetfilterMessage> = all.iter().map(|e| creation(e)).collect();
    let created = socket.acked_with(&creations, NLM_F_CREATE | NLM_F_EXCL, |_| false)?;
    if let Some(errno) = created.iter().find_map(|(o, _)| o.err()) {
        return Err(FlushProbeError::Create { errno });
    }
    match conntrack.flush_in_kernel(*target) {
        Ok(_) => {}
        Err(ConntrackError::Delete { errno, .. }) => {
            return Ok(Verdict::Refused(
                std::io::Error::from_raw_os_error(errno).to_string(),
            ))
        }
        Err(e) => return Err(e.into()),
    }
    let lookups: Vec<NetfilterMessage> = all.iter().map(|e| lookup(e)).collect();
    let found = socket.acked_with(&lookups, 0, |_| false)?;
    for (entry, (outcome, _)) in all.iter().zip(found) {
        let must_be_gone = entry.carries_target && family_of(entry.orig.0) == family_of(*target);
        let present = match outcome {
            Ok(()) => true,
            Err(ENOENT) => false,
            Err(errno) => return Err(FlushProbeError::Lookup { errno }),
        };
        if must_be_gone && present {
            return Ok(Verdict::Ignored(format!(
                "flushing {target} left an entry carrying it: {} zone {}",
                show(entry),
                entry.zone
            )));
        }
        if !must_be_gone && !present {
            return Ok(Verdict::Ignored(format!(
                "flushing {target} deleted an entry that does not carry it: {} zone {}",
                show(entry),
                entry.zone
            )));
        }
    }
    Ok(Verdict::Honoured)
}

const ENOENT: i32 = 2;

fn show(entry: &Entry) -> String {
    let (a, ap, b, bp) = entry.orig;
    let (c, cp, d, dp) = entry.reply;
    format!("orig {a}:{ap} -> {b}:{bp}, reply {c}:{cp} -> {d}:{dp}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_puts_the_target_in_every_place_and_keeps_others_in_both_zones() {
        for addrs in [v4(), v6()] {
            let (t, list) = entries(addrs, 100);
            let carries = |e: &Entry| [e.orig.0, e.orig.2, e.reply.0, e.reply.2].contains(&t);
            for e in &list {
                assert_eq!(carries(e), e.carries_target, "{:?}", e.orig);
            }
            let only = |pick: fn(&Entry) -> IpAddr| {
                list.iter().any(|e| {
                    pick(e) == t
                        && [e.orig.0, e.orig.2, e.reply.0, e.reply.2]
                            .iter()
                            .filter(|a| **a == t)
                            .count()
                            == 1
                })
            };
            assert!(
                only(|e| e.orig.0)
                    && only(|e| e.orig.2)
                    && only(|e| e.reply.0)
                    && only(|e| e.reply.2)
            );
            assert!(list.iter().any(|e| e.carries_target && e.zone != 0));
            assert!(list.iter().any(|e| !e.carries_target && e.zone != 0));
        }
    }
}
