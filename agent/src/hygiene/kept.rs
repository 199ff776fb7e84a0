//! The last report of each address, kept for `ipq get` for as long as the address is known:
//! compact, since the registry may hold tens of thousands of addresses.

use std::net::IpAddr;

use super::{FlushMethod, Report, Trigger};

/// A [`Report`] as kept for an address (which is its key): the counts inline, the text that
/// only unusual passes have (skip reasons, kept neighbours, errors) out of line. 40 bytes
/// instead of 120, for every address in the registry.
#[derive(Debug)]
pub(super) struct KeptReport {
    trigger: Trigger,
    conntrack_flush: FlushMethod,
    announcements: u32,
    finished_ns: u64,
    conntrack_entries: u64,
    neighbours: u64,
    notes: Option<Box<ReportNotes>>,
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
            conntrack_entries: report.conntrack_entries,
            neighbours: report.neighbours,
            notes,
        }
    }

    pub(super) fn report(&self, address: IpAddr) -> Report {
        let notes = self.notes.as_deref();
        Report {
            address,
            trigger: self.trigger,
            finished_ns: self.finished_ns,
            conntrack_entries: self.conntrack_entries,
            conntrack_flush: self.conntrack_flush,
            neighbours: self.neighbours,
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
