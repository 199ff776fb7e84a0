//! The worker's announcement of a new holder on its L2 segment.

use log::warn;

use super::Worker;
use crate::hygiene::{
    announce::{self, Announcer},
    neighbour::Link,
    Job, Report, Step,
};

impl Worker {
    /// The new holder's MAC: from the claim, else the one MAC the bridge learned behind its
    /// port.
    pub(super) fn holder_mac(&mut self, job: &Job, links: &[Link]) -> Option<[u8; 6]> {
        if job.holder_mac.is_some() {
            return job.holder_mac;
        }
        let port = job.holder_ifindex?;
        links.iter().find(|l| l.ifindex == port)?.master?;
        let learned = self.sockets().ok()?.1.learned_macs(port).ok()?;
        match learned[..] {
            [mac] => Some(mac),
            _ => None,
        }
    }

    /// Sends the announcement on every other port of the holder's bridge (never back to the
    /// holder: an IPv6 holder still doing DAD would take it for a duplicate), and on the
    /// uplinks when configured.
    pub(super) fn announce(
        &mut self,
        job: &Job,
        report: &mut Report,
        mac: Option<[u8; 6]>,
        links: &[Link],
    ) {
        let Some(port) = job.holder_ifindex else {
            return;
        };
        let master = links
            .iter()
            .find(|l| l.ifindex == port)
            .and_then(|l| l.master);
        let mut out: Vec<u32> = match master {
            Some(bridge) => links
                .iter()
                .filter(|l| l.master == Some(bridge) && l.ifindex != port)
                .map(|l| l.ifindex)
                .collect(),
            None => Vec::new(),
        };
        if self.config.announce_on_uplinks {
            out.extend(
                links
                    .iter()
                    .filter(|l| self.uplinks.contains(&l.name))
                    .map(|l| l.ifindex),
            );
        }
        if out.is_empty() {
            return;
        }
        let Some(mac) = mac else {
            self.fail(
                report,
                Step::Announce,
                "the new holder's MAC is unknown (the claim named none and the bridge learned \
                 none behind its port)"
                    .into(),
            );
            return;
        };
        if self.announcer.is_none() {
            match Announcer::open(self.config.announce_per_second) {
                Ok(a) => self.announcer = Some(a),
                Err(e) => {
                    self.fail(report, Step::Announce, format!("AF_PACKET socket: {e}"));
                    return;
                }
            }
        }
        let announcer = self.announcer.as_mut().expect("just opened");
        if !announcer.may_send() {
            let why = format!(
                "rate-limited (announce_per_second = {})",
                self.config.announce_per_second
            );
            warn!("{}: announcement not sent: {why}", report.address);
            report.announce_skipped = Some(why);
            self.metrics.announcements_rate_limited.inc();
            return;
        }
        let frame = announce::frame(report.address, mac);
        let mut failures = Vec::new();
        for ifindex in out {
            match announcer.send(ifindex, &frame) {
                Ok(()) => report.announcements += 1,
                Err(e) => failures.push(format!("if{ifindex}: {e}")),
            }
        }
        self.metrics
            .announcements
            .inc_by(u64::from(report.announcements));
        if !failures.is_empty() {
            self.fail(report, Step::Announce, failures.join(", "));
        }
    }
}
