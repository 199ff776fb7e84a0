//! The kernel's own clocks, as the datapath programs and the kernel itself read them, whatever
//! time namespace the agent runs in.
//!
//! `bpf_ktime_get_ns` and `bpf_ktime_get_coarse_ns` are not namespaced: under
//! `unshare --time --monotonic <offset>` the agent's `clock_gettime(CLOCK_MONOTONIC)` is the
//! kernel's plus the offset, and a deadline or a stale-traffic stamp compared across the two
//! would be off by it (a journal's quarantines ended at once at restart, stale traffic stamped
//! by the programs taken as long past). The namespace's offsets are fixed for the life of the
//! process (a namespace's offsets cannot change once a process entered it), so they are read
//! once from `/proc/self/timens_offsets` and taken off every reading here.
//!
//! CLOCK_BOOTTIME counts across suspend, and like the monotonic clock it starts again at each
//! boot ([`boot_id`] says which): what the IPAM releaser's waits count in within a boot.

use std::sync::OnceLock;

/// Where the kernel shows the offsets of the agent's time namespace.
const TIMENS_OFFSETS: &str = "/proc/self/timens_offsets";
/// Where the kernel shows the id of this boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// Why the time namespace's offsets cannot be known.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClockError {
    #[error("{TIMENS_OFFSETS}: line {line:?} is not `<clock> <seconds> <nanoseconds>`")]
    Malformed { line: String },
    #[error("{TIMENS_OFFSETS}: reading it failed: {0}")]
    Read(String),
}

/// The offsets of a time namespace, in nanoseconds (signed: an offset may be negative).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    pub monotonic_ns: i64,
    pub boottime_ns: i64,
}

impl Offsets {
    /// `/proc/self/timens_offsets`'s text: one `<clock> <seconds> <nanoseconds>` line per clock
    /// (`monotonic`, `boottime`; by name or by clock id, 1 and 7).
    pub fn parse(text: &str) -> Result<Self, ClockError> {
        let mut offsets = Self::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let malformed = || ClockError::Malformed {
                line: line.to_owned(),
            };
            let mut fields = line.split_whitespace();
            let (Some(clock), Some(secs), Some(nanos), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(malformed());
            };
            let secs: i64 = secs.parse().map_err(|_| malformed())?;
            let nanos: i64 = nanos.parse().map_err(|_| malformed())?;
            let ns = secs
                .checked_mul(1_000_000_000)
                .and_then(|s| s.checked_add(nanos))
                .ok_or_else(malformed)?;
            match clock {
                "monotonic" | "1" => offsets.monotonic_ns = ns,
                "boottime" | "7" => offsets.boottime_ns = ns,
                _ => return Err(malformed()),
            }
        }
        Ok(offsets)
    }

    /// Whether the namespace moves any clock.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// The agent's time namespace's offsets: zero where the kernel has no time namespaces (no
/// such file). Read once; the agent checks them at start and refuses to start without them.
pub fn offsets() -> Result<Offsets, ClockError> {
    static OFFSETS: OnceLock<Result<Offsets, ClockError>> = OnceLock::new();
    OFFSETS
        .get_or_init(|| match std::fs::read_to_string(TIMENS_OFFSETS) {
            Ok(text) => Offsets::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Offsets::default()),
            Err(e) => Err(ClockError::Read(e.to_string())),
        })
        .clone()
}

/// `offsets()`; the agent does not start when they cannot be known (`agent::startup`), so
/// zero only for tools and tests that never checked.
fn known_offsets() -> Offsets {
    offsets().unwrap_or_default()
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-parameter; the clocks used here always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec)
}

fn unsigned(ns: i64) -> u64 {
    u64::try_from(ns).unwrap_or(0)
}

/// The kernel's CLOCK_MONOTONIC (or its coarse reading) in nanoseconds, as
/// `bpf_ktime_get_ns` (`bpf_ktime_get_coarse_ns`) reads it.
pub fn monotonic_ns(coarse: bool) -> u64 {
    let clock = if coarse {
        libc::CLOCK_MONOTONIC_COARSE
    } else {
        libc::CLOCK_MONOTONIC
    };
    unsigned(clock_ns(clock).saturating_sub(known_offsets().monotonic_ns))
}

/// The kernel's CLOCK_BOOTTIME in nanoseconds: monotonic, counting suspend, from this boot.
pub fn boottime_ns() -> u64 {
    unsigned(clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(known_offsets().boottime_ns))
}

/// The kernel's id of this boot: the monotonic clocks restart with it. Read once.
pub fn boot_id() -> Option<String> {
    static ID: OnceLock<Option<String>> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string(BOOT_ID)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_are_read_by_clock_name_or_id_and_may_be_negative() {
        let offsets = Offsets::parse("monotonic 100000 5\nboottime -2 0\n").unwrap();
        assert_eq!(offsets.monotonic_ns, 100_000_000_000_005);
        assert_eq!(offsets.boottime_ns, -2_000_000_000);
        let by_id = Offsets::parse("1 3 0\n7 0 10\n").unwrap();
        assert_eq!(
            by_id,
            Offsets {
                monotonic_ns: 3_000_000_000,
                boottime_ns: 10
            }
        );
        assert!(Offsets::parse("monotonic 0 0\nboottime 0 0\n")
            .unwrap()
            .is_zero());
    }

    #[test]
    fn a_line_that_does_not_read_is_an_error_naming_it() {
        let err = Offsets::parse("monotonic ten 0\n").unwrap_err();
        assert!(err.to_string().contains("monotonic ten 0"), "{err}");
        assert!(Offsets::parse("realtime 1 0\n").is_err());
        assert!(Offsets::parse("monotonic 1\n").is_err());
    }

    /// Outside a time namespace (how the unit tests run) the readings are the clocks'.
    #[test]
    fn the_kernel_clocks_move_forward_and_boot_has_an_id() {
        let (a, b) = (boottime_ns(), monotonic_ns(false));
        assert!(a > 0 && b > 0);
        assert!(boottime_ns() >= a);
        assert!(boot_id().is_some_and(|id| id.len() >= 32));
    }
}
