//! Crafted frames for `BPF_PROG_TEST_RUN`: Ethernet with 0, 1 or 2 VLAN tags, IPv4 (whole or
//! fragmented), IPv6, UDP, ARP and ICMPv6 neighbour discovery. Each builder also says where its
//! layer-3 header starts, so tests can cut a frame at every header boundary.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_LLDP: u16 = 0x88CC;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;

pub const MAC_SRC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0a];
pub const MAC_DST: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x0b];

/// VLAN tagging of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vlan {
    Untagged,
    /// One 802.1Q tag.
    Dot1q(u16),
    /// 802.1ad outer tag, 802.1Q inner tag.
    QinQ(u16, u16),
}

impl Vlan {
    pub fn label(self) -> &'static str {
        match self {
            Vlan::Untagged => "",
            Vlan::Dot1q(_) => " vlan",
            Vlan::QinQ(..) => " qinq",
        }
    }
}

/// A frame and the offset of its layer-3 header.
#[derive(Clone, Debug)]
pub struct Frame {
    pub bytes: Vec<u8>,
    pub l3: usize,
}

pub fn ethernet(vlan: Vlan, ethertype: u16, payload: &[u8]) -> Frame {
    let mut bytes = Vec::with_capacity(22 + payload.len());
    bytes.extend_from_slice(&MAC_DST);
    bytes.extend_from_slice(&MAC_SRC);
    match vlan {
        Vlan::Untagged => {}
        Vlan::Dot1q(id) => {
            bytes.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
            bytes.extend_from_slice(&id.to_be_bytes());
        }
        Vlan::QinQ(outer, inner) => {
            bytes.extend_from_slice(&ETH_P_8021AD.to_be_bytes());
            bytes.extend_from_slice(&outer.to_be_bytes());
            bytes.extend_from_slice(&ETH_P_8021Q.to_be_bytes());
            bytes.extend_from_slice(&inner.to_be_bytes());
        }
    }
    bytes.extend_from_slice(&ethertype.to_be_bytes());
    let l3 = bytes.len();
    bytes.extend_from_slice(payload);
    Frame { bytes, l3 }
}

/// The Internet checksum (RFC 1071) of `data`.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Fragmentation of an IPv4 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    Whole,
    /// First fragment: more-fragments set, offset 0.
    First,
    /// A later fragment: offset > 0, no L4 header.
    Later,
}

pub fn ipv4(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    fragment: Fragment,
    payload: &[u8],
) -> Vec<u8> {
    let total = 20 + payload.len();
    let flags_offset: u16 = match fragment {
        Fragment::Whole => 0x4000, // don't fragment
        Fragment::First => 0x2000, // more fragments
        Fragment::Later => 185,    // offset 1480 bytes, last fragment
    };
    let mut header = vec![0x45, 0];
    header.extend_from_slice(&(total as u16).to_be_bytes());
    header.extend_from_slice(&0x1234u16.to_be_bytes());
    header.extend_from_slice(&flags_offset.to_be_bytes());
    header.extend_from_slice(&[64, protocol, 0, 0]);
    header.extend_from_slice(&src.octets());
    header.extend_from_slice(&dst.octets());
    let sum = checksum(&header);
    header[10..12].copy_from_slice(&sum.to_be_bytes());
    header.extend_from_slice(payload);
    header
}

pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, payload: &[u8]) -> Vec<u8> {
    let mut packet = vec![0x60, 0, 0, 0];
    packet.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    packet.extend_from_slice(&[next_header, 255]);
    packet.extend_from_slice(&src.octets());
    packet.extend_from_slice(&dst.octets());
    packet.extend_from_slice(payload);
    packet
}

pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// A UDP datagram (checksum left zero: the programs never read it).
pub fn udp(payload: &[u8]) -> Vec<u8> {
    let mut datagram = Vec::new();
    datagram.extend_from_slice(&4000u16.to_be_bytes());
    datagram.extend_from_slice(&5000u16.to_be_bytes());
    datagram.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(payload);
    datagram
}

pub const ARP_REQUEST: u16 = 1;
pub const ARP_REPLY: u16 = 2;

pub fn arp(op: u16, sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut arp = vec![0, 1, 0x08, 0x00, 6, 4];
    arp.extend_from_slice(&op.to_be_bytes());
    arp.extend_from_slice(&MAC_SRC);
    arp.extend_from_slice(&sender.octets());
    arp.extend_from_slice(&if op == ARP_REQUEST { [0; 6] } else { MAC_DST });
    arp.extend_from_slice(&target.octets());
    arp
}

