//! The tests' time scale: how much longer than on the host the tests' own timeouts may be.
//!
//! Under emulation (the kernel tier boots Debian's kernels under QEMU TCG) everything runs
//! several times slower, so `cargo xtask test-kernels` sets `IPQ_TEST_TIME_SCALE` in the guest
//! and every timeout the lab waits on is multiplied by it. On the host it is unset: 1.

use std::time::Duration;

/// The environment variable holding the scale, a whole number ≥ 1.
pub const TIME_SCALE_ENV: &str = "IPQ_TEST_TIME_SCALE";

/// The scale from [`TIME_SCALE_ENV`]; 1 when unset. Panics, naming the variable, on a value
/// that is not a whole number ≥ 1: a mistyped scale must not quietly shorten the timeouts.
pub fn time_scale() -> u32 {
    match std::env::var(TIME_SCALE_ENV) {
        Err(std::env::VarError::NotPresent) => 1,
        Ok(text) => match text.trim().parse::<u32>() {
            Ok(scale) if scale >= 1 => scale,
            _ => panic!("{TIME_SCALE_ENV}={text:?} is not a whole number >= 1"),
        },
        Err(e) => panic!("{TIME_SCALE_ENV}: {e}"),
    }
}

/// `timeout` multiplied by the time scale.
pub fn scaled(timeout: Duration) -> Duration {
    timeout * time_scale()
}
