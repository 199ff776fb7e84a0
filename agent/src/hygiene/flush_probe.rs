//! The start-up probe that decides whether the kernel's filtered conntrack flush may be used.
//!
//! A kernel that ignored the filter would delete every conntrack entry on the node, so the
//! kernel version is not trusted: the agent re-executes itself ([`PROBE_ARG`]) into a
//! throwaway network namespace of its own (`unshare(CLONE_NEWNET)`, or with a user namespace
//! where the agent lacks `CAP_SYS_ADMIN`, as in the DaemonSet), creates conntrack entries there
//! with `IPCTNL_MSG_CT_NEW` and runs the production flush ([`Conntrack::flush_in_kernel`]) on
//! one address, once per family. The filter counts as honoured for a family only if every
//! entry carrying the address went — in each of the four places and in a non-default zone —
//! and every other entry stayed: other addresses, in both zones, and the other family's. If the
//! namespace cannot be made, the probe is not run and the agent keeps the dump: the probe never
//! touches the node's own table.
//!
//! Each family has its own verdict because the kernels differ by family: Linux 6.12 to 6.18
//! at least compare IPv6 addresses in the filter with `!ipv6_addr_cmp()`, which is true when
//! they are *equal*, so an IPv6 filtered flush deletes every IPv6 entry that does *not* carry
//! the address. The probe sees that, and IPv6 keeps the dump there.

use std::{
    io::Read as _,
    net::IpAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_netfilter::{
    conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, ProtoTuple, Protocol, Tuple},
    NetfilterHeader, NetfilterMessage,
};
use netlink_sys::protocols::NETLINK_NETFILTER;

use super::{
    conntrack::{Conntrack, ConntrackError},
    kernel_flush::family_of,
    socket::NlSocket,
};

/// The hidden first argument that makes `ipq-agent` run the probe and exit.
pub const PROBE_ARG: &str = "__ipq-probe-conntrack-filter";

/// How long the probe may take before the agent gives up on it (and keeps the dump).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// `CTA_ZONE`: the probe's entries live in the default zone and in this one.
const CTA_ZONE: u16 = 18;
const OTHER_ZONE: u16 = 4242;

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every entry carrying the address went, every other one stayed, in every zone.
    Honoured,
    /// The kernel refused the filtered flush (kernels before 6.12).
    Refused(String),
    /// The kernel did not do what the filter says. Never to be used.
    Ignored(String),
    /// The probe could not run.
    Unavailable(String),
}

impl Verdict {
    fn line(&self) -> String {
        match self {
            Self::Honoured => "honoured".to_owned(),
            Self::Refused(why) => format!("refused: {why}"),
            Self::Ignored(why) => format!("ignored: {why}"),
            Self::Unavailable(why) => format!("unavailable: {why}"),
        }
    }

    fn parse(line: &str) -> Self {
        let line = line.trim();
        if line == "honoured" {
            return Self::Honoured;
        }
        match line.split_once(": ") {
            Some(("refused", why)) => Self::Refused(why.to_owned()),
            Some(("ignored", why)) => Self::Ignored(why.to_owned()),
            Some(("unavailable", why)) => Self::Unavailable(why.to_owned()),
            _ => Self::Unavailable(format!("the probe answered {line:?}")),
        }
    }

    /// For the log: what the probe saw.
    pub fn describe(&self) -> String {
        match self {
            Self::Honoured => "the kernel honoured the filter (all four tuple places, a \
                               non-default zone; every other entry kept)"
                .to_owned(),
            Self::Refused(why) => format!("the kernel refused a filtered flush ({why})"),
            Self::Ignored(why) => format!("the kernel did not honour the filter ({why})"),
            Self::Unavailable(why) => format!("the probe could not run ({why})"),
        }
    }
}

/// What the probe found for each family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdicts {
    pub v4: Verdict,
    pub v6: Verdict,
}

impl Verdicts {
    fn unavailable(why: String) -> Self {
        Self {
            v4: Verdict::Unavailable(why.clone()),
            v6: Verdict::Unavailable(why),
        }
    }

    fn lines(&self) -> String {
        format!("ipv4 {}\nipv6 {}\n", self.v4.line(), self.v6.line())
    }

    fn parse(out: &str) -> Self {
        let mut verdicts = Self::unavailable(format!("the probe answered {out:?}"));
        for line in out.lines() {
            match line.split_once(' ') {
                Some(("ipv4", v)) => verdicts.v4 = Verdict::parse(v),
                Some(("ipv6", v)) => verdicts.v6 = Verdict::parse(v),
                _ => {}
            }
        }
        verdicts
    }
}

/// Runs the probe in a child process (this executable with [`PROBE_ARG`]) and reads its
/// verdicts.
pub fn run() -> Verdicts {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Verdicts::unavailable(format!("finding this executable: {e}")),
    };
    let mut child = match Command::new(&exe)
        .arg(PROBE_ARG)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => return Verdicts::unavailable(format!("starting {}: {e}", exe.display())),
    };
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Verdicts::unavailable(format!("no answer within {PROBE_TIMEOUT:?}"));
            }
            Err(e) => return Verdicts::unavailable(format!("waiting for the probe: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if !status.success() {
        return Verdicts::unavailable(format!("the probe exited with {status}"));
    }
    Verdicts::parse(&out)
}