/// A whole gratuitous ARP frame from `mac`: a broadcast request whose sender and target are
/// both `addr`.
pub fn gratuitous_arp(mac: [u8; 6], addr: Ipv4Addr) -> Vec<u8> {
    let mut frame = Vec::with_capacity(42);
    frame.extend_from_slice(&[0xff; 6]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&0x0806u16.to_be_bytes());
    // Ethernet/IPv4, request.
    frame.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    frame.extend_from_slice(&mac);
    frame.extend_from_slice(&addr.octets());
    frame.extend_from_slice(&[0; 6]);
    frame.extend_from_slice(&addr.octets());
    frame
}

pub const ICMPV6_NS: u8 = 135;
pub const ICMPV6_NA: u8 = 136;
/// Bytes of an NS/NA message up to the end of its target address.
pub const NDP_LEN: usize = 24;

/// A neighbour solicitation or advertisement for `target`, with a link-layer address option.
pub fn ndp(icmp_type: u8, target: Ipv6Addr) -> Vec<u8> {
    let mut message = vec![icmp_type, 0, 0, 0];
    // NA: override flag; NS: reserved.
    message.extend_from_slice(&if icmp_type == ICMPV6_NA {
        [0x20, 0, 0, 0]
    } else {
        [0; 4]
    });
    message.extend_from_slice(&target.octets());
    message.extend_from_slice(&[if icmp_type == ICMPV6_NA { 2 } else { 1 }, 1]);
    message.extend_from_slice(&MAC_SRC);
    message
}

pub const IPPROTO_HOPOPTS: u8 = 0;
pub const IPPROTO_ROUTING: u8 = 43;
pub const IPPROTO_FRAGMENT: u8 = 44;
pub const IPPROTO_DSTOPTS: u8 = 60;

/// An IPv6 extension header in front of the upper layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    /// Hop-by-hop options (a router alert, as MLD sends, padded to 8 bytes).
    HopByHop,
    /// Destination options of `len8` 8-byte units (PadN only).
    DestOpts { len8: u8 },
    /// A type-0-free routing header (segments left 0) with one address.
    Routing,
    /// A fragment header; `offset` in 8-byte units (0: the first fragment).
    Fragment { offset: u16, more: bool },
}

impl Ext {
    fn protocol(self) -> u8 {
        match self {
            Ext::HopByHop => IPPROTO_HOPOPTS,
            Ext::DestOpts { .. } => IPPROTO_DSTOPTS,
            Ext::Routing => IPPROTO_ROUTING,
            Ext::Fragment { .. } => IPPROTO_FRAGMENT,
        }
    }

    /// The header's bytes, its next-header field set to `next`.
    fn bytes(self, next: u8) -> Vec<u8> {
        match self {
            // Router alert (type 5, length 2, value 0), then PadN of 0 bytes.
            Ext::HopByHop => vec![next, 0, 5, 2, 0, 0, 1, 0],
            Ext::DestOpts { len8 } => {
                let total = usize::from(len8.max(1)) * 8;
                // One PadN option filling the rest of the header.
                let mut header = vec![next, len8.max(1) - 1, 1, (total - 4) as u8];
                header.resize(total, 0);
                header
            }
            Ext::Routing => {
                // Type 2 (mobile IPv6 home address), segments left 0: nothing to route.
                let mut header = vec![next, 2, 2, 0, 0, 0, 0, 0];
                header.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
                header
            }
            Ext::Fragment { offset, more } => {
                let word = (offset << 3) | u16::from(more);
                let mut header = vec![next, 0];
                header.extend_from_slice(&word.to_be_bytes());
                header.extend_from_slice(&0x0bad_cafeu32.to_be_bytes());
                header
            }
        }
    }
}

/// An IPv6 packet whose upper layer `protocol` sits behind the extension headers `chain`.
pub fn ipv6_ext(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    chain: &[Ext],
    protocol: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut body = Vec::new();
    for (i, ext) in chain.iter().enumerate() {
        let next = chain.get(i + 1).map_or(protocol, |e| e.protocol());
        body.extend_from_slice(&ext.bytes(next));
    }
    body.extend_from_slice(payload);
    let first = chain.first().map_or(protocol, |e| e.protocol());
    ipv6(src, dst, first, &body)
}
