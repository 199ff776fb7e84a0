//! Times as a person reads them in a table: "12s ago", "in 18s". The caller passes `now`, so
//! rendering is deterministic and testable.

use std::time::{Duration, SystemTime};

/// `ts` (RFC 3339, as the API sends it) relative to `now`; `ts` itself if it does not parse.
pub fn relative(ts: &str, now: SystemTime) -> String {
    let Ok(at) = humantime::parse_rfc3339(ts) else {
        return ts.to_owned();
    };
    match now.duration_since(at) {
        Ok(ago) => format!("{} ago", short(ago)),
        Err(ahead) => format!("in {}", short(ahead.duration())),
    }
}

/// `ts` followed by its relative form: "2026-11-22T10:00:00Z (12s ago)".
pub fn absolute_and_relative(ts: &str, now: SystemTime) -> String {
    let relative = relative(ts, now);
    if relative == ts {
        ts.to_owned()
    } else {
        format!("{ts} ({relative})")
    }
}

/// Two units at most, truncated: "0s", "59s", "4m5s", "3h20m", "2d4h".
pub fn short(d: Duration) -> String {
    let s = d.as_secs();
    let (m, h, days) = (s / 60, s / 3600, s / 86_400);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => two(m, "m", s % 60, "s"),
        3600..=86_399 => two(h, "h", m % 60, "m"),
        _ => two(days, "d", h % 24, "h"),
    }
}

fn two(big: u64, big_unit: &str, small: u64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big}{big_unit}")
    } else {
        format!("{big}{big_unit}{small}{small_unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ts: &str) -> SystemTime {
        humantime::parse_rfc3339(ts).unwrap()
    }

    #[test]
    fn past_and_future_are_relative_to_now() {
        let now = at("2026-11-22T10:00:30Z");
        assert_eq!(relative("2026-11-22T10:00:18Z", now), "12s ago");
        assert_eq!(relative("2026-11-22T10:00:48.500Z", now), "in 18s");
        assert_eq!(relative("2026-11-22T10:00:30Z", now), "0s ago");
        assert_eq!(relative("2026-11-22T09:55:25Z", now), "5m5s ago");
    }

    #[test]
    fn an_unparsable_time_is_shown_as_sent() {
        let now = at("2026-11-22T10:00:30Z");
        assert_eq!(relative("yesterday", now), "yesterday");
        assert_eq!(absolute_and_relative("yesterday", now), "yesterday");
        assert_eq!(
            absolute_and_relative("2026-11-22T10:00:00Z", now),
            "2026-11-22T10:00:00Z (30s ago)"
        );
    }

    #[test]
    fn durations_keep_two_units() {
        for (secs, want) in [
            (0, "0s"),
            (59, "59s"),
            (60, "1m"),
            (245, "4m5s"),
            (3600, "1h"),
            (12_000, "3h20m"),
            (86_400, "1d"),
            (187_200, "2d4h"),
        ] {
            assert_eq!(short(Duration::from_secs(secs)), want, "{secs}s");
        }
        assert_eq!(short(Duration::from_millis(1999)), "1s");
    }
}
