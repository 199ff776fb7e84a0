//! A co-tenant ahead of ipq: what another tool's filter (netlink) or program (TCX) that runs
//! before ipq's on a hook does with the packets of the addresses ipq protects there. The one
//! place that decides it ([`judge`]); the attacher turns the [`Verdict`] into the interface's
//! protection.
//!
//! Something ahead of ipq is a bypass only if it ends processing: a cls_bpf direct-action
//! filter that returns `TC_ACT_UNSPEC`, or a TCX program that returns `TCX_NEXT`, hands the
//! packet on, and ipq's program decides it as if nothing were there. What a program returns
//! cannot be read off the hook, so it is asked: the program is run (`BPF_PROG_TEST_RUN`, no
//! packet leaves the kernel's test harness) on a packet of each address of the interface in
//! `IPQ_ADDRS` (its holder's and those fenced there, as the table's index of them has it), in
//! the hook's direction, on the interface itself (`__sk_buff.ifindex`), and what it returns
//! decides:
//!
//! - a filter of another kind (u32, flower, matchall, ...) ends classification where it
//!   matches: read structurally, never run;
//! - a cls_bpf filter in direct-action mode hands on `TC_ACT_UNSPEC` and every code cls_bpf
//!   maps to it; `TC_ACT_OK`, `SHOT`, `STOLEN`, `TRAP` and `REDIRECT` end classification. Not
//!   in direct-action mode, its program returns a class: 0 is no match (hands on), anything
//!   else a match, which ends classification;
//! - a TCX program hands on `TCX_NEXT` only: any other code ends the chain.
//!
//! Limits, said where the verdict is shown: the run takes the program's own maps as they are
//! now (a policy that changes later is judged again only when the hook or the interface's
//! addresses change), and may write to them as a real packet would (a conntrack entry of the
//! probe's flow); a program whose verdict depends on more than the addresses (ports, MACs,
//! time) is judged on one packet per address; the run needs the program's descriptor, which
//! only `BPF_PROG_GET_FD_BY_ID` gives, and the kernel allows that with `CAP_SYS_ADMIN` only:
//! without it (ipq's DaemonSet does not grant it) the verdict is [`Verdict::CannotTell`], and
//! the interface is reported `unverified`, not ready, until the co-tenant goes or the agent
//! may run it. A classic BPF filter (no program id) and a cls_bpf filter with actions of its
//! own cannot be told either.

use std::{
    collections::BTreeMap,
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{Mutex, MutexGuard},
};

use super::tc_filter::{Direction, Filter};
use crate::{
    datapath::{bpf_call::bpf, table::by_interface},
    paths::AttachPoint,
};

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

/// A verdict, and what it was reached on: judged again only when either changes.
struct Judged {
    ahead: Vec<Ahead>,
    addresses: Vec<IpAddr>,
    verdict: Verdict,
}

/// The last verdict per hook: the workers' and the verification's looks share it, so a
/// co-tenant's program is run once per change of the hook or of the interface's addresses,
/// not at every pass. A verdict that could not be told is not kept.
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

