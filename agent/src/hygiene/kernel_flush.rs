//! The fast conntrack flush: the kernel deletes an address's entries itself.
//!
//! A dump walks every bucket of the global conntrack hash table under its lock, empty or not
//! (about 10 ms for 262 144 buckets, whatever the table holds). An `IPCTNL_MSG_CT_DELETE`
//! without an exact tuple but with a `CTA_FILTER` is a flush the kernel carries out with
//! `nf_ct_iterate_cleanup_net`, which skips empty buckets without locking them (well under a
//! millisecond). The filter matches one address in one place of one tuple, so an address takes
//! four deletions: original source, original destination, reply source, reply destination.
//! Without a `CTA_ZONE` the filter matches every zone; the header's family limits it to the
//! address's family.
//!
//! Linux supports `CTA_FILTER` on a flush from 6.12 (commit 1ef7f50ccc6e, "netfilter:
//! ctnetlink: support CTA_FILTER for flush"). Before that, a deletion that carries
//! `CTA_TUPLE_ORIG`/`CTA_TUPLE_REPLY` is read as an exact deletion; these tuples carry one
//! address only, so older kernels refuse them (`EINVAL`) and never flush anything, let alone
//! everything. That is the reasoning; the agent does not rely on it: it uses this path only
//! after the start-up probe (`flush_probe`) has seen the kernel honour the filter.

use std::net::IpAddr;
use strum::VariantArray as _;

use netlink_packet_core::{DefaultNla, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable};
use netlink_packet_netfilter::{
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, Tuple},
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};

/// `CTA_FILTER` (linux/netfilter/nfnetlink_conntrack.h), a nested attribute.
const CTA_FILTER: u16 = 25;
const NLA_F_NESTED: u16 = 1 << 15;
/// `CTA_FILTER_ORIG_FLAGS` and `CTA_FILTER_REPLY_FLAGS`: which fields of that tuple must match.
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
/// `CTA_FILTER_F_CTA_IP_SRC` and `CTA_FILTER_F_CTA_IP_DST` (net/netfilter/nf_conntrack_netlink.c).
const FILTER_IP_SRC: u32 = 1 << 0;
const FILTER_IP_DST: u32 = 1 << 1;
/// nfgenmsg version 1: a flush limited to the header's family (as conntrack-tools sends it).
const NFNETLINK_V1: u8 = 1;

/// Which tuple, and which side of it, one deletion matches the address in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::VariantArray)]
pub(super) enum Place {
    OrigSrc,
    OrigDst,
    ReplySrc,
    ReplyDst,
}

pub(super) fn family_of(addr: IpAddr) -> NetfilterProtoFamily {
    match addr {
        IpAddr::V4(_) => NetfilterProtoFamily::IPv4,
        IpAddr::V6(_) => NetfilterProtoFamily::IPv6,
    }
}

/// A filtered deletion as sent: the message, with `NLA_F_NESTED` set on its `CTA_FILTER`
/// (the kernel parses that attribute strictly and refuses it without the flag; the netlink
/// crate's generic attribute drops flags from the kind, so it is set once serialized).
/// Replies are read as plain netfilter messages.
#[derive(Clone, Debug)]
pub(super) struct FilteredDeletion(pub NetfilterMessage);

/// The trailing `CTA_FILTER`: its header and one `u32` attribute.
const FILTER_ATTR_LEN: usize = 4 + 8;

impl NetlinkSerializable for FilteredDeletion {
    fn message_type(&self) -> u16 {
        self.0.message_type()
    }

    fn buffer_len(&self) -> usize {
        self.0.buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        self.0.serialize(buffer);
        let at = self.0.buffer_len() - FILTER_ATTR_LEN;
        let kind = u16::from_ne_bytes([buffer[at + 2], buffer[at + 3]]);
        assert_eq!(kind, CTA_FILTER, "CTA_FILTER is the last attribute");
        buffer[at + 2..at + 4].copy_from_slice(&(CTA_FILTER | NLA_F_NESTED).to_ne_bytes());
    }
}

impl NetlinkDeserializable for FilteredDeletion {
    type Error = <NetfilterMessage as NetlinkDeserializable>::Error;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        NetfilterMessage::deserialize(header, payload).map(Self)
    }
}

/// The filtered deletion of every entry (any zone) that carries `addr` at `place`.
pub(super) fn deletion(addr: IpAddr, place: Place) -> FilteredDeletion {
    FilteredDeletion(message(addr, place))
}

