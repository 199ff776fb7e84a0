//! How a new holder's conntrack entries are flushed, per family: by the kernel's filtered
//! flush only where the start-up probe saw the kernel honour the filter, else by the dump. The
//! probe runs on a thread of its own, so that a slow one (it needs a network namespace of its
//! own, and namespace creation waits behind every namespace being torn down) never holds up
//! the claims waiting for their flush: they go by the dump until the verdict is in.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

use log::{info, warn};

use crate::{
    config::HygieneConfig,
    hygiene::{
        flush_probe::{self, Verdict},
        ClaimFlush,
    },
};

/// The choice, written once by the probe's thread, read by the worker per batch.
#[derive(Debug, Default)]
pub(super) struct Choice {
    v4: AtomicBool,
    v6: AtomicBool,
}

impl Choice {
    pub(super) fn v4(&self) -> bool {
        self.v4.load(Ordering::Relaxed)
    }

    pub(super) fn v6(&self) -> bool {
        self.v6.load(Ordering::Relaxed)
    }
}

fn show(shown: &Mutex<Option<ClaimFlush>>, view: ClaimFlush) {
    *shown
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(view);
}

/// Decides the flush per family (at once when the configuration does, else by the probe on a
/// thread of its own) and shows it in `shown` (`/v1/status`).
pub(super) fn start(
    config: &HygieneConfig,
    shown: Arc<Mutex<Option<ClaimFlush>>>,
    choice: Arc<Choice>,
) {
    if !config.flush {
        return;
    }
    if !config.filtered_flush {
        info!(
            "conntrack flush on claims: a dump of the whole table (hygiene.filtered_flush = \
             false)"
        );
        let off = "dump (hygiene.filtered_flush = false)".to_owned();
        show(
            &shown,
            ClaimFlush {
                ipv4: off.clone(),
                ipv6: off,
            },
        );
        return;
    }
    let probe = move || probe(&shown, &choice);
    if let Err(e) = std::thread::Builder::new()
        .name("ipq-flush-probe".into())
        .spawn(probe)
    {
        warn!("conntrack flush on claims: a dump of the whole table; the probe's thread: {e}");
    }
}

fn probe(shown: &Mutex<Option<ClaimFlush>>, choice: &Choice) {
    let started = Instant::now();
    let verdicts = flush_probe::run();
    let took = started.elapsed();
    let shown_as = |v: &Verdict| match v {
        Verdict::Honoured => "kernel".to_owned(),
        other => format!("dump ({})", other.describe()),
    };
    // In force, then shown, then logged: whoever reads the log line or `/v1/status` finds
    // the choice already made.
    choice
        .v4
        .store(verdicts.v4 == Verdict::Honoured, Ordering::Relaxed);
    choice
        .v6
        .store(verdicts.v6 == Verdict::Honoured, Ordering::Relaxed);
    show(
        shown,
        ClaimFlush {
            ipv4: shown_as(&verdicts.v4),
            ipv6: shown_as(&verdicts.v6),
        },
    );
    for (family, verdict) in [("IPv4", &verdicts.v4), ("IPv6", &verdicts.v6)] {
        let why = verdict.describe();
        match verdict {
            Verdict::Honoured => info!(
                "conntrack flush on claims, {family}: the kernel's filtered flush; probe \
                 ({took:.0?}): {why}"
            ),
            Verdict::Refused(_) => info!(
                "conntrack flush on claims, {family}: a dump of the whole table; probe \
                 ({took:.0?}): {why} (supported from Linux 6.12)"
            ),
            Verdict::Unavailable(_) | Verdict::Ignored(_) => warn!(
                "conntrack flush on claims, {family}: a dump of the whole table; probe \
                 ({took:.0?}): {why}"
            ),
        }
    }
}
