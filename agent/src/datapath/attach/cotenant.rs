//! A co-tenant ahead of ipq: what another tool's filter (netlink) or program (TCX) that runs
//! before ipq's on a hook does with the packets of the addresses ipq protects there. The one
//! place that decides it ([`judge`]); the attacher turns the [`Verdict`] into the interface's
//! protection.
//!
//! Something ahead of ipq is a bypass only if it ends processing: a cls_bpf direct-action
//! filter that returns `TC_ACT_UNSPEC`, or a TCX program that returns `TCX_NEXT`, hands the
//! packet on, and ipq's program decides it as if nothing were there. What the kernel does with
//! such a packet is what decides, so the kernel is shown one ([`witness`]): a marked probe of
//! each address of the interface in `IPQ_ADDRS` (its holder's and those fenced there, as the
//! table's index of them has it) is put through the hook, from the address on ingress and to
//! it on egress, and ipq's program counts the probes that reach it. Every probe counted: the
//! things ahead hand packets on; one not counted: they end processing (dropped, redirected or
//! passed it); a probe that cannot be put through (an old kernel on ingress, a capability
//! refused): cannot tell, and why.
//!
//! A filter of another kind (u32, flower, matchall, ...) ends classification where it
//! matches: read structurally, never probed.
//!
//! Limits, said where the verdict is shown: the probe is a UDP datagram between the address
//! and a benchmarking address, with MACs of its own; a co-tenant that decides by port, peer,
//! MAC, protocol or time may treat real traffic otherwise. The verdict is judged again when the
//! hook or the interface's addresses change, and at least every [`REJUDGE_AFTER`] (a
//! co-tenant's policy maps change without notice).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use super::{
    tc_filter::{Direction, Filter},
    witness,
};
use crate::{datapath::table::by_interface, paths::AttachPoint};

/// What runs before ipq's program on a hook, in the order it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ahead {
    /// A clsact filter at a priority before ipq's (netlink mode).
    Filter(Filter),
    /// A TCX program before ipq's link: its id.
    Program(u32),
}

impl Ahead {
    fn describe(&self) -> String {
        match self {
            Self::Filter(filter) => filter.describe(),
            Self::Program(id) => format!("TCX program id {id}"),
        }
    }
}

/// What the things ahead of ipq's program on a hook do with the protected addresses' packets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every packet tried was handed on: ipq's program decides them. Says what and how.
    HandsOn(String),
    /// One ends processing for a packet tried: what it decides never reaches ipq's program.
    EndsProcessing(String),
    /// Could not be told, and why.
    CannotTell(String),
}

impl Verdict {
    /// The label of `ipq_datapath_cotenants_ahead{verdict}`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::HandsOn(_) => "hands_on",
            Self::EndsProcessing(_) => "ends_processing",
            Self::CannotTell(_) => "cannot_tell",
        }
    }

    pub fn why(&self) -> &str {
        match self {
            Self::HandsOn(why) | Self::EndsProcessing(why) | Self::CannotTell(why) => why,
        }
    }

    /// Whether ipq's program still sees every packet tried.
    pub fn hands_on(&self) -> bool {
        matches!(self, Self::HandsOn(_))
    }
}

/// A verdict, and what it was reached on: judged again when either changes, or when it is
/// older than [`REJUDGE_AFTER`].
struct Judged {
    ahead: Vec<Ahead>,
    addresses: Vec<IpAddr>,
    verdict: Verdict,
    at: Instant,
}

/// How long a verdict holds without a change of the hook or the addresses: what a co-tenant
/// does may change with its own maps, which announce nothing. Minutes: one probe per address
/// and hook each time, at the next look (a verification or a TC notice).
pub const REJUDGE_AFTER: Duration = Duration::from_secs(300);

/// The last verdict per hook: the workers' and the verification's looks share it, so a hook is
/// probed once per change of what runs ahead or of the interface's addresses (and every
/// [`REJUDGE_AFTER`]), not at every pass. A verdict that could not be told is not kept.
static JUDGED: Mutex<BTreeMap<(u32, AttachPoint), Judged>> = Mutex::new(BTreeMap::new());

fn judged() -> MutexGuard<'static, BTreeMap<(u32, AttachPoint), Judged>> {
    JUDGED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Forgets the verdicts of an interface that went (its ifindex may come back as another).
pub fn forget(ifindex: u32) {
    judged().retain(|(i, _), _| *i != ifindex);
}

/// Forgets every verdict: what the probes counted may have been written by another process
/// (`IPQ_PROBES` written), so each hook with something ahead is probed again at its next look.
pub fn forget_all() {
    judged().clear();
}

