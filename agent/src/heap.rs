//! The agent's use of the C allocator (glibc malloc), set for a long-lived process whose live
//! heap is mostly one registry, and whose big allocations are short-lived copies of it.
//!
//! Measured at 65536 addresses (`cargo xtask bench`'s control-plane population, then idle),
//! with defaults the resident size was 20–40 MB above the live heap: freed buffers kept by the
//! allocator. Two causes, each fixed here:
//! - glibc raises its mmap threshold to the size of every large block freed (up to 32 MB), so
//!   after the first journal line or netlink dump of the whole registry, such buffers come from
//!   the heap and leave holes between long-lived records when freed. A fixed threshold keeps
//!   every large buffer in a mapping of its own, returned whole on free.
//! - one arena per thread (tokio workers, attach workers, hygiene, compaction): each keeps the
//!   free memory of what its thread once built. The agent's allocations are not contended (one
//!   owner loop), so one arena is enough.

/// Blocks from this size up get a mapping of their own (glibc's initial default, kept fixed).
const MMAP_THRESHOLD: i32 = 128 * 1024;
/// Arenas: the main one only.
const ARENA_MAX: i32 = 1;

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