/// The child's side: into a namespace of its own, probe there, print the verdicts. Never
/// probes in the namespace it started in.
pub fn child_main() -> i32 {
    let verdicts = match isolate() {
        Ok(()) => Verdicts {
            v4: probe_family(&entries(v4(), 0), &entries(v6(), 0)),
            v6: probe_family(&entries(v6(), 100), &entries(v4(), 100)),
        },
        Err(why) => Verdicts::unavailable(why),
    };
    print!("{}", verdicts.lines());
    0
}

/// Moves this (single-threaded) process into a new network namespace: directly with
/// `CAP_SYS_ADMIN`, else inside a new user namespace.
fn isolate() -> Result<(), String> {
    // SAFETY: plain syscalls; the process is single-threaded (a fresh exec).
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
        return Ok(());
    }
    let direct = std::io::Error::last_os_error();
    // SAFETY: as above.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) } == 0 {
        return Ok(());
    }
    let user = std::io::Error::last_os_error();
    Err(format!(
        "no network namespace of its own: unshare(CLONE_NEWNET): {direct}; with \
         CLONE_NEWUSER: {user}"
    ))
}

/// One probe entry: its original and reply tuples (UDP), its zone, and whether a flush of the
/// target must take it.
struct Entry {
    orig: (IpAddr, u16, IpAddr, u16),
    reply: (IpAddr, u16, IpAddr, u16),
    zone: u16,
    carries_target: bool,
}

/// The entries for one family: the target in each of the four places (two of them in another
/// zone), and entries of other addresses in both zones.
/// (`round` shifts the ports, so that each family's round has entries of its own.)
fn entries(addrs: [IpAddr; 5], round: u16) -> (IpAddr, Vec<Entry>) {
    let [t, p1, p2, p3, vip] = addrs;
    let e = |(a, ap, b, bp): (IpAddr, u16, IpAddr, u16),
             (c, cp, d, dp): (IpAddr, u16, IpAddr, u16),
             zone,
             carries_target| Entry {
        orig: (a, ap + round, b, bp + round),
        reply: (c, cp + round, d, dp + round),
        zone,
        carries_target,
    };
    let list = vec![
        // SNAT from the target: original source only.
        e((t, 1001, p1, 2001), (p1, 2001, p2, 40001), 0, true),
        // DNAT to the target (a Service backend): reply source only.
        e((p1, 1002, vip, 2002), (t, 2002, p1, 1002), OTHER_ZONE, true),
        // SNAT to the target: reply destination only.
        e((p2, 1003, p1, 2003), (p1, 2003, t, 40003), 0, true),
        // DNAT away from the target: original destination only.
        e((p1, 1004, t, 2004), (p3, 2004, p1, 1004), OTHER_ZONE, true),
        // Other addresses, in both zones.
        e((p1, 1005, p2, 2005), (p2, 2005, p1, 1005), 0, false),
        e(
            (p1, 1006, p2, 2006),
            (p2, 2006, p1, 1006),
            OTHER_ZONE,
            false,
        ),
        e((p3, 1007, vip, 2007), (p2, 2007, p3, 1007), 0, false),
    ];
    (t, list)
}

fn v4() -> [IpAddr; 5] {
    [
        "192.0.2.10",
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.100",
    ]
    .map(|a| a.parse().unwrap())
}

fn v6() -> [IpAddr; 5] {
    [
        "2001:db8::10",
        "2001:db8::1",
        "2001:db8::2",
        "2001:db8::3",
        "2001:db8::100",
    ]
    .map(|a| a.parse().unwrap())
}

fn tuple((src, sport, dst, dport): (IpAddr, u16, IpAddr, u16)) -> Vec<Tuple> {
    vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(src),
            IPTuple::DestinationAddress(dst),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Udp),
            ProtoTuple::SourcePort(sport),
            ProtoTuple::DestinationPort(dport),
        ]),
    ]
}

fn zone_attr(zone: u16) -> Option<ConntrackAttribute> {
    (zone != 0)
        .then(|| ConntrackAttribute::Other(DefaultNla::new(CTA_ZONE, zone.to_be_bytes().to_vec())))
}

fn creation(entry: &Entry) -> NetfilterMessage {
    let mut attrs = vec![
        ConntrackAttribute::CtaTupleOrig(tuple(entry.orig)),
        ConntrackAttribute::CtaTupleReply(tuple(entry.reply)),
        ConntrackAttribute::CtaTimeout(300),
    ];
    attrs.extend(zone_attr(entry.zone));
    NetfilterMessage::new(
        NetfilterHeader::new(family_of(entry.orig.0), 0, 0),
        ConntrackMessage::New(attrs),
    )
}

fn lookup(entry: &Entry) -> NetfilterMessage {
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple(entry.orig))];
    attrs.extend(zone_attr(entry.zone));
    NetfilterMessage::new(
        NetfilterHeader::new(family_of(entry.orig.0), 0, 0),
        ConntrackMessage::Get(attrs),
    )
}

