//! The floors of the drop paths, for the benchmark only (the agent never loads them): the
//! same parse, the same filters and the same hash lookup as the real programs, and nothing
//! else. A drop costs at least this much whatever ipq does with the packet afterwards (count
//! it, stamp it, sample it), so the benchmark reports every drop against its floor as well as
//! against the empty program.

use aya_ebpf::programs::{TcContext, XdpContext};
use ipq_common::addr::AddrKey;

use crate::{
    maps,
    parse::{parse, Frame, Kind},
    tc::{pull_headers, HEADERS_MIN},
    Verdict,
};

/// Drops the packet when its address has an entry at all.
#[inline(always)]
fn found(addr: &AddrKey) -> Verdict {
    match maps::addr_entry(addr) {
        Some(_) => Verdict::Drop,
        None => Verdict::Pass,
    }
}

/// The workload ingress check of an IP packet's source: its interface's own slot, then the map.
#[inline(always)]
pub fn tc(ctx: &TcContext) -> Verdict {
    pull_headers(ctx, HEADERS_MIN);
    let Some(parsed) = parse(&Frame::new(ctx.data(), ctx.data_end())) else {
        return Verdict::Pass;
    };
    if parsed.packet.kind != Kind::Ip {
        return Verdict::Pass;
    }
    if let Some(own) = maps::iface_entry(crate::tc::ifindex(ctx)) {
        if own.owns(&parsed.packet.src) {
            return Verdict::Pass;
        }
    }
    found(&parsed.packet.src)
}

/// The uplink check of an IP packet's destination: the quarantine filter, then the map.
#[inline(always)]
pub fn xdp(ctx: &XdpContext) -> Verdict {
    let Some(parsed) = parse(&Frame::new(ctx.data(), ctx.data_end())) else {
        return Verdict::Pass;
    };
    if parsed.packet.kind != Kind::Ip || !maps::maybe_quarantined(&parsed.packet.dst) {
        return Verdict::Pass;
    }
    found(&parsed.packet.dst)
}
