//! The unit tests that reach the kernel as the agent does (a BPF map, a netlink socket widened
//! past `rmem_max`, files given away to another user) need root. Run without it, they fail at
//! once with that reason rather than with the kernel's EPERM deep inside the test: a
//! contributor's `cargo test` then says what to do (`sudo -E cargo test`, or
//! `cargo xtask test`, which runs as root). Failing, not skipping: a skipped test would count
//! as passed.

/// Panics, naming `what` the test does and the privilege it needs, unless this process is
/// root.
#[track_caller]
pub fn needs_root(what: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "this test needs root (CAP_NET_ADMIN/CAP_BPF/CAP_CHOWN) to {what}; it runs as uid \
         {euid}: run it with `sudo -E cargo test`, or `cargo xtask test`"
    );
}
