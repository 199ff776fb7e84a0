//! Co-tenant probes (`ipq_common::probe`): the agent's marked datagrams, sent through a hook to
//! learn whether another tool's filter or program ahead of ipq's hands packets on. Counted in
//! `IPQ_PROBES` and dropped, before any verdict: never delivered, never counted as fenced.
//!
//! Every packet pays one compare of a word it has already loaded (the last word of the probe's
//! other end); only a packet of that address (a benchmarking address no workload talks to)
//! reads the rest of the mark.

use aya_ebpf::programs::TcContext;
use ipq_common::{
    addr::AddrKey,
    counters::Hook,
    probe::{
        ProbeMark, PROBE_MARK_OFFSET_V4, PROBE_MARK_OFFSET_V6, PROBE_PEER_V6, PROBE_PEER_WORD,
        PROBE_PORT,
    },
};

use crate::{maps, parse::Frame, parse::Packet};

const ETH_P_IP_WIRE: u16 = 0x0800u16.to_be();
const ETH_P_IPV6_WIRE: u16 = 0x86DDu16.to_be();
const IPPROTO_UDP: u8 = 17;

/// The end of a packet that is not the workload's: where a probe carries its mark.
#[inline(always)]
fn peer(hook: Hook, packet: &Packet) -> &AddrKey {
    match hook {
        Hook::TcIngress => &packet.dst,
        _ => &packet.src,
    }
}

/// The hot path's whole cost: whether the packet's other end may be the probe's.
#[inline(always)]
pub fn may_be_probe(hook: Hook, packet: &Packet) -> bool {
    peer(hook, packet).words[3] == PROBE_PEER_WORD
}

/// Whether the packet is the agent's probe for this hook of `ifindex`: counted if so.
#[inline(always)]
pub fn seen(ctx: &TcContext, hook: Hook, packet: &Packet, ifindex: u32) -> bool {
    let frame = Frame::new(ctx.data(), ctx.data_end());
    let peer = peer(hook, packet);
    // Each family reads at constant offsets (the agent sends probes untagged): no packet
    // pointer with a variable offset for the verifier to bound.
    let mark = match frame.load::<u16>(12) {
        Some(ETH_P_IP_WIRE) => v4_mark(&frame, peer),
        Some(ETH_P_IPV6_WIRE) => v6_mark(&frame, peer),
        _ => None,
    };
    let Some(mark) = mark else {
        return false;
    };
    let cookie = maps::probe_cookie();
    if cookie == 0 || mark.cookie != cookie || mark.ifindex != ifindex || mark.hook != hook as u32 {
        return false;
    }
    maps::count_probe(hook);
    true
}

/// The mark of an IPv4 probe (no options, UDP to the probe's port), if the packet is one.
#[inline(always)]
fn v4_mark(frame: &Frame, peer: &AddrKey) -> Option<ProbeMark> {
    if *peer != AddrKey::from_v4_wire(PROBE_PEER_WORD)
        || frame.load::<u8>(14)? != 0x45
        || frame.load::<u8>(14 + 9)? != IPPROTO_UDP
        || frame.load::<u16>(14 + 20 + 2)? != PROBE_PORT.to_be()
    {
        return None;
    }
    frame.load(PROBE_MARK_OFFSET_V4)
}

/// The mark of an IPv6 probe (UDP right behind the fixed header), if the packet is one.
#[inline(always)]
fn v6_mark(frame: &Frame, peer: &AddrKey) -> Option<ProbeMark> {
    if *peer != AddrKey::from_v6_wire(v6_words())
        || frame.load::<u8>(14 + 6)? != IPPROTO_UDP
        || frame.load::<u16>(14 + 40 + 2)? != PROBE_PORT.to_be()
    {
        return None;
    }
    frame.load(PROBE_MARK_OFFSET_V6)
}

#[inline(always)]
fn v6_words() -> [u32; 4] {
    let b = PROBE_PEER_V6;
    [
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
        u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
    ]
}
