//! The registry's notion of now: monotonic nanoseconds, injectable so tests drive time.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use super::types::{duration_ns, MonoNs};

/// A source of monotonic time in nanoseconds, on the datapath's clock.
pub trait Clock {
    fn now(&self) -> MonoNs;
}

/// The clock of the kernel programs' stamps (`netdev::monotonic_ns`: CLOCK_MONOTONIC_COARSE,
/// or CLOCK_MONOTONIC on kernels without `bpf_ktime_get_coarse_ns`).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> MonoNs {
        crate::netdev::monotonic_ns()
    }
}

/// A clock that moves only when told to. Clones share the same time, so a test keeps one
/// handle while the registry owns another.
#[derive(Clone, Debug, Default)]
pub struct FakeClock {
    now: Arc<AtomicU64>,
}

impl FakeClock {
    pub fn new(start: MonoNs) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` ns).
    pub fn advance(&self, by: Duration) {
        let by = duration_ns(by);
        // fetch_update cannot fail with a closure that always returns Some.
        let _ = self
            .now
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the time; a clock told to go backwards stays where it is (it is monotonic).
    pub fn set(&self, to: MonoNs) {
        self.now.fetch_max(to, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> MonoNs {
        self.now.load(Ordering::SeqCst)
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> MonoNs {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> MonoNs {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    fn now(&self) -> MonoNs {
        (**self).now()
    }
}
