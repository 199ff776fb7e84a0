//! The one backoff of every loop that retries a call to the API server (the NodeQuarantine
//! writer, the whereabouts projection): doubling from a first delay up to a cap, each delay
//! stretched by a random part of up to half of it. After an API server outage every node's
//! agent fails at the same moment; without the random part they would retry in lockstep for as
//! long as it lasts (and after it, when the API server is busiest).

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
}