/// What `ahead` (what runs before ipq's program on `point` of `ifindex`, in order) does with
/// the packets of the interface's addresses in `IPQ_ADDRS`. Off the owner loop: a look at
/// the table's index and, when the hook or the addresses changed, a probe per address.
pub fn judge(ifindex: u32, point: AttachPoint, ahead: &[Ahead]) -> Verdict {
    let addresses = by_interface::of(ifindex);
    if let Some(known) = judged().get(&(ifindex, point)) {
        if known.ahead == ahead
            && known.addresses == addresses
            && known.at.elapsed() < REJUDGE_AFTER
        {
            return known.verdict.clone();
        }
    }
    let verdict = decide(ifindex, point, ahead, &addresses);
    // What could not be told is asked again at the next look (a failed probe costs a system
    // call or two): a passing fault must not leave the interface unverified for good.
    if matches!(verdict, Verdict::CannotTell(_)) {
        judged().remove(&(ifindex, point));
        return verdict;
    }
    judged().insert(
        (ifindex, point),
        Judged {
            ahead: ahead.to_vec(),
            addresses,
            verdict: verdict.clone(),
            at: Instant::now(),
        },
    );
    verdict
}

/// The hook's name as its mechanism names it: `tc-ingress` under filters, `tcx-ingress` under
/// TCX programs.
fn point_name(ahead: &[Ahead], point: AttachPoint) -> &'static str {
    match ahead.first() {
        Some(Ahead::Program(_)) => point.into(),
        _ => point.name_under_filter(),
    }
}

/// The verdict, from scratch: a filter whose kind ends classification decides at once; else,
/// when a program runs ahead, the probes of every address decide.
fn decide(ifindex: u32, point: AttachPoint, ahead: &[Ahead], addresses: &[IpAddr]) -> Verdict {
    let hook = point_name(ahead, point);
    let mut probed = Vec::new();
    for thing in ahead {
        match thing {
            Ahead::Filter(filter) if filter.kind != "bpf" => {
                return Verdict::EndsProcessing(format!(
                    "{hook}: {} runs before ipq's and ends processing: a {} filter's match \
                     ends classification (read from its kind)",
                    thing.describe(),
                    filter.kind
                ))
            }
            // A cls_bpf priority's chain head holds no program.
            Ahead::Filter(filter) if filter.handle == 0 => {}
            _ => probed.push(thing.describe()),
        }
    }
    if probed.is_empty() {
        return Verdict::HandsOn(format!(
            "{hook}: only empty filter chains run before ipq's (nothing to hand on)"
        ));
    }
    let (tried, placeholder) = if addresses.is_empty() {
        (vec![PLACEHOLDER_V4, PLACEHOLDER_V6], true)
    } else {
        (addresses.to_vec(), false)
    };
    let direction = Direction::of(point).unwrap_or(Direction::Ingress);
    let (from_or_to, runs) = (
        match direction {
            Direction::Ingress => "from",
            Direction::Egress => "to",
        },
        probed.join(", "),
    );
    for &address in &tried {
        match witness::reaches_ipq(ifindex, direction, address) {
            Ok(true) => {}
            Ok(false) => {
                return Verdict::EndsProcessing(format!(
                    "{hook}: {runs} runs before ipq's and ends processing: a probe {from_or_to} \
                     {address} never reached ipq's program"
                ))
            }
            Err(why) => {
                return Verdict::CannotTell(format!(
                    "{hook}: {runs} runs before ipq's and what it does with the protected \
                     addresses' packets cannot be told: {why}"
                ))
            }
        }
    }
    let on = if placeholder {
        "a placeholder address (none of ipq's on the interface yet)".to_owned()
    } else {
        list(&tried)
    };
    Verdict::HandsOn(format!(
        "{hook}: {runs} runs before ipq's and hands packets on (a probe {from_or_to} {on} \
         reached ipq's program)"
    ))
}

fn list(addresses: &[IpAddr]) -> String {
    addresses
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a probe carries when the interface has no address of ipq's yet (documentation
/// ranges, RFC 5737 and 3849).
const PLACEHOLDER_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const PLACEHOLDER_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(kind: &str, handle: u32) -> Filter {
        Filter {
            priority: 1,
            handle,
            kind: kind.to_owned(),
            program: None,
            program_id: None,
            direct_action: false,
            opaque: false,
        }
    }

    #[test]
    fn a_filter_of_another_kind_ends_processing_without_a_probe() {
        let verdict = decide(
            1,
            AttachPoint::TcxIngress,
            &[Ahead::Filter(filter("u32", 0x800))],
            &[],
        );
        assert!(
            matches!(&verdict, Verdict::EndsProcessing(why) if why.contains("u32 filter")),
            "{verdict:?}"
        );
    }

    #[test]
    fn only_empty_chains_ahead_hand_on_without_a_probe() {
        let verdict = decide(
            1,
            AttachPoint::TcxEgress,
            &[Ahead::Filter(filter("bpf", 0))],
            &[],
        );
        assert!(verdict.hands_on(), "{verdict:?}");
    }

    #[test]
    fn a_program_ahead_cannot_be_told_without_the_datapath_that_counts_probes() {
        // No datapath is loaded in a unit test: no probe can be counted, and that is said.
        let verdict = decide(1, AttachPoint::TcxEgress, &[Ahead::Program(42)], &[]);
        assert!(
            matches!(&verdict, Verdict::CannotTell(why) if why.contains("not loaded its datapath")),
            "{verdict:?}"
        );
    }
}
