//! The start-up probe that decides whether the kernel's filtered conntrack flush may be used.
//!
//! A kernel that ignored the filter would delete every conntrack entry on the node, so the
//! kernel version is not trusted: the agent re-executes itself ([`PROBE_ARG`]) into a
//! throwaway network namespace of its own (`unshare(CLONE_NEWNET)`, or with a user namespace
//! where the agent lacks `CAP_SYS_ADMIN`, as in the DaemonSet), creates conntrack entries there
//! with `IPCTNL_MSG_CT_NEW` and runs the production flush (`Conntrack::flush_in_kernel`) on
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

mod round;

use std::{
    io::Read as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use std::os::unix::process::CommandExt as _;

use thiserror::Error;

use self::round::{entries, probe_family, v4, v6};
use super::{conntrack::ConntrackError, socket::SocketError};

/// The hidden first argument that makes `ipq-agent` run the probe and exit.
pub const PROBE_ARG: &str = "__ipq-probe-conntrack-filter";

/// How long the probe may take before the agent gives up on it (and keeps the dump).
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the probe could not run: the child reports it as [`Verdict::Unavailable`], in words,
/// since it crosses a pipe; the cause is kept here until then.
#[derive(Debug, Error)]
enum FlushProbeError {
    #[error(
        "no network namespace of its own: unshare(CLONE_NEWNET): {direct}; with \
         CLONE_NEWUSER: {user}"
    )]
    Namespace {
        direct: std::io::Error,
        user: std::io::Error,
    },
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error(transparent)]
    Conntrack(#[from] ConntrackError),
    #[error("creating its conntrack entries: {}", std::io::Error::from_raw_os_error(*errno))]
    Create { errno: i32 },
    #[error("looking an entry up: {}", std::io::Error::from_raw_os_error(*errno))]
    Lookup { errno: i32 },
}

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
    let mut command = Command::new(&exe);
    command
        .arg(PROBE_ARG)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: only prctl, async-signal-safe, between fork and exec.
    unsafe {
        // An agent that exits (or is killed) meanwhile takes the probe with it: a probe left
        // waiting on the kernel would otherwise live on, orphaned.
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
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
    // A probe the kernel never answers (a netlink reply that does not come) ends on its own,
    // a second after its parent stops waiting for it.
    // SAFETY: alarm has no preconditions; SIGALRM's default action ends this process.
    unsafe { libc::alarm(PROBE_TIMEOUT.as_secs() as libc::c_uint + 1) };
    let verdicts = match isolate() {
        Ok(()) => Verdicts {
            v4: probe_family(&entries(v4(), 0), &entries(v6(), 0)),
            v6: probe_family(&entries(v6(), 100), &entries(v4(), 100)),
        },
        Err(why) => Verdicts::unavailable(why.to_string()),
    };
    print!("{}", verdicts.lines());
    0
}

/// Moves this (single-threaded) process into a new network namespace: directly with
/// `CAP_SYS_ADMIN`, else inside a new user namespace.
fn isolate() -> Result<(), FlushProbeError> {
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
    Err(FlushProbeError::Namespace { direct, user })
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
}