/// What `ahead` (what runs before ipq's program on `point` of `ifindex`, in order) does with
/// the packets of the interface's addresses in `IPQ_ADDRS`. Off the owner loop: a look at
/// the table's index and, when the hook or the addresses changed, a few program runs.
pub fn judge(ifindex: u32, point: AttachPoint, ahead: &[Ahead]) -> Verdict {
    let addresses = by_interface::of(ifindex);
    if let Some(known) = judged().get(&(ifindex, point)) {
        if known.ahead == ahead && known.addresses == addresses {
            return known.verdict.clone();
        }
    }
    let verdict = decide(ifindex, point, ahead, &addresses);
    // What could not be told is asked again at the next look (a failed run costs a system
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

/// The verdict, from scratch: the first that ends processing decides; else the first that
/// cannot be told; else everything ahead hands on.
fn decide(ifindex: u32, point: AttachPoint, ahead: &[Ahead], addresses: &[IpAddr]) -> Verdict {
    let hook = point_name(ahead, point);
    let (tried, placeholder) = if addresses.is_empty() {
        (vec![PLACEHOLDER_V4, PLACEHOLDER_V6], true)
    } else {
        (addresses.to_vec(), false)
    };
    let direction = Direction::of(point).unwrap_or(Direction::Ingress);
    let mut handed_on = Vec::new();
    let mut unknown = None;
    for thing in ahead {
        match one(ifindex, direction, thing, &tried) {
            Ok(Outcome::HandsOn(how)) => handed_on.push(format!("{} ({how})", thing.describe())),
            Ok(Outcome::Skip) => {}
            Ok(Outcome::Ends(how)) => {
                return Verdict::EndsProcessing(format!(
                    "{hook}: {} runs before ipq's and ends processing: {how}",
                    thing.describe()
                ))
            }
            Err(why) => {
                unknown.get_or_insert_with(|| {
                    format!(
                        "{hook}: {} runs before ipq's and what it does with the protected \
                         addresses' packets cannot be told: {why}",
                        thing.describe()
                    )
                });
            }
        }
    }
    if let Some(why) = unknown {
        return Verdict::CannotTell(why);
    }
    if handed_on.is_empty() {
        return Verdict::HandsOn(format!(
            "{hook}: only empty filter chains run before ipq's (nothing to hand on)"
        ));
    }
    let on = if placeholder {
        "a placeholder address (none of ipq's on the interface yet)".to_owned()
    } else {
        list(&tried)
    };
    Verdict::HandsOn(format!(
        "{hook}: {} runs before ipq's and hands packets on (run on {on})",
        handed_on.join(", ")
    ))
}

fn list(addresses: &[IpAddr]) -> String {
    addresses
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What one thing ahead does with the packets tried.
enum Outcome {
    HandsOn(String),
    Ends(String),
    /// Holds no program (a cls_bpf priority's chain head): nothing to judge.
    Skip,
}

/// TC_ACT_UNSPEC / TCX_NEXT.
const NEXT: i32 = -1;

fn one(
    ifindex: u32,
    direction: Direction,
    thing: &Ahead,
    tried: &[IpAddr],
) -> Result<Outcome, String> {
    let (id, reading) = match thing {
        Ahead::Filter(filter) if filter.kind != "bpf" => {
            return Ok(Outcome::Ends(format!(
                "a {} filter's match ends classification (read from its kind, not run)",
                filter.kind
            )))
        }
        Ahead::Filter(filter) if filter.handle == 0 => return Ok(Outcome::Skip),
        Ahead::Filter(filter) if filter.opaque => {
            return Err(
                "a classic BPF program, or actions of its own, decide what it does; \
                        only an eBPF direct-action program can be run"
                    .to_owned(),
            )
        }
        Ahead::Filter(filter) => {
            let id = filter
                .program_id
                .ok_or_else(|| "the kernel did not list its program's id".to_owned())?;
            if filter.direct_action {
                (id, DIRECT_ACTION)
            } else {
                (id, CLASSIFIER)
            }
        }
        Ahead::Program(id) => (*id, TCX),
    };
    let prog = prog_fd_by_id(id).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => format!(
            "the agent cannot run program id {id}: BPF_PROG_GET_FD_BY_ID needs \
             CAP_SYS_ADMIN, which the agent does not have"
        ),
        Some(libc::ENOENT) => format!("program id {id} is gone"),
        _ => format!("opening program id {id}: {e}"),
    })?;
    let mut codes = Vec::new();
    for &address in tried {
        let frame = frame(address, direction);
        let code = test_run(&prog, &frame, ifindex, direction)
            .map_err(|e| format!("running program id {id} on a packet of {address}: {e}"))?;
        if !(reading.hands_on)(code) {
            return Ok(Outcome::Ends(format!(
                "{} for a packet {} {address}",
                (reading.name)(code),
                match direction {
                    Direction::Ingress => "from",
                    Direction::Egress => "to",
                }
            )));
        }
        codes.push((reading.name)(code));
    }
    codes.dedup();
    Ok(Outcome::HandsOn(codes.join(", ")))
}

/// How a return code is read, by what runs the program.
struct Reading {
    hands_on: fn(i32) -> bool,
    name: fn(i32) -> String,
}

/// A cls_bpf filter in direct-action mode: the code is a TC action.
const DIRECT_ACTION: Reading = Reading {
    hands_on: cls_bpf_hands_on,
    name: tc_act_name,
};
/// A cls_bpf filter in classifier mode: the code is a class, 0 no match.
const CLASSIFIER: Reading = Reading {
    hands_on: |code| code == 0,
    name: class_name,
};
/// A TCX program: only `TCX_NEXT` goes on to the next program.
const TCX: Reading = Reading {
    hands_on: |code| code == NEXT,
    name: tcx_name,
};

