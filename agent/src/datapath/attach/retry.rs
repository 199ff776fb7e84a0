//! Backoff between attach attempts: soon after a first failure (a veth that raced its own
//! configuration), then doubling, capped so a fixed fault is noticed within seconds.

use std::time::Duration;

/// First delay after a failure.
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// Longest delay between two attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    failures: u32,
}

impl Backoff {
    /// The delay before the next attempt, counting this failure.
    pub fn next_delay(&mut self) -> Duration {
        let delay = FIRST_RETRY
            .checked_mul(1u32 << self.failures.min(16))
            .unwrap_or(MAX_RETRY)
            .min(MAX_RETRY);
        self.failures = self.failures.saturating_add(1);
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_never_overflow() {
        let mut backoff = Backoff::default();
        let delays: Vec<Duration> = (0..40).map(|_| backoff.next_delay()).collect();
        assert_eq!(delays[0], FIRST_RETRY);
        assert_eq!(delays[1], FIRST_RETRY * 2);
        assert_eq!(delays[2], FIRST_RETRY * 4);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*delays.last().unwrap(), MAX_RETRY);
    }
}