/// One family's round: creates `family`'s entries and `other`'s, flushes `family`'s target
/// with the production code, and checks every entry.
fn probe_family(family: &(IpAddr, Vec<Entry>), other: &(IpAddr, Vec<Entry>)) -> Verdict {
    match try_probe(family, other) {
        Ok(verdict) => verdict,
        Err(why) => Verdict::Unavailable(why),
    }
}

fn try_probe(
    (target, own): &(IpAddr, Vec<Entry>),
    (_, other): &(IpAddr, Vec<Entry>),
) -> Result<Verdict, String> {
    let mut socket = NlSocket::open(NETLINK_NETFILTER).map_err(|e| e.to_string())?;
    let mut conntrack = Conntrack::open().map_err(|e| e.to_string())?;
    let all: Vec<&Entry> = own.iter().chain(other).collect();
    let creations: Vec<NetfilterMessage> = all.iter().map(|e| creation(e)).collect();
    let created = socket
        .acked_with(&creations, NLM_F_CREATE | NLM_F_EXCL, |_| false)
        .map_err(|e| e.to_string())?;
    if let Some(errno) = created.iter().find_map(|(o, _)| o.err()) {
        return Err(format!(
            "creating its conntrack entries: {}",
            std::io::Error::from_raw_os_error(errno)
        ));
    }
    match conntrack.flush_in_kernel(*target) {
        Ok(_) => {}
        Err(ConntrackError::Delete { errno, .. }) => {
            return Ok(Verdict::Refused(
                std::io::Error::from_raw_os_error(errno).to_string(),
            ))
        }
        Err(e) => return Err(e.to_string()),
    }
    let lookups: Vec<NetfilterMessage> = all.iter().map(|e| lookup(e)).collect();
    let found = socket
        .acked_with(&lookups, 0, |_| false)
        .map_err(|e| e.to_string())?;
    for (entry, (outcome, _)) in all.iter().zip(found) {
        let must_be_gone = entry.carries_target && family_of(entry.orig.0) == family_of(*target);
        let present = match outcome {
            Ok(()) => true,
            Err(ENOENT) => false,
            Err(errno) => {
                return Err(format!(
                    "looking an entry up: {}",
                    std::io::Error::from_raw_os_error(errno)
                ))
            }
        };
        if must_be_gone && present {
            return Ok(Verdict::Ignored(format!(
                "flushing {target} left an entry carrying it: {} zone {}",
                show(entry),
                entry.zone
            )));
        }
        if !must_be_gone && !present {
            return Ok(Verdict::Ignored(format!(
                "flushing {target} deleted an entry that does not carry it: {} zone {}",
                show(entry),
                entry.zone
            )));
        }
    }
    Ok(Verdict::Honoured)
}

const ENOENT: i32 = 2;

fn show(entry: &Entry) -> String {
    let (a, ap, b, bp) = entry.orig;
    let (c, cp, d, dp) = entry.reply;
    format!("orig {a}:{ap} -> {b}:{bp}, reply {c}:{cp} -> {d}:{dp}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_travel_as_one_line() {
        for v in [
            Verdict::Honoured,
            Verdict::Refused("errno 22: Invalid argument".into()),
            Verdict::Ignored("x: y".into()),
            Verdict::Unavailable("no namespace".into()),
        ] {
            assert_eq!(Verdict::parse(&format!("{}\n", v.line())), v);
        }
        let both = Verdicts {
            v4: Verdict::Honoured,
            v6: Verdict::Ignored("flushing 2001:db8::10 deleted an entry".into()),
        };
        assert_eq!(Verdicts::parse(&both.lines()), both);
        let cut = Verdicts::parse("ipv4 honoured\n");
        assert_eq!(cut.v4, Verdict::Honoured);
        assert!(matches!(cut.v6, Verdict::Unavailable(_)), "{cut:?}");
        assert!(matches!(Verdict::parse(""), Verdict::Unavailable(_)));
        assert!(matches!(
            Verdict::parse("honoured but not really"),
            Verdict::Unavailable(_)
        ));
    }

    #[test]
    fn the_probe_puts_the_target_in_every_place_and_keeps_others_in_both_zones() {
        for addrs in [v4(), v6()] {
            let (t, list) = entries(addrs, 100);
            let carries = |e: &Entry| [e.orig.0, e.orig.2, e.reply.0, e.reply.2].contains(&t);
            for e in &list {
                assert_eq!(carries(e), e.carries_target, "{:?}", e.orig);
            }
            let only = |pick: fn(&Entry) -> IpAddr| {
                list.iter().any(|e| {
                    pick(e) == t
                        && [e.orig.0, e.orig.2, e.reply.0, e.reply.2]
                            .iter()
                            .filter(|a| **a == t)
                            .count()
                            == 1
                })
            };
            assert!(
                only(|e| e.orig.0)
                    && only(|e| e.orig.2)
                    && only(|e| e.reply.0)
                    && only(|e| e.reply.2)
            );
            assert!(list.iter().any(|e| e.carries_target && e.zone != 0));
            assert!(list.iter().any(|e| !e.carries_target && e.zone != 0));
        }
    }
}
