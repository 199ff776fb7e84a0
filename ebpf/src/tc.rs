//! TC programs of workload interfaces. Ingress judges what the workload sends (its source
//! address, the sender of its ARP, the target of its neighbour advertisements); egress judges
//! what it receives (the destination address).

use aya_ebpf::programs::TcContext;
use ipq_common::{
    addr::AddrKey,
    counters::Hook,
    iface::IfaceEntry,
    verdict::{workload_receives, workload_sends},
};

use crate::{
    act::{act, Seen},
    maps,
    parse::{parse, Frame, NeighborKind, Packet},
    Verdict,
};

/// Headers ipq reads at most: Ethernet, two VLAN tags, IPv6, a chain of extension headers,
/// ICMPv6 up to the NDP target. Extension headers are 8 bytes or more each (up to 2 KiB);
/// 512 bytes holds any chain a real stack sends, and a pull only happens for a non-linear skb.
const HEADERS_MAX: u32 = 512;

#[inline(always)]
pub fn try_workload(ctx: &TcContext, hook: Hook) -> Verdict {
    pull_headers(ctx);
    let frame = Frame::new(ctx.data(), ctx.data_end());
    let Some(parsed) = parse(&frame) else {
        return Verdict::Pass;
    };
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let own = maps::iface_entry(ifindex);
    let seen = Seen {
        ctx,
        hook,
        ifindex,
        len: ctx.len(),
        src_mac: &parsed.src_mac,
    };
    match (hook, parsed.packet) {
        (Hook::TcIngress, Packet::Ip { src, .. }) => check(&seen, own, &src),
        (Hook::TcIngress, Packet::Arp { sender, .. }) => check(&seen, own, &sender),
        (
            Hook::TcIngress,
            Packet::Neighbor {
                kind, src, target, ..
            },
        ) => match check(&seen, own, &src) {
            Verdict::Drop => Verdict::Drop,
            Verdict::Pass if kind == NeighborKind::Advertisement => check(&seen, own, &target),
            Verdict::Pass => Verdict::Pass,
        },
        (_, Packet::Ip { dst, .. } | Packet::Neighbor { dst, .. }) => check(&seen, own, &dst),
        // ARP a workload receives is harmless: its answers are judged on ingress.
        _ => Verdict::Pass,
    }
}

/// Makes the headers linear when the skb is not: direct packet access sees only the head.
#[inline(always)]
fn pull_headers(ctx: &TcContext) {
    let linear = (ctx.data_end() - ctx.data()) as u32;
    let len = ctx.len();
    if linear < len && linear < HEADERS_MAX {
        let want = if len < HEADERS_MAX { len } else { HEADERS_MAX };
        // On failure the packet stays as it was and is parsed as far as it is linear.
        let _ = ctx.pull_data(want);
    }
}

#[inline(always)]
fn check(seen: &Seen<TcContext>, own: Option<&IfaceEntry>, addr: &AddrKey) -> Verdict {
    // The fast path: one of the interface's own conflict-free addresses.
    if let Some(own) = own {
        if own.owns(addr) {
            return Verdict::Pass;
        }
    }
    let Some(entry) = maps::addr_entry(addr) else {
        return Verdict::Pass;
    };
    let reason = match seen.hook {
        Hook::TcIngress => workload_sends(seen.ifindex, unsafe { &*entry }),
        _ => workload_receives(seen.ifindex, unsafe { &*entry }),
    };
    match reason {
        Some(reason) => act(seen, addr, entry, reason),
        None => Verdict::Pass,
    }
}
