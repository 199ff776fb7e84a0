//! Verifier-facing packet parsing: Ethernet, up to two VLAN tags (802.1Q, 802.1ad), IPv4, IPv6,
//! ARP and ICMPv6 neighbour solicitation/advertisement. Every read is bounds-checked against
//! the end of the packet; anything that does not parse completely is `None`, and passes.
//!
//! Only addresses matter to ipq, so nothing past the headers that carry them is read: an IPv4
//! fragment is judged by its addresses like any other packet, and the L4 header is read only
//! for ICMPv6 neighbour discovery, whose target address is an announcement. To find that
//! ICMPv6 header the IPv6 extension-header chain (hop-by-hop, routing, destination options,
//! fragment, authentication) is walked, up to [`IPV6_EXT_HEADERS_MAX`] headers: the kernel
//! delivers a neighbour advertisement behind any of them, so the program must judge it too.

use core::mem::size_of;

use ipq_common::addr::AddrKey;

const ETH_HEADER_LEN: usize = 14;
/// Where the Ethernet source address starts.
pub const SOURCE_MAC_OFFSET: usize = 6;
const ETHERTYPE_OFFSET: usize = 12;
const VLAN_TAG_LEN: usize = 4;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;

const IPV4_MIN_HEADER_LEN: usize = 20;
const IPV4_SRC_OFFSET: usize = 12;
const IPV4_DST_OFFSET: usize = 16;
// Both addresses are read as two consecutive words.
const _: () = assert!(IPV4_DST_OFFSET == IPV4_SRC_OFFSET + 4);

const IPV6_HEADER_LEN: usize = 40;
const IPV6_NEXT_HEADER_OFFSET: usize = 6;
const IPV6_SRC_OFFSET: usize = 8;
const IPV6_DST_OFFSET: usize = 24;
const IPPROTO_ICMPV6: u8 = 58;

// IPv6 extension headers the chain walk steps over.
const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;
const IPV6_FRAGMENT_HEADER_LEN: usize = 8;
/// Offset bits of the fragment header's offset/flags word.
const IPV6_FRAGMENT_OFFSET_MASK: u16 = 0xfff8;

/// Extension headers walked before ICMPv6 at most. Real stacks send one to three (hop-by-hop
/// for MLD, a fragment header, destination options); a longer chain is judged by its addresses
/// only. Each step costs a few instructions, and the bound keeps the verifier's walk finite.
pub const IPV6_EXT_HEADERS_MAX: u32 = 8;

const ICMPV6_NS: u8 = 135;
const ICMPV6_NA: u8 = 136;
const NDP_TARGET_OFFSET: usize = 8;

const ARP_LEN: usize = 28;
const ARP_HTYPE_ETHERNET: u16 = 1;
const ARP_SENDER_IP_OFFSET: usize = 14;
const ARP_TARGET_IP_OFFSET: usize = 24;
const ARP_OP_OFFSET: usize = 6;
pub const ARP_OP_REQUEST: u16 = 1;

/// The linear bytes of a packet: `[start, end)`.
pub struct Frame {
    start: usize,
    end: usize,
}

impl Frame {
    #[inline(always)]
    pub fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    #[inline(always)]
    pub fn len(&self) -> u32 {
        (self.end - self.start) as u32
    }

    /// Whether `len` bytes from `offset` lie inside the packet: a bounds check that copies
    /// nothing (reading a whole header just to check it is there costs stack and loads).
    #[inline(always)]
    fn holds(&self, offset: usize, len: usize) -> Option<()> {
        if self.start + offset + len > self.end {
            return None;
        }
        Some(())
    }

    /// Reads `N` words of wire bytes (in memory order) at `offset`, if they lie inside the
    /// packet, with one 4-byte load each.
    ///
    /// The address fields of IPv4 and IPv6 sit 2 bytes off a 4-byte boundary behind a 14-byte
    /// Ethernet header, and the BPF target has no misaligned loads: `read_unaligned` becomes
    /// one load, spill and shift per byte (32 of them for an IPv6 packet's two addresses, most
    /// of the IPv6 pass path's cost). The kernel runs these programs only where misaligned
    /// access is efficient or the verifier aligns packet data (`NET_IP_ALIGN`), and it lets
    /// 4-byte packet loads through at any offset; a word-wide load is what the hardware does.
    #[inline(always)]
    fn load_words<const N: usize>(&self, offset: usize) -> Option<[u32; N]> {
        let at = self.start + offset;
        if at + 4 * N > self.end {
            return None;
        }
        let mut words = [0u32; N];
        let mut i = 0;
        while i < N {
            // SAFETY: inside the packet (checked above); see above for the alignment.
            words[i] = unsafe { core::ptr::read((at + 4 * i) as *const u32) };
            i += 1;
        }
        Some(words)
    }

