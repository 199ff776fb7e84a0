//! The worker's flushes of a batch: conntrack entries (the kernel's filtered flush where the
//! probe proved it, else one dump for the batch) and neighbour entries (one read of the table
//! for the batch, then a deletion per entry).

use std::{collections::BTreeSet, net::IpAddr};

use ipq_api::mac::format_mac;
use log::warn;

use super::{Worker, WorkerError};
use crate::hygiene::{neighbour::NeighbourEntry, FlushMethod, Report, Step, Trigger};

impl Worker {
    pub(super) fn flush_conntrack(&mut self, reports: &mut [Report]) {
        // The reports whose addresses the dump flushes (by index: an address can have two
        // jobs in a batch, one of them flushed by the kernel).
        let mut dumped = vec![false; reports.len()];
        for (report, dump) in reports.iter_mut().zip(dumped.iter_mut()) {
            if report.skipped.is_some() {
                continue;
            }
            let honoured = match report.address {
                IpAddr::V4(_) => self.kernel_flush.v4(),
                IpAddr::V6(_) => self.kernel_flush.v6(),
            };
            if !(honoured && report.trigger == Trigger::NewHolder) {
                *dump = true;
                continue;
            }
            let result = match self.sockets() {
                Ok((conntrack, _)) => conntrack
                    .flush_in_kernel(report.address)
                    .map_err(WorkerError::from),
                Err(e) => Err(e),
            };
            match result {
                Ok(reported) => {
                    self.metrics.conntrack_entries_flushed.inc_by(reported);
                    report.conntrack_entries = reported;
                    report.conntrack_flush = FlushMethod::Kernel;
                }
                Err(e) => {
                    // The kernel passed the probe, so this is a fault of the moment (or of the
                    // socket): the dump still flushes the address before its claim is answered.
                    warn!(
                        "{}: the kernel's filtered conntrack flush failed ({e}); dumping instead",
                        report.address
                    );
                    self.sockets = None;
                    *dump = true;
                }
            }
        }
        let targets: BTreeSet<IpAddr> = reports
            .iter()
            .zip(&dumped)
            .filter(|(_, dump)| **dump)
            .map(|(r, _)| r.address)
            .collect();
        if targets.is_empty() {
            return;
        }
        let result = match self.sockets() {
            Ok((conntrack, _)) => conntrack.flush(&targets).map_err(WorkerError::from),
            Err(e) => Err(e),
        };
        match result {
            Ok(flushed) => {
                let total: u64 = flushed.values().sum();
                self.metrics.conntrack_entries_flushed.inc_by(total);
                for (report, _) in reports.iter_mut().zip(&dumped).filter(|(_, d)| **d) {
                    report.conntrack_entries = flushed.get(&report.address).copied().unwrap_or(0);
                    report.conntrack_flush = FlushMethod::Dump;
                }
            }
            Err(e) => {
                self.sockets = None;
                for (report, _) in reports.iter_mut().zip(&dumped).filter(|(_, d)| **d) {
                    self.fail(report, Step::Conntrack, &e);
                }
            }
        }
    }

    /// The node's neighbour entries of every address of the batch still to clean, in one
    /// read of the table; when the read fails, each of those reports says so.
    pub(super) fn neighbour_entries(
        &mut self,
        reports: &mut [Report],
    ) -> Option<std::collections::HashMap<IpAddr, Vec<NeighbourEntry>>> {
        let addrs: BTreeSet<IpAddr> = reports
            .iter()
            .filter(|r| r.skipped.is_none())
            .map(|r| r.address)
            .collect();
        if addrs.is_empty() {
            return Some(Default::default());
        }
        let result = match self.sockets() {
            Ok((_, neighbours)) => neighbours.entries_of(&addrs).map_err(WorkerError::from),
            Err(e) => Err(e),
        };
        match result {
            Ok(found) => Some(found),
            Err(e) => {
                self.sockets = None;
                for report in reports.iter_mut().filter(|r| r.skipped.is_none()) {
                    self.fail(report, Step::Neighbours, &e);
                }
                None
            }
        }
    }

    pub(super) fn flush_neighbours(
        &mut self,
        report: &mut Report,
        entries: &[NeighbourEntry],
        mac: Option<[u8; 6]>,
    ) {
        let result = match self.sockets() {
            Ok((_, neighbours)) => neighbours
                .flush(report.address, entries, mac)
                .map_err(WorkerError::from),
            Err(e) => Err(e),
        };
        match result {
            Ok(flushed) => {
                self.metrics.neighbours_flushed.inc_by(flushed.deleted);
                report.neighbours = flushed.deleted;
                for entry in flushed.permanent {
                    let mac = entry.mac.map_or_else(|| "none".to_owned(), format_mac);
                    let line = format!("if{} lladdr {mac}", entry.ifindex);
                    warn!(
                        "{}: a PERMANENT neighbour entry ({line}) does not point at the new \
                         holder; left alone (a CNI's)",
                        report.address
                    );
                    report.permanent_neighbours.push(line);
                }
            }
            Err(e) => {
                self.sockets = None;
                self.fail(report, Step::Neighbours, e);
            }
        }
    }
}
