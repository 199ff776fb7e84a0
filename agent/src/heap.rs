//! The agent's use of the C allocator (glibc malloc), set for a long-lived process whose live
//! heap is mostly one registry, and whose big allocations are short-lived copies of it.
//!
//! Measured at 65536 addresses (`cargo xtask bench`'s control-plane population, then idle),
//! with defaults the resident size was 20–40 MB above the live heap: freed buffers kept by the
//! allocator. Two causes, each bounded here:
//! - glibc raises its mmap threshold to the size of every large block freed (up to 32 MB), so
//!   after the first journal line or netlink dump of the whole registry, such buffers come from
//!   the heap and leave holes between long-lived records when freed. A fixed threshold keeps
//!   every large buffer in a mapping of its own, returned whole on free.
//! - by default one arena per thread, up to 8 per core (tokio workers, attach workers,
//!   hygiene, journal flushers, compaction): each keeps the free memory of what its thread once
//!   built. A few arenas are enough, but not one: under a burst of claims the owner loop, the
//!   two API workers and the hygiene worker all allocate, and with a single arena a profile
//!   showed them queueing on its lock (futex waits and wake-ups inside malloc and free, about a
//!   fifth of the API workers' time). With [`ARENA_MAX`] arenas each busy thread has one of its
//!   own; the agent's CPU per fresh claim fell by about a tenth, and the resident size at
//!   65536 addresses, with and without 1000 veths, stayed where it was (62–63 MB).

use std::time::{Duration, Instant};

/// Blocks from this size up get a mapping of their own (glibc's initial default, kept fixed).
const MMAP_THRESHOLD: i32 = 128 * 1024;
/// Arenas: one each for the owner loop, the two API workers and the hygiene worker (glibc
/// hands a thread that finds its arena busy another one, up to this many).
const ARENA_MAX: i32 = 4;

/// Sets the allocator up. Call first thing in `main`, before any thread starts.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}

/// Gives the heap's free pages back to the system. A rewrite, a compaction or a recovery
/// handles a copy of the whole registry for a moment; without this the allocator keeps those
/// pages, and the agent's resident size with them.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The heap's free pages go back to the system once a burst of work is over (a tick of the
/// owner loop with no work since the one before), at most every [`TRIM_GAP`]. Claims, drains
/// and netlink bursts free much of what they allocate; without it the allocator keeps those
/// pages, and the RSS an operator reads grows with the node's past churn, not its registry.
pub struct Trimmer {
    active_since_tick: bool,
    active_since_trim: bool,
    last_trim: Instant,
}

/// The least time between two trims.
pub const TRIM_GAP: Duration = Duration::from_secs(5);

impl Trimmer {
    pub fn new() -> Self {
        Self {
            active_since_tick: false,
            active_since_trim: false,
            last_trim: Instant::now(),
        }
    }

    /// The loop did some work (anything but its tick).
    pub fn on_activity(&mut self) {
        self.active_since_tick = true;
        self.active_since_trim = true;
    }

    /// The loop's tick: trims (off the loop: it walks the free lists) when a burst just ended.
    pub fn on_tick(&mut self) {
        if self.due() {
            tokio::task::spawn_blocking(release_freed_memory);
        }
    }

    /// Whether a burst just ended: work before the last tick, none since, and no trim for
    /// [`TRIM_GAP`]. Resets what it read.
    fn due(&mut self) -> bool {
        let due = self.active_since_trim
            && !self.active_since_tick
            && self.last_trim.elapsed() >= TRIM_GAP;
        if due {
            self.active_since_trim = false;
            self.last_trim = Instant::now();
        }
        self.active_since_tick = false;
        due
    }
}

impl Default for Trimmer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_comes_once_a_burst_is_over_never_during_it_nor_at_rest() {
        let mut t = Trimmer::new();
        t.last_trim -= TRIM_GAP;
        assert!(!t.due(), "at rest: nothing was freed");
        t.on_activity();
        assert!(!t.due(), "work since the last tick: the burst goes on");
        assert!(t.due(), "a quiet tick after work: trim");
        t.on_activity();
        assert!(!t.due());
        assert!(!t.due(), "within the gap of the last trim");
        t.last_trim -= TRIM_GAP;
        assert!(t.due(), "the work since still gets its trim");
        assert!(!t.due(), "and only one");
    }
}