/// cls_bpf in direct-action mode (`cls_bpf_exec_opcode`): these end classification; any other
/// code becomes `TC_ACT_UNSPEC`, the next filter.
fn cls_bpf_hands_on(code: i32) -> bool {
    !matches!(code, 0 | 2 | 4 | 7 | 8)
}

fn tc_act_name(code: i32) -> String {
    match code {
        -1 => "TC_ACT_UNSPEC".to_owned(),
        0 => "TC_ACT_OK".to_owned(),
        1 => "TC_ACT_RECLASSIFY".to_owned(),
        2 => "TC_ACT_SHOT".to_owned(),
        3 => "TC_ACT_PIPE".to_owned(),
        4 => "TC_ACT_STOLEN".to_owned(),
        7 => "TC_ACT_REDIRECT".to_owned(),
        8 => "TC_ACT_TRAP".to_owned(),
        other => format!("return code {other}"),
    }
}

fn class_name(code: i32) -> String {
    match code {
        0 => "no match (class 0)".to_owned(),
        other => format!("a match (class {other:#x})"),
    }
}

fn tcx_name(code: i32) -> String {
    match code {
        -1 => "TCX_NEXT".to_owned(),
        0 => "TCX_PASS".to_owned(),
        2 => "TCX_DROP".to_owned(),
        7 => "TCX_REDIRECT".to_owned(),
        other => format!("return code {other}"),
    }
}

/// What a packet is tried on when the interface has no address of ipq's yet (documentation
/// ranges, RFC 5737 and 3849).
const PLACEHOLDER_V4: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const PLACEHOLDER_V6: IpAddr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1));
/// The other end of a packet tried (documentation ranges too).
const PEER_V4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const PEER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);

/// A UDP datagram of `address` as the hook sees it: from it on ingress (the workload sends),
/// to it on egress (the workload receives). Locally administered MACs: the run does not
/// depend on the interface's neighbours.
fn frame(address: IpAddr, direction: Direction) -> Vec<u8> {
    const POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
    const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
    let (dst_mac, src_mac) = match direction {
        Direction::Ingress => (HOST_MAC, POD_MAC),
        Direction::Egress => (POD_MAC, HOST_MAC),
    };
    let payload = *b"ipq-probe";
    let udp_len = 8 + payload.len();
    let mut frame = Vec::with_capacity(14 + 40 + udp_len);
    frame.extend_from_slice(&dst_mac);
    frame.extend_from_slice(&src_mac);
    match address {
        IpAddr::V4(v4) => {
            let (src, dst) = match direction {
                Direction::Ingress => (v4, PEER_V4),
                Direction::Egress => (PEER_V4, v4),
            };
            frame.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let sum = checksum(&ip, 0);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            frame.extend_from_slice(&ip);
            // UDP over IPv4 may go without a checksum (0).
            frame.extend_from_slice(&udp(udp_len, &payload, 0));
        }
        IpAddr::V6(v6) => {
            let (src, dst) = match direction {
                Direction::Ingress => (v6, PEER_V6),
                Direction::Egress => (PEER_V6, v6),
            };
            frame.extend_from_slice(&0x86ddu16.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&src.octets());
            ip[24..40].copy_from_slice(&dst.octets());
            frame.extend_from_slice(&ip);
            // The pseudo-header's sum: addresses, length, next header.
            let mut pseudo = Vec::with_capacity(40);
            pseudo.extend_from_slice(&src.octets());
            pseudo.extend_from_slice(&dst.octets());
            pseudo.extend_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
            let mut datagram = udp(udp_len, &payload, 0);
            let sum = checksum(&datagram, sum_words(&pseudo));
            datagram[6..8].copy_from_slice(&(if sum == 0 { 0xffff } else { sum }).to_be_bytes());
            frame.extend_from_slice(&datagram);
        }
    }
    frame
}

fn udp(len: usize, payload: &[u8], sum: u16) -> Vec<u8> {
    const PORT: u16 = 33434;
    let mut datagram = Vec::with_capacity(len);
    datagram.extend_from_slice(&PORT.to_be_bytes());
    datagram.extend_from_slice(&PORT.to_be_bytes());
    datagram.extend_from_slice(&(len as u16).to_be_bytes());
    datagram.extend_from_slice(&sum.to_be_bytes());
    datagram.extend_from_slice(payload);
    datagram
}

/// The one's complement sum of `bytes` as 16-bit words (unfolded), added to `start`.
fn sum_words(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum()
}

