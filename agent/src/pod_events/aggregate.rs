//! The aggregation and rate limit of pod Events, with no I/O and the time given to every call
//! (tests drive it with instants of their own).
//!
//! One series per pod and reason (the way Cilium's drop-event emitter and client-go's event
//! correlator key theirs): its first notice creates an Event at once; every later one is only
//! counted, and at most once per [`Pacing::interval`] the series' Event is patched with the
//! count and the time of the last one (`series.count`, `series.lastObservedTime`). So a conflict
//! that repeats a thousand times a second on one pod is one Event and one patch an interval.
//! Series are capped ([`Pacing::max_series`]); a notice for a new series beyond the cap is
//! dropped (counted by the caller), and a series quiet for [`Pacing::forget_after`] is
//! forgotten (its Event has expired from the API server by then, or soon will: a recurrence
//! starts a new one).

use std::{
    collections::HashMap,
    time::{Duration, Instant, SystemTime},
};

use super::notice::{Notice, SeriesKey};

/// The pace of the writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    /// Between two writes of one series at least.
    pub interval: Duration,
    /// Series kept at most.
    pub max_series: usize,
    /// A series with nothing to write for this long is forgotten.
    pub forget_after: Duration,
}

/// One write to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// A new Event for the series' first notice.
    Create { key: SeriesKey, notice: Notice },
    /// The series' Event named `event` has seen `count` notices, the last at `last_observed`.
    Patch {
        key: SeriesKey,
        event: String,
        count: u32,
        last_observed: SystemTime,
    },
}

/// What became of one notice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The first of its series: write this now.
    Write(Write),
    /// Counted into its series; written with its next patch.
    Aggregated,
    /// A new series while [`Pacing::max_series`] are kept: not counted anywhere.
    SeriesFull,
}

#[derive(Debug)]
struct Series {
    /// The Event's name once it was created (`None` while its create is under way).
    event: Option<String>,
    /// Notices seen, written or not.
    count: u32,
    /// The count the Event holds as last written.
    written: u32,
    last_write: Instant,
    last_observed: SystemTime,
}

/// The series kept and what each has written.
#[derive(Debug)]
pub struct Aggregator {
    pacing: Pacing,
    series: HashMap<SeriesKey, Series>,
}

impl Aggregator {
    pub fn new(pacing: Pacing) -> Self {
        Self {
            pacing,
            series: HashMap::new(),
        }
    }

    /// One notice at `now`.
    pub fn take(&mut self, notice: Notice, now: Instant) -> Taken {
        let key = notice.key();
        if let Some(series) = self.series.get_mut(&key) {
            series.count = series.count.saturating_add(1);
            series.last_observed = notice.observed_at;
            return Taken::Aggregated;
        }
        if self.series.len() >= self.pacing.max_series {
            self.forget_quiet(now);
            if self.series.len() >= self.pacing.max_series {
                return Taken::SeriesFull;
            }
        }
        self.series.insert(
            key.clone(),
            Series {
                event: None,
                count: 1,
                written: 1,
                last_write: now,
                last_observed: notice.observed_at,
            },
        );
        Taken::Write(Write::Create { key, notice })
    }

    /// The Event of `key` was created as `event`.
    pub fn created(&mut self, key: &SeriesKey, event: String) {
        if let Some(series) = self.series.get_mut(key) {
            series.event = Some(event);
        }
    }

    /// The series' Event could not be written, or is gone from the API server (expired,
    /// deleted): the series is forgotten, and its next notice creates a new Event.
    pub fn lost(&mut self, key: &SeriesKey) {
        self.series.remove(key);
    }

    /// A patch of `count` was written for `key`.
    pub fn patched(&mut self, key: &SeriesKey, count: u32, now: Instant) {
        if let Some(series) = self.series.get_mut(key) {
            series.written = series.written.max(count);
            series.last_write = now;
        }
    }

    /// The patches due at `now` (series with notices their Event lacks, written last at least
    /// an interval ago), and the series quiet for long forgotten. O(series), at most
    /// [`Pacing::max_series`], off the agent's loop.
    pub fn due(&mut self, now: Instant) -> Vec<Write> {
        self.forget_quiet(now);
        let interval = self.pacing.interval;
        self.series
            .iter()
            .filter(|(_, s)| s.count > s.written && now.duration_since(s.last_write) >= interval)
            .filter_map(|(key, s)| {
                Some(Write::Patch {
                    key: key.clone(),
                    event: s.event.clone()?,
                    count: s.count,
                    last_observed: s.last_observed,
                })
            })
            .collect()
    }

    /// When the next patch is due, if any is waiting.
    pub fn next_due(&self) -> Option<Instant> {
        self.series
            .values()
            .filter(|s| s.count > s.written && s.event.is_some())
            .map(|s| s.last_write + self.pacing.interval)
            .min()
    }

    /// Series kept now.
    pub fn series_kept(&self) -> usize {
        self.series.len()
    }

    fn forget_quiet(&mut self, now: Instant) {
        let forget_after = self.pacing.forget_after;
        self.series
            .retain(|_, s| s.count > s.written || now.duration_since(s.last_write) < forget_after);
    }
}

#[cfg(test)]
mod tests;
