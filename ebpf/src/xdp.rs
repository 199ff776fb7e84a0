//! XDP program of uplinks: drops stale traffic for quarantined addresses and reports remote
//! claims (another machine announcing an address a holder here still has).

use aya_ebpf::programs::XdpContext;
use ipq_common::{
    addr::AddrKey,
    counters::Hook,
    verdict::{uplink_announces, uplink_receives},
};

use crate::{
    act::{act, Seen},
    maps,
    parse::{parse, Frame, Kind, ARP_OP_REQUEST},
    Verdict,
};

#[inline(always)]
pub fn try_uplink(ctx: &XdpContext) -> Verdict {
    let frame = Frame::new(ctx.data(), ctx.data_end());
    let Some(parsed) = parse(&frame) else {
        return Verdict::Pass;
    };
    let seen = Seen {
        ctx,
        hook: Hook::Xdp,
        len: frame.len(),
    };
    let packet = parsed.packet;
    match packet.kind {
        Kind::Ip => stale(&seen, &packet.dst),
        Kind::Arp => {
            claim(&seen, &packet.src);
            if packet.op == ARP_OP_REQUEST {
                // Someone still resolving a quarantined address: stale traffic too.
                stale(&seen, &packet.target)
            } else {
                Verdict::Pass
            }
        }
        Kind::Advertisement => {
            claim(&seen, &packet.target);
            Verdict::Pass
        }
        Kind::Solicitation => {
            if packet.src == AddrKey::UNSPECIFIED {
                // Duplicate address detection: the sender is about to use `target`.
                claim(&seen, &packet.target);
                Verdict::Pass
            } else {
                stale(&seen, &packet.target)
            }
        }
    }
}

#[inline(always)]
fn stale(seen: &Seen<XdpContext>, addr: &AddrKey) -> Verdict {
    // The pass path: one inlined array read, no table probe, for every address not quarantined.
    if !maps::maybe_quarantined(addr) {
        return Verdict::Pass;
    }
    let Some(found) = maps::addr_entry(addr) else {
        return Verdict::Pass;
    };
    match uplink_receives(&found.entry) {
        Some(reason) => act(seen, addr, &found, reason),
        None => Verdict::Pass,
    }
}

#[inline(always)]
fn claim(seen: &Seen<XdpContext>, addr: &AddrKey) {
    if let Some(found) = maps::addr_entry(addr) {
        if let Some(reason) = uplink_announces(&found.entry) {
            // A remote claim is reported, never dropped: the verdict is always Pass.
            let _ = act(seen, addr, &found, reason);
        }
    }
}
