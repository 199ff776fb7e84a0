//! One link's bridge master, asked of the kernel for every new holder: the lean form of
//! `RTM_GETLINK`.
//!
//! A link's full answer is a few kilobytes (statistics, per-family configuration, every
//! attribute the kernel knows); parsed into `netlink_packet_route`'s types, it allocated a
//! vector per nested attribute and was the larger part of the hygiene worker's time during a
//! burst of claims. The worker uses one attribute of it, `IFLA_MASTER`. So the request asks the
//! kernel to leave the statistics out (`RTEXT_FILTER_SKIP_STATS`; a kernel that predates the
//! flag ignores it) and the answer is read for that attribute alone.

use netlink_packet_core::{DecodeError, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable};

use super::neighbour::Link;

/// `RTM_NEWLINK` and `RTM_GETLINK` (linux/rtnetlink.h).
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
/// `struct ifinfomsg`: family, pad, type, index, flags, change.
const IFINFOMSG_LEN: usize = 16;
/// `IFLA_MASTER` and `IFLA_EXT_MASK` (linux/if_link.h).
const IFLA_MASTER: u16 = 10;
const IFLA_EXT_MASK: u16 = 29;
/// `RTEXT_FILTER_SKIP_STATS` (linux/rtnetlink.h): no `IFLA_STATS*`, no per-family statistics.
const RTEXT_FILTER_SKIP_STATS: u32 = 1 << 3;
/// An attribute's header; its type without the nested and byte-order flags.
const NLA_HEADER_LEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff;
/// The request: an `ifinfomsg` and one `u32` attribute.
const REQUEST_LEN: usize = IFINFOMSG_LEN + NLA_HEADER_LEN + 4;

/// The request for link `ifindex`, and the kernel's answers to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkQuery {
    /// `RTM_GETLINK` for this ifindex.
    Get(u32),
    /// `RTM_NEWLINK`: the link, with its master.
    Answer(Link),
    /// Any other message (not expected in answer to a request for one link).
    Other,
}

impl NetlinkSerializable for LinkQuery {
    fn message_type(&self) -> u16 {
        match self {
            Self::Get(_) => RTM_GETLINK,
            Self::Answer(_) | Self::Other => RTM_NEWLINK,
        }
    }

    fn buffer_len(&self) -> usize {
        REQUEST_LEN
    }

    fn serialize(&self, buffer: &mut [u8]) {
        let ifindex = match self {
            Self::Get(ifindex) | Self::Answer(Link { ifindex, .. }) => *ifindex,
            Self::Other => 0,
        };
        let buffer = &mut buffer[..REQUEST_LEN];
        buffer.fill(0);
        // ifinfomsg: family AF_UNSPEC, the index, no flags.
        buffer[4..8].copy_from_slice(&(ifindex as i32).to_ne_bytes());
        let nla = &mut buffer[IFINFOMSG_LEN..];
        nla[0..2].copy_from_slice(&((NLA_HEADER_LEN + 4) as u16).to_ne_bytes());
        nla[2..4].copy_from_slice(&IFLA_EXT_MASK.to_ne_bytes());
        nla[4..8].copy_from_slice(&RTEXT_FILTER_SKIP_STATS.to_ne_bytes());
    }
}

impl NetlinkDeserializable for LinkQuery {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        if header.message_type != RTM_NEWLINK {
            return Ok(Self::Other);
        }
        let Some(index) = payload.get(4..8) else {
            return Err(DecodeError::from(format!(
                "RTM_NEWLINK: {} bytes, shorter than its ifinfomsg",
                payload.len()
            )));
        };
        let ifindex = i32::from_ne_bytes(index.try_into().expect("4 bytes")) as u32;
        Ok(Self::Answer(Link {
            ifindex,
            master: master_of(&payload[IFINFOMSG_LEN.min(payload.len())..])?,
        }))
    }
}