fn message(addr: IpAddr, place: Place) -> NetfilterMessage {
    let addr = addr.to_canonical();
    let (side, flags) = match place {
        Place::OrigSrc | Place::ReplySrc => (IPTuple::SourceAddress(addr), FILTER_IP_SRC),
        Place::OrigDst | Place::ReplyDst => (IPTuple::DestinationAddress(addr), FILTER_IP_DST),
    };
    let tuple = vec![Tuple::Ip(vec![side])];
    let (tuple, which) = match place {
        Place::OrigSrc | Place::OrigDst => (
            ConntrackAttribute::CtaTupleOrig(tuple),
            CTA_FILTER_ORIG_FLAGS,
        ),
        Place::ReplySrc | Place::ReplyDst => (
            ConntrackAttribute::CtaTupleReply(tuple),
            CTA_FILTER_REPLY_FLAGS,
        ),
    };
    let filter = DefaultNla::new(CTA_FILTER, u32_nla(which, flags));
    NetfilterMessage::new(
        NetfilterHeader::new(family_of(addr), NFNETLINK_V1, 0),
        ConntrackMessage::Delete(vec![tuple, ConntrackAttribute::Other(filter)]),
    )
}

/// The four deletions that together take every entry carrying `addr` in either tuple.
pub(super) fn deletions(addr: IpAddr) -> Vec<FilteredDeletion> {
    Place::VARIANTS.iter().map(|p| deletion(addr, *p)).collect()
}

/// Is `message` the kernel's notice that it deleted an entry (echoed with `NLM_F_ECHO`)?
pub(super) fn is_destroy_event(message: &FilteredDeletion) -> bool {
    matches!(
        message.0.inner,
        NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(_))
    )
}

/// One `u32` attribute (host byte order, as `nla_get_u32` reads it), header included.
fn u32_nla(kind: u16, value: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(8);
    out.extend_from_slice(&8u16.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&value.to_ne_bytes());
    out
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::Nla;

    use super::*;

    #[test]
    fn a_deletion_carries_one_address_in_one_tuple_and_a_filter_on_that_field() {
        let msg = deletion("10.0.0.5".parse().unwrap(), Place::ReplyDst).0;
        assert_eq!(msg.header.family, NetfilterProtoFamily::IPv4);
        assert_eq!(msg.header.version, NFNETLINK_V1);
        let NetfilterMessageInner::Conntrack(ConntrackMessage::Delete(attrs)) = &msg.inner else {
            panic!("{msg:?}");
        };
        assert_eq!(
            attrs[0],
            ConntrackAttribute::CtaTupleReply(vec![Tuple::Ip(vec![IPTuple::DestinationAddress(
                "10.0.0.5".parse().unwrap()
            )])])
        );
        let ConntrackAttribute::Other(filter) = &attrs[1] else {
            panic!("{attrs:?}");
        };
        assert_eq!(filter.kind(), CTA_FILTER);
        let mut value = vec![0; filter.value_len()];
        filter.emit_value(&mut value);
        let mut expected = vec![8, 0, 2, 0];
        expected.extend_from_slice(&FILTER_IP_DST.to_ne_bytes());
        assert_eq!(value, expected);
        // Nothing else: no CTA_ZONE (every zone), no exact tuple the kernel could look up.
        assert_eq!(attrs.len(), 2);
        // As sent: the filter flagged nested, the rest as the crate wrote it.
        let sent = deletion("10.0.0.5".parse().unwrap(), Place::ReplyDst);
        let mut bytes = vec![0; NetlinkSerializable::buffer_len(&sent)];
        sent.serialize(&mut bytes);
        let mut plain = vec![0; NetlinkSerializable::buffer_len(&msg)];
        NetlinkSerializable::serialize(&msg, &mut plain);
        let at = bytes.len() - FILTER_ATTR_LEN;
        assert_eq!(&bytes[at..at + 4], &[12, 0, 25, 0x80]);
        assert_eq!(bytes[..at + 2], plain[..at + 2]);
        assert_eq!(bytes[at + 4..], plain[at + 4..]);
    }

    #[test]
    fn an_address_takes_four_deletions_of_its_own_family() {
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let all = deletions(v6);
        assert_eq!(all.len(), 4);
        assert!(all
            .iter()
            .all(|m| m.0.header.family == NetfilterProtoFamily::IPv6));
        let mapped: IpAddr = "::ffff:10.0.0.5".parse().unwrap();
        assert_eq!(
            deletion(mapped, Place::OrigSrc).0.header.family,
            NetfilterProtoFamily::IPv4
        );
    }
}
