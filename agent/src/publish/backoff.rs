//! The one backoff of every loop that retries a call to the API server (the NodeQuarantine
//! writer, the whereabouts projection's calls and its watch, kube's watcher included, the pod
//! Events writer, the API server's prober, the other nodes' view): doubling from a first delay
//! up to a cap, each delay stretched by a random part of up to half of it. After an API server
//! outage every node's agent fails at the same moment; without the random part they would
//! retry in lockstep for as long as it lasts (and after it, when the API server is busiest).

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher as _, Hasher as _},
    time::Duration,
};

/// Doubling delays with jitter; [`Backoff::reset`] after a success.
#[derive(Clone, Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
    /// xorshift64 state: a random sequence per process (seeded from std's per-process hash
    /// keys), not a secret.
    rng: u64,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Self {
        let seed = RandomState::new().build_hasher().finish() | 1;
        Self {
            first,
            max,
            step: first,
            rng: seed,
        }
    }

    /// Back to the first delay.
    pub fn reset(&mut self) {
        self.step = self.first;
    }

    /// The delay before the next try: the current step plus a random part of up to half of it
    /// (so never shorter than the step: a bound on the retry rate holds whatever the draw),
    /// the step then doubled up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        step + self.up_to(step / 2)
    }

    /// A random duration in `[0, bound)`: spreads the nodes' first write after the API server
    /// is back.
    pub fn up_to(&mut self, bound: Duration) -> Duration {
        let nanos = bound.as_nanos() as u64;
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next_random() % nanos)
    }

    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}

/// kube's watcher takes its retries from an iterator of delays, reset after each success
/// (`WatchStreamExt::backoff`): the same delays as every other loop's, never giving up.
impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        Backoff::reset(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_to_the_cap_never_below_the_step_and_vary() {
        let first = Duration::from_millis(500);
        let max = Duration::from_secs(30);
        let mut backoff = Backoff::new(first, max);
        let mut step = first;
        for _ in 0..10 {
            let delay = backoff.next_delay();
            assert!(
                delay >= step && delay < step + step / 2 + Duration::from_nanos(1),
                "{delay:?} for a step of {step:?}"
            );
            step = (step * 2).min(max);
        }
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(750));
        // Two nodes' agents (two processes: two seeds) do not draw the same delays.
        let draws = |mut b: Backoff| (0..8).map(|_| b.up_to(first)).collect::<Vec<_>>();
        let (a, b) = (
            draws(Backoff::new(first, max)),
            draws(Backoff::new(first, max)),
        );
        assert_ne!(a, b, "two backoffs drew the same 8 delays");
        assert!(a.iter().all(|d| *d < first));
    }

    /// Two nodes' agents failing at the same moment (an API server outage) retry at different
    /// moments from the first retry on, and keep apart: the schedules, as sums of the delays,
    /// differ at every step.
    #[test]
    fn two_agents_retry_schedules_differ() {
        let schedule = |mut b: Backoff| {
            let mut at = Duration::ZERO;
            (0..10)
                .map(|_| {
                    at += b.next_delay();
                    at
                })
                .collect::<Vec<_>>()
        };
        let first = Duration::from_millis(500);
        let max = Duration::from_secs(30);
        let (a, b) = (
            schedule(Backoff::new(first, max)),
            schedule(Backoff::new(first, max)),
        );
        let same = a.iter().zip(&b).filter(|(a, b)| a == b).count();
        assert_eq!(same, 0, "retries at the same moments: {a:?} and {b:?}");
    }

    /// kube's watcher takes the same delays through the iterator, and a reset (after the
    /// watcher's next success) starts again from the first delay.
    #[test]
    fn the_watchers_backoff_is_this_one() {
        let first = Duration::from_millis(500);
        let mut backoff = Backoff::new(first, Duration::from_secs(30));
        let delays: Vec<Duration> = backoff.by_ref().take(3).collect();
        assert!(
            delays[0] >= first && delays[0] < first * 3 / 2,
            "{delays:?}"
        );
        assert!(delays[2] >= first * 4, "doubling: {delays:?}");
        kube::runtime::utils::Backoff::reset(&mut backoff);
        let after_reset = backoff.next().expect("never gives up");
        assert!(after_reset < first * 3 / 2, "{after_reset:?}");
    }
}