/// `IFLA_MASTER` among a link's attributes, each checked for its length on the way.
fn master_of(mut attributes: &[u8]) -> Result<Option<u32>, DecodeError> {
    while attributes.len() >= NLA_HEADER_LEN {
        let length = usize::from(u16::from_ne_bytes([attributes[0], attributes[1]]));
        let kind = u16::from_ne_bytes([attributes[2], attributes[3]]) & NLA_TYPE_MASK;
        if length < NLA_HEADER_LEN || length > attributes.len() {
            return Err(DecodeError::from(format!(
                "RTM_NEWLINK: attribute {kind} of {length} bytes, with {} left",
                attributes.len()
            )));
        }
        if kind == IFLA_MASTER {
            let value: [u8; 4] = attributes[NLA_HEADER_LEN..length].try_into().map_err(|_| {
                DecodeError::from(format!("RTM_NEWLINK: IFLA_MASTER of {length} bytes"))
            })?;
            return Ok(Some(u32::from_ne_bytes(value)));
        }
        // Attributes are aligned to 4 bytes; the last one may end without its padding.
        attributes = &attributes[((length + 3) & !3).min(attributes.len())..];
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::{NetlinkMessage, NetlinkPayload};
    use netlink_packet_route::{
        link::{LinkAttribute, LinkMessage},
        RouteNetlinkMessage,
    };

    use super::*;

    /// A link message as the kernel sends it, built with the full crate.
    fn answer(ifindex: u32, attributes: Vec<LinkAttribute>) -> Vec<u8> {
        let mut link = LinkMessage::default();
        link.header.index = ifindex;
        link.attributes = attributes;
        let mut message = NetlinkMessage::new(
            NetlinkHeader::default(),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)),
        );
        message.finalize();
        let mut bytes = vec![0; message.buffer_len()];
        message.serialize(&mut bytes);
        bytes
    }

    fn read(bytes: &[u8]) -> Result<LinkQuery, DecodeError> {
        NetlinkMessage::<LinkQuery>::deserialize(bytes).map(|m| match m.payload {
            NetlinkPayload::InnerMessage(inner) => inner,
            other => panic!("not an inner message: {other:?}"),
        })
    }

    #[test]
    fn the_master_is_read_among_the_other_attributes() {
        let bytes = answer(
            7,
            vec![
                LinkAttribute::IfName("veth-a".into()),
                LinkAttribute::Mtu(1500),
                LinkAttribute::Controller(3),
                LinkAttribute::TxQueueLen(1000),
            ],
        );
        assert_eq!(
            read(&bytes).unwrap(),
            LinkQuery::Answer(Link {
                ifindex: 7,
                master: Some(3)
            })
        );
    }

    #[test]
    fn a_link_without_a_master_has_none() {
        let bytes = answer(9, vec![LinkAttribute::IfName("eth0".into())]);
        assert_eq!(
            read(&bytes).unwrap(),
            LinkQuery::Answer(Link {
                ifindex: 9,
                master: None
            })
        );
    }

    #[test]
    fn a_truncated_attribute_is_an_error_not_a_guess() {
        let mut bytes = answer(9, vec![LinkAttribute::Controller(3)]);
        // The attribute claims more bytes than the message has.
        let at = 16 + IFINFOMSG_LEN;
        bytes[at..at + 2].copy_from_slice(&64u16.to_ne_bytes());
        let error = read(&bytes).unwrap_err();
        assert!(
            error.to_string().contains("attribute 10 of 64 bytes"),
            "{error}"
        );
        // A message shorter than its ifinfomsg.
        let mut header = NetlinkHeader::default();
        header.message_type = RTM_NEWLINK;
        assert!(LinkQuery::deserialize(&header, &[0; 6]).is_err());
    }

    #[test]
    fn the_request_names_the_link_and_skips_statistics() {
        let query = LinkQuery::Get(42);
        let mut bytes = vec![0xff; query.buffer_len()];
        query.serialize(&mut bytes);
        assert_eq!(query.message_type(), RTM_GETLINK);
        // Read back by the full crate as the kernel would parse it.
        let mut header = NetlinkHeader::default();
        header.message_type = RTM_GETLINK;
        let parsed = RouteNetlinkMessage::deserialize(&header, &bytes).unwrap();
        let RouteNetlinkMessage::GetLink(link) = parsed else {
            panic!("not a GetLink: {parsed:?}");
        };
        assert_eq!(link.header.index, 42);
        assert_eq!(
            link.attributes,
            vec![LinkAttribute::ExtMask(vec![
                netlink_packet_route::link::LinkExtentMask::SkipStats
            ])]
        );
    }
}
