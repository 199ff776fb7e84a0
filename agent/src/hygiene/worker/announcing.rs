//! The worker's announcement of a new holder on its L2 segment.

use std::collections::HashMap;

use log::warn;

use super::{Worker, WorkerError};
use crate::{
    hygiene::{
        announce::{self, Announcer},
        neighbour::Link,
        Job, Report, Step,
    },
    netdev,
};

/// The links one batch looked at, each asked of the kernel once per batch: a holder's link
/// (for its bridge) and a bridge's ports.
#[derive(Default)]
pub(super) struct BatchLinks {
    links: HashMap<u32, Option<Link>>,
    ports: HashMap<u32, Vec<u32>>,
}

impl Worker {
    /// Link `ifindex` as the kernel has it (`None`: gone).
    fn batch_link(
        &mut self,
        cache: &mut BatchLinks,
        ifindex: u32,
    ) -> Result<Option<Link>, WorkerError> {
        if let Some(link) = cache.links.get(&ifindex) {
            return Ok(link.clone());
        }
        let link = match self.sockets() {
            Ok((_, neighbours)) => neighbours.link(ifindex).map_err(WorkerError::from),
            Err(e) => Err(e),
        };
        let link = link.inspect_err(|_| self.sockets = None)?;
        cache.links.insert(ifindex, link.clone());
        Ok(link)
    }

    /// The ports of bridge `bridge`.
    fn bridge_ports(
        &mut self,
        cache: &mut BatchLinks,
        bridge: u32,
    ) -> Result<Vec<u32>, WorkerError> {
        if let Some(ports) = cache.ports.get(&bridge) {
            return Ok(ports.clone());
        }
        let ports = match self.sockets() {
            Ok((_, neighbours)) => neighbours.ports_of(bridge).map_err(WorkerError::from),
            Err(e) => Err(e),
        };
        let ports: Vec<u32> = ports
            .inspect_err(|_| self.sockets = None)?
            .into_iter()
            .map(|l| l.ifindex)
            .collect();
        cache.ports.insert(bridge, ports.clone());
        Ok(ports)
    }

    /// The new holder's MAC: from the claim, else the one MAC the bridge learned behind its
    /// port.
    pub(super) fn holder_mac(&mut self, job: &Job, links: &mut BatchLinks) -> Option<[u8; 6]> {
        if job.holder_mac.is_some() {
            return job.holder_mac;
        }
        let port = job.holder_ifindex?;
        self.batch_link(links, port).ok()??.master?;
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
        links: &mut BatchLinks,
    ) {
        let Some(port) = job.holder_ifindex else {
            return;
        };
        let master = match self.batch_link(links, port) {
            Ok(link) => link.and_then(|l| l.master),
            Err(e) => {
                self.fail(report, Step::Announce, format!("reading if{port}: {e}"));
                return;
            }
        };
        let mut out: Vec<u32> = match master {
            Some(bridge) => match self.bridge_ports(links, bridge) {
                Ok(ports) => ports.into_iter().filter(|&p| p != port).collect(),
                Err(e) => {
                    self.fail(report, Step::Announce, format!("ports of if{bridge}: {e}"));
                    return;
                }
            },
            None => Vec::new(),
        };
        if self.config.announce_on_uplinks {
            out.extend(self.uplinks.iter().filter_map(|name| netdev::ifindex(name)));
        }
        if out.is_empty() {
            return;
        }
        let Some(mac) = mac else {
            self.fail(
                report,
                Step::Announce,
                "the new holder's MAC is unknown (the claim named none and the bridge learned \
                 none behind its port)",
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