    /// Reads a `T` at `offset`, if the whole of it lies inside the packet.
    #[inline(always)]
    pub fn load<T: Copy>(&self, offset: usize) -> Option<T> {
        let at = self.start + offset;
        if at + size_of::<T>() > self.end {
            return None;
        }
        // Headers are not aligned for T in general (the Ethernet header is 14 bytes).
        Some(unsafe { core::ptr::read_unaligned(at as *const T) })
    }
}

/// What kind of packet, and so which of [`Packet`]'s addresses mean something.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// IPv4 or IPv6 (including ICMPv6 other than NS/NA, and fragments): `src`, `dst`.
    Ip,
    /// ARP over Ethernet for IPv4: `src` is the sender, `target` the target, `op` the opcode.
    Arp,
    /// ICMPv6 neighbour solicitation: `src`, `dst`, `target`.
    Solicitation,
    /// ICMPv6 neighbour advertisement: `src`, `dst`, `target`.
    Advertisement,
}

/// The addresses a packet carries. A flat struct whose every field is written on every path,
/// not an enum: LLVM reloads the spilled payload of an enum's other variants before it
/// branches on the variant, and verifiers before 6.5 refuse that read of stack nothing wrote
/// ("invalid read from stack"), which would keep the programs off 5.10 and 6.1.
#[derive(Clone, Copy)]
pub struct Packet {
    pub kind: Kind,
    pub src: AddrKey,
    /// Unused (zero) for ARP.
    pub dst: AddrKey,
    /// The ARP or NDP target; zero for plain IP.
    pub target: AddrKey,
    /// The ARP opcode in host order; zero otherwise.
    pub op: u16,
}

impl Packet {
    #[inline(always)]
    fn ip(src: AddrKey, dst: AddrKey) -> Self {
        Self {
            kind: Kind::Ip,
            src,
            dst,
            target: AddrKey::default(),
            op: 0,
        }
    }
}

/// The parse of a frame. The source MAC is not part of it: only a sample reports it, and a
/// sample reads it from the frame itself ([`SOURCE_MAC_OFFSET`]), so no packet pays for the copy.
pub struct Parsed {
    pub packet: Packet,
    /// An IPv6 extension-header chain or ICMPv6 message ran past the end of the frame's linear
    /// bytes, so only the addresses were judged: a TC program pulls more and parses again.
    pub cut: bool,
}

#[inline(always)]
fn is_vlan(ethertype: u16) -> bool {
    ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD
}

#[inline(always)]
pub fn parse(frame: &Frame) -> Option<Parsed> {
    let mut ethertype_at = ETHERTYPE_OFFSET;
    let mut ethertype = u16::from_be(frame.load::<u16>(ethertype_at)?);
    // Outer (802.1ad or 802.1Q) and inner tag; a third tag is not parsed and passes.
    if is_vlan(ethertype) {
        ethertype_at += VLAN_TAG_LEN;
        ethertype = u16::from_be(frame.load::<u16>(ethertype_at)?);
        if is_vlan(ethertype) {
            ethertype_at += VLAN_TAG_LEN;
            ethertype = u16::from_be(frame.load::<u16>(ethertype_at)?);
        }
    }
    let l3 = ethertype_at + (ETH_HEADER_LEN - ETHERTYPE_OFFSET);
    let (packet, cut) = match ethertype {
        ETH_P_IP => (parse_ipv4(frame, l3)?, false),
        ETH_P_IPV6 => parse_ipv6(frame, l3)?,
        ETH_P_ARP => (parse_arp(frame, l3)?, false),
        _ => return None,
    };
    Some(Parsed { packet, cut })
}

#[inline(always)]
fn parse_ipv4(frame: &Frame, l3: usize) -> Option<Packet> {
    // The whole minimal header must be there, not just the addresses.
    frame.holds(l3, IPV4_MIN_HEADER_LEN)?;
    let version: u8 = frame.load(l3)?;
    if version >> 4 != 4 {
        return None;
    }
    let [src, dst] = frame.load_words::<2>(l3 + IPV4_SRC_OFFSET)?;
    Some(Packet::ip(
        AddrKey::from_v4_wire(src),
        AddrKey::from_v4_wire(dst),
    ))
}

