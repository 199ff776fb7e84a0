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
    parse::{parse, Frame, Kind},
    probe, Verdict,
};

/// Headers every packet needs linear: Ethernet, two VLAN tags, IPv6, ICMPv6 up to the NDP
/// target. A non-linear skb (a GSO flow's head holds little more) pulls this much.
pub const HEADERS_MIN: u32 = 14 + 8 + 40 + 24;
/// With an extension-header chain in front of ICMPv6 (8 bytes to 2 KiB each): 512 bytes holds
/// any chain a real stack sends. Pulled only when a parse was cut short by the linear end, so
/// a pod cannot hide an advertisement behind a chain in a head it made short on purpose.
const HEADERS_MAX: u32 = 512;

#[inline(always)]
pub fn try_workload(ctx: &TcContext, hook: Hook) -> Verdict {
    pull_headers(ctx, HEADERS_MIN);
    let Some(mut parsed) = parse(&Frame::new(ctx.data(), ctx.data_end())) else {
        return Verdict::Pass;
    };
    if parsed.cut && pull_headers(ctx, HEADERS_MAX) {
        // The pull moved the packet: every earlier pointer into it is gone. Parse again.
        match parse(&Frame::new(ctx.data(), ctx.data_end())) {
            Some(again) => parsed = again,
            None => return Verdict::Pass,
        }
    }
    let ifindex = ifindex(ctx);
    let packet = parsed.packet;
    // The agent's co-tenant probe: counted and dropped before any verdict.
    if probe::may_be_probe(hook, &packet) && probe::seen(ctx, hook, &packet, ifindex) {
        return Verdict::Drop;
    }
    let own = maps::iface_entry(ifindex);
    let seen = Seen {
        ctx,
        hook,
        len: ctx.len(),
    };
    match (hook, packet.kind) {
        // What the workload sends: its source address (the sender of its ARP), and the target
        // of what it advertises.
        (Hook::TcIngress, Kind::Ip | Kind::Arp | Kind::Solicitation) => {
            check(&seen, ifindex, own, &packet.src)
        }
        (Hook::TcIngress, Kind::Advertisement) => match check(&seen, ifindex, own, &packet.src) {
            Verdict::Drop => Verdict::Drop,
            Verdict::Pass => check(&seen, ifindex, own, &packet.target),
        },
        // ARP a workload receives is harmless: its answers are judged on ingress.
        (_, Kind::Arp) => Verdict::Pass,
        (_, Kind::Ip | Kind::Solicitation | Kind::Advertisement) => {
            check(&seen, ifindex, own, &packet.dst)
        }
    }
}

/// The interface the program runs on: a plain load of the context's field (the sample path
/// reads it its own way, `act::Hooked::ifindex`).
#[inline(always)]
pub fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: the context of a running program.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Makes up to `max` bytes of headers linear when the skb is not (direct packet access sees
/// only the head); returns whether it pulled.
#[inline(always)]
pub fn pull_headers(ctx: &TcContext, max: u32) -> bool {
    let linear = (ctx.data_end() - ctx.data()) as u32;
    let len = ctx.len();
    if linear < len && linear < max {
        let want = if len < max { len } else { max };
        // On failure the packet stays as it was and is parsed as far as it is linear.
        return ctx.pull_data(want).is_ok();
    }
    false
}

#[inline(always)]
fn check(
    seen: &Seen<TcContext>,
    ifindex: u32,
    own: Option<&IfaceEntry>,
    addr: &AddrKey,
) -> Verdict {
    // The fast path: one of the interface's own conflict-free addresses.
    if let Some(own) = own {
        if own.owns(addr) {
            return Verdict::Pass;
        }
    }
    let Some(found) = maps::addr_entry(addr) else {
        return Verdict::Pass;
    };
    let reason = match seen.hook {
        Hook::TcIngress => workload_sends(ifindex, &found.entry),
        _ => workload_receives(ifindex, &found.entry),
    };
    match reason {
        Some(reason) => act(seen, addr, &found, reason),
        None => Verdict::Pass,
    }
}