/// The Internet checksum of `bytes`, with `start` (a pseudo-header's sum) added.
fn checksum(bytes: &[u8], start: u32) -> u16 {
    let mut sum = start + sum_words(bytes);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
/// `struct __sk_buff`: `ingress_ifindex` and `ifindex`, the fields of the context passed in.
const SKB_INGRESS_IFINDEX: usize = 36;
const SKB_IFINDEX: usize = 40;
const SKB_CTX_LEN: usize = 44;

/// A descriptor of the loaded program `id`: `CAP_SYS_ADMIN` only.
fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&id.to_ne_bytes());
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &attr)?;
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One `BPF_PROG_TEST_RUN` of `prog` on `frame`, as received on (ingress) or sent from
/// (egress) `ifindex`: its return code.
fn test_run(prog: &OwnedFd, frame: &[u8], ifindex: u32, direction: Direction) -> io::Result<i32> {
    let mut ctx = [0u8; SKB_CTX_LEN];
    ctx[SKB_IFINDEX..SKB_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
    if direction == Direction::Ingress {
        ctx[SKB_INGRESS_IFINDEX..SKB_INGRESS_IFINDEX + 4].copy_from_slice(&ifindex.to_ne_bytes());
    }
    // struct { prog_fd, retval, data_size_in, data_size_out, data_in, data_out, repeat,
    // duration, ctx_size_in, ctx_size_out, ctx_in, ctx_out, flags, cpu, batch_size }
    let mut attr = [0u8; 80];
    attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    attr[16..24].copy_from_slice(&(frame.as_ptr() as u64).to_ne_bytes());
    attr[32..36].copy_from_slice(&1u32.to_ne_bytes());
    attr[40..44].copy_from_slice(&(ctx.len() as u32).to_ne_bytes());
    attr[48..56].copy_from_slice(&(ctx.as_ptr() as u64).to_ne_bytes());
    bpf(BPF_PROG_TEST_RUN, &attr)?;
    // The kernel wrote the program's return code back into `retval`.
    let mut retval = [0u8; 4];
    retval.copy_from_slice(&attr[4..8]);
    Ok(i32::from_ne_bytes(retval))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv4_probe_has_a_valid_header_checksum() {
        let sent = frame("10.1.0.2".parse().unwrap(), Direction::Ingress);
        assert_eq!(checksum(&sent[14..34], 0), 0, "{sent:02x?}");
        assert_eq!(&sent[26..30], &[10, 1, 0, 2], "source on ingress");
        let received = frame("10.1.0.2".parse().unwrap(), Direction::Egress);
        assert_eq!(&received[30..34], &[10, 1, 0, 2], "destination on egress");
    }

    #[test]
    fn an_ipv6_probe_has_a_valid_udp_checksum() {
        let address: Ipv6Addr = "fd00::2".parse().unwrap();
        let frame = frame(IpAddr::V6(address), Direction::Egress);
        let datagram = &frame[54..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&frame[22..54]);
        pseudo.extend_from_slice(&(datagram.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 17]);
        assert_eq!(checksum(datagram, sum_words(&pseudo)), 0);
    }

    #[test]
    fn direct_action_codes_that_end_classification_are_the_kernels() {
        for ends in [0, 2, 4, 7, 8] {
            assert!(!cls_bpf_hands_on(ends), "{}", tc_act_name(ends));
        }
        for on in [-1, 1, 3, 6, 42] {
            assert!(cls_bpf_hands_on(on), "{}", tc_act_name(on));
        }
    }

    #[test]
    fn a_filter_of_another_kind_ends_processing_without_being_run() {
        let u32_filter = Filter {
            priority: 1,
            handle: 0x800,
            kind: "u32".to_owned(),
            program: None,
            program_id: None,
            direct_action: false,
            opaque: false,
        };
        let verdict = decide(
            1,
            AttachPoint::TcxIngress,
            &[Ahead::Filter(u32_filter)],
            &[],
        );
        assert!(
            matches!(&verdict, Verdict::EndsProcessing(why) if why.contains("u32 filter")),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_program_that_is_gone_cannot_be_told() {
        // Ids are never reused while the kernel runs; u32::MAX is not one it has given.
        let verdict = decide(1, AttachPoint::TcxEgress, &[Ahead::Program(u32::MAX)], &[]);
        assert!(
            matches!(&verdict, Verdict::CannotTell(why) if why.contains("program id")),
            "{verdict:?}"
        );
    }
}
