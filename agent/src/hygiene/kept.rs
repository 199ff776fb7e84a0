//! The last report of each address, kept for `ipq get` for as long as the address is known:
//! compact, since the registry may hold tens of thousands of addresses.

use std::net::IpAddr;

use super::{FlushMethod, Report, Trigger};

/// What reuse hygiene keeps per address (which is its key): its live holder at its last
/// transition (`0`: none, an ifindex is never 0) and its last report. 40 bytes for every
/// address in the registry.
#[derive(Debug, Default)]
pub(super) struct AddressHygiene {
    holder: u32,
    pub(super) last: Option<KeptReport>,
}

impl AddressHygiene {
    /// Sets the live holder; returns the one before.
    pub(super) fn set_holder(&mut self, holder: Option<u32>) -> Option<u32> {
        let previous = std::mem::replace(&mut self.holder, holder.unwrap_or(0));
        (previous != 0).then_some(previous)
    }

    /// Nothing left to keep: the entry goes.
    pub(super) fn is_empty(&self) -> bool {
        self.holder == 0 && self.last.is_none()
    }
}

/// A [`Report`] as kept: the counts inline (saturated at `u32::MAX`, far above any conntrack
/// or neighbour table), the text that only unusual passes have (skip reasons, kept neighbours,
/// errors) out of line. 32 bytes instead of 120.
#[derive(Debug)]
pub(super) struct KeptReport {
    trigger: Trigger,
    conntrack_flush: FlushMethod,
    announcements: u32,
    conntrack_entries: u32,
    neighbours: u32,
    finished_ns: u64,
    notes: Option<Box<ReportNotes>>,
}

const _: () = assert!(std::mem::size_of::<AddressHygiene>() <= 40);

fn saturated(count: u64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[derive(Debug)]
struct ReportNotes {
    announce_skipped: Option<String>,
    skipped: Option<String>,
    permanent_neighbours: Vec<String>,
    errors: Vec<String>,
}

impl KeptReport {
    pub(super) fn keep(report: Report) -> Self {
        let notes = (report.skipped.is_some()
            || report.announce_skipped.is_some()
            || !report.permanent_neighbours.is_empty()
            || !report.errors.is_empty())
        .then(|| {
            Box::new(ReportNotes {
                announce_skipped: report.announce_skipped,
                skipped: report.skipped,
                permanent_neighbours: report.permanent_neighbours,
                errors: report.errors,
            })
        });
        Self {
            trigger: report.trigger,
            conntrack_flush: report.conntrack_flush,
            announcements: report.announcements,
            finished_ns: report.finished_ns,
            conntrack_entries: saturated(report.conntrack_entries),
            neighbours: saturated(report.neighbours),
            notes,
        }
    }

    pub(super) fn report(&self, address: IpAddr) -> Report {
        let notes = self.notes.as_deref();
        Report {
            address,
            trigger: self.trigger,
            finished_ns: self.finished_ns,
            conntrack_entries: u64::from(self.conntrack_entries),
            conntrack_flush: self.conntrack_flush,
            neighbours: u64::from(self.neighbours),
            announcements: self.announcements,
            announce_skipped: notes.and_then(|n| n.announce_skipped.clone()),
            skipped: notes.and_then(|n| n.skipped.clone()),
            permanent_neighbours: notes
                .map(|n| n.permanent_neighbours.clone())
                .unwrap_or_default(),
            errors: notes.map(|n| n.errors.clone()).unwrap_or_default(),
        }
    }
}