/// The packet, and whether its chain or ICMPv6 message was cut by the end of the frame.
#[inline(always)]
fn parse_ipv6(frame: &Frame, l3: usize) -> Option<(Packet, bool)> {
    frame.holds(l3, IPV6_HEADER_LEN)?;
    let version: u8 = frame.load(l3)?;
    if version >> 4 != 6 {
        return None;
    }
    let src = AddrKey::from_v6_wire(frame.load_words(l3 + IPV6_SRC_OFFSET)?);
    let dst = AddrKey::from_v6_wire(frame.load_words(l3 + IPV6_DST_OFFSET)?);
    let ip = Packet::ip(src, dst);
    let first: u8 = frame.load(l3 + IPV6_NEXT_HEADER_OFFSET)?;
    // Whatever the chain holds, the addresses of a complete fixed header are judged: a broken
    // or over-long chain must not let a packet skip its source check.
    let l4 = match upper_layer(frame, first, l3 + IPV6_HEADER_LEN, IPPROTO_ICMPV6) {
        Walk::Found(l4) => l4,
        Walk::Elsewhere => return Some((ip, false)),
        Walk::Cut => return Some((ip, true)),
    };
    // Type and code as one 2-byte read: the verifier grants no range for a 1-byte read at a
    // variable offset checked as `at < end` (which is what LLVM makes of `at + 1 <= end`).
    let kind = match frame.load::<[u8; 2]>(l4) {
        Some([ICMPV6_NS, _]) => Kind::Solicitation,
        Some([ICMPV6_NA, _]) => Kind::Advertisement,
        Some(_) => return Some((ip, false)),
        None => return Some((ip, true)),
    };
    // A neighbour message cut before the end of its target: judged by its addresses.
    let Some(target) = frame.load_words(l4 + NDP_TARGET_OFFSET) else {
        return Some((ip, true));
    };
    let target = AddrKey::from_v6_wire(target);
    Some((
        Packet {
            kind,
            src,
            dst,
            target,
            op: 0,
        },
        false,
    ))
}

/// Where a walk of the extension-header chain ended.
enum Walk {
    /// At the wanted upper-layer header, which starts at this offset.
    Found(usize),
    /// At another upper layer, a non-first fragment, or past the bound.
    Elsewhere,
    /// At the end of the frame, inside the chain.
    Cut,
}

/// Whether the chain walk steps over `next`. Anything else is an upper layer (or no next
/// header, 59, or ESP, whose payload is encrypted) and ends the walk.
#[inline(always)]
fn is_extension_header(next: u8) -> bool {
    matches!(
        next,
        IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT
    )
}

/// Walks the extension headers from `next` (the fixed header's next-header field), the first
/// of them at `at`, to the `wanted` upper-layer header, within [`IPV6_EXT_HEADERS_MAX`]
/// complete headers. A non-first fragment carries no upper-layer header at all (its bytes are
/// the middle of a payload), so it leads elsewhere.
#[inline(always)]
fn upper_layer(frame: &Frame, mut next: u8, mut at: usize, wanted: u8) -> Walk {
    for _ in 0..IPV6_EXT_HEADERS_MAX {
        if next == wanted {
            return Walk::Found(at);
        }
        // Most packets (TCP, UDP) have no extension header: leave before reading anything.
        if !is_extension_header(next) {
            return Walk::Elsewhere;
        }
        let Some(header) = frame.load::<[u8; 2]>(at) else {
            return Walk::Cut;
        };
        let len = match next {
            IPPROTO_FRAGMENT => {
                let Some(offset) = frame.load::<u16>(at + 2) else {
                    return Walk::Cut;
                };
                if u16::from_be(offset) & IPV6_FRAGMENT_OFFSET_MASK != 0 {
                    return Walk::Elsewhere;
                }
                IPV6_FRAGMENT_HEADER_LEN
            }
            // RFC 4302: the length is in 4-byte units, minus 2.
            IPPROTO_AH => (header[1] as usize + 2) * 4,
            // Hop-by-hop, routing, destination options: 8-byte units, minus 1.
            _ => (header[1] as usize + 1) * 8,
        };
        next = header[0];
        at += len;
    }
    if next == wanted {
        Walk::Found(at)
    } else {
        Walk::Elsewhere
    }
}

#[inline(always)]
fn parse_arp(frame: &Frame, l3: usize) -> Option<Packet> {
    frame.holds(l3, ARP_LEN)?;
    let htype = u16::from_be(frame.load(l3)?);
    let ptype = u16::from_be(frame.load(l3 + 2)?);
    let lengths: [u8; 2] = frame.load(l3 + 4)?;
    if htype != ARP_HTYPE_ETHERNET || ptype != ETH_P_IP || lengths != [6, 4] {
        return None;
    }
    let op = u16::from_be(frame.load(l3 + ARP_OP_OFFSET)?);
    let [sender] = frame.load_words(l3 + ARP_SENDER_IP_OFFSET)?;
    let [target] = frame.load_words(l3 + ARP_TARGET_IP_OFFSET)?;
    Some(Packet {
        kind: Kind::Arp,
        src: AddrKey::from_v4_wire(sender),
        dst: AddrKey::default(),
        target: AddrKey::from_v4_wire(target),
        op,
    })
}
