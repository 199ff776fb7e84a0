//! The API's answers. [`ApiService`] borrows, read-only, the parts of the registry's owner an
//! answer is made of (the registry, the attacher's interfaces, the node's links, the reuse
//! hygiene reports, ipq-ipam's holds, the event feed) and builds every view the API returns:
//! the reads it answers alone; for a change, the owner makes it and the service presents what
//! it did. Registry refusals become API errors here too, and answers wait for the journal
//! ([`answer`]).
//!
//! It lives beside the tracker rather than in `api` because it reads the tracker's own parts
//! (the feed, its start-up facts); `api` keeps the wire types and the conversions that need
//! none of them (`api::views`).

use strum::VariantArray as _;
pub mod answer;
mod break_glass;
mod claims;
mod holds;
mod refusal;
#[cfg(test)]
mod tests;

pub use break_glass::{datapath_entry, datapath_view};
pub use claims::{claim_mac, claim_source};
pub use refusal::refusal;

use std::{net::IpAddr, sync::Arc, time::SystemTime};

use super::{feed::EventHub, hygiene::hygiene_view, pending_writes::PendingWrites, Tracker};
use crate::{
    api::{
        model::{
            AddressList, AddressView, ChangedResponse, ClaimFlushView, ConflictList, ErrorCode,
            InterfaceStatus, RecoveryView, StartedView, Status, VerificationView,
        },
        views::{address_view, status_view, ApiError, StatusFacts, TimeBase},
    },
    config::Config,
    datapath::attach::Attacher,
    hygiene::Hygiene,
    ipam::holds::Holds,
    metrics::Metrics,
    netlink::NetState,
    registry::{AddrRecord, Registry, StateName},
};

/// Pending datapath writes `/v1/status` lists (all are counted).
const PENDING_WRITES_SHOWN: usize = 16;

/// The registry owner's state as the API reads it: borrowed for one answer, never changed.
pub struct ApiService<'a> {
    registry: &'a Registry,
    config: &'a Config,
    metrics: &'a Metrics,
    attacher: &'a Attacher,
    net: &'a NetState,
    hygiene: &'a Hygiene,
    ipam_holds: &'a Holds,
    feed: &'a EventHub,
    /// The datapath writes the kernel refused.
    writes: &'a PendingWrites,
    started_at: SystemTime,
    recovered: Option<&'a RecoveryView>,
    started: Option<&'a StartedView>,
    bpf_watcher: &'a Result<Arc<crate::datapath::bpf_watch::Pokes>, String>,
    publish: Option<&'a crate::publish::Feed>,
    whereabouts: Option<&'a crate::publish::whereabouts::Feed>,
}

impl Tracker {
    /// The API's reading of this owner's state, for one answer.
    pub(super) fn api(&self) -> ApiService<'_> {
        ApiService {
            registry: &self.core.registry,
            config: &self.core.config,
            metrics: &self.metrics,
            attacher: &self.protection.attacher,
            net: &self.core.net,
            hygiene: &self.sinks.hygiene,
            ipam_holds: &self.ipam.holds,
            feed: self.sinks.observer.feed(),
            writes: self.sinks.enforcer.pending(),
            started_at: self.started_at,
            recovered: self.recovered.as_ref(),
            started: self.protection.started.as_ref(),
            bpf_watcher: &self.protection.bpf_watcher,
            publish: self.publishing.publish.as_ref(),
            whereabouts: self.publishing.whereabouts.as_ref(),
        }
    }
}

impl ApiService<'_> {
    /// `GET /v1/status`.
    pub fn status(&self) -> Status {
        let interfaces: Vec<InterfaceStatus> = self
            .attacher
            .targets()
            .iter()
            .map(|(ifindex, target)| InterfaceStatus {
                ifindex: *ifindex,
                name: target.name.clone(),
                hooks: target
                    .attached
                    .iter()
                    .map(|(p, by)| by.attached_hook(*p))
                    .collect(),
                protection: target.protection,
                attachment: target.attachment(),
                error: target.last_error.clone(),
                failed_attempts: target.failures,
            })
            .collect();
        let conflicts_total = crate::registry::ConflictKind::VARIANTS
            .iter()
            .map(|k| {
                self.metrics
                    .conflicts
                    .with_label_values(&[k.as_ref()])
                    .get()
            })
            .sum();
        let facts =
            StatusFacts {
                ready: self.metrics.readiness.is_ready(),
                not_ready: self.metrics.readiness.check().err().map(|e| e.to_string()),
                tc_attach: self.attacher.mode().into(),
                conntrack_claim_flush: self.hygiene.claim_flush().map(|f| ClaimFlushView {
                    ipv4: f.ipv4,
                    ipv6: f.ipv6,
                }),
                mode: self.config.mode,
                on_early_reuse: self.config.on_early_reuse,
                conflicts_total,
                refused_claims_total: self.metrics.refused_claims.get(),
                started_at: self.started_at,
                verification: self.attacher.verified().map(|v| VerificationView {
                    at: humantime::format_rfc3339_millis(v.finished_at).to_string(),
                    took_us: u64::try_from(v.took.as_micros()).unwrap_or(u64::MAX),
                    pins: v.pins as u64,
                    found: v.found.clone(),
                    last_found_at: self
                        .attacher
                        .last_found()
                        .map(|l| humantime::format_rfc3339_millis(l.finished_at).to_string()),
                    last_found: self
                        .attacher
                        .last_found()
                        .map_or_else(Vec::new, |l| l.found.clone()),
                }),
                // No netlink group announces these changes: say what finds them, and how late.
                unannounced: match self.bpf_watcher.as_ref().map(|pokes| pokes.stopped()) {
                    Ok(Some(why)) => format!(
                    "periodic verification only, every {} (the bpf() watcher STOPPED: {why}): a \
                     detached link, a program put ahead of ipq's TCX link and a map written by \
                     another process are found within it",
                    humantime::format_duration(self.config.verify_interval)
                ),
                    Ok(None) => format!(
                    "bpf() watcher (raw tracepoint {}): another process's link detach, program \
                     attach or write to ipq's maps is verified within milliseconds; periodic \
                     verification every {} as the backstop (a map written through a mapping \
                     or a descriptor opened before the agent started){}",
                    ipq_common::watch::WATCHED_TRACEPOINT,
                    humantime::format_duration(self.config.verify_interval),
                    match self.bpf_watcher.as_ref().map_or(0, |pokes| pokes.lost_total()) {
                        0 => String::new(),
                        lost => format!(
                            "; {lost} calls lost to its full ring, each time answered by \
                             verifying everything"
                        ),
                    }
                ),
                    Err(why) => format!(
                        "periodic verification only, every {} (the bpf() watcher is not attached: \
                     {why}): a detached link, a program put ahead of ipq's TCX link and a map \
                     written by another process are found within it",
                        humantime::format_duration(self.config.verify_interval)
                    ),
                },
                recovery: self.recovered.cloned(),
                started: self.started.cloned(),
                writes_pending: self.writes.len() as u64,
                pending_writes: self.writes.views(PENDING_WRITES_SHOWN),
                publish: self.publish.map(crate::publish::Feed::view),
                whereabouts: self
                    .whereabouts
                    .map(crate::publish::whereabouts::Feed::view),
            };
        status_view(facts, self.registry, interfaces)
    }

    /// `GET /v1/addresses[?state=S]`: the registry's records, and under `free` the addresses
    /// ipq-ipam still holds that the registry has freed.
    pub fn list(&self, state: Option<StateName>) -> AddressList {
        let time = TimeBase::now();
        let mut addresses: Vec<AddressView> = self
            .registry
            .records()
            .iter()
            .filter(|r| state.is_none_or(|s| r.state() == s))
            .map(|r| self.view_of(r, &time))
            .collect();
        if state.is_none_or(|s| s == StateName::Free) {
            addresses.extend(self.held_free_views());
        }
        AddressList { addresses }
    }

    /// `GET /v1/addresses/{ip}`.
    pub fn get(&self, addr: IpAddr) -> Result<AddressView, ApiError> {
        let time = TimeBase::now();
        self.registry
            .records()
            .get(addr)
            .map(|r| self.view_of(r, &time))
            .or_else(|| self.held_free_view(addr))
            .or_else(|| self.unwritten_free_view(addr))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("{addr}: free (not in the registry)"),
                )
                .with_address(addr)
            })
    }

    /// `GET /v1/conflicts[?limit=N]`.
    pub fn conflicts(&self, limit: usize) -> ConflictList {
        ConflictList {
            conflicts: self.feed.recent_conflicts(limit),
        }
    }

    /// The answer to a change: the addresses it changed, as they are now.
    pub fn changed(&self, addrs: impl IntoIterator<Item = IpAddr>) -> ChangedResponse {
        ChangedResponse {
            addresses: self.views(addrs),
        }
    }

    /// The views of those of `addrs` the registry has.
    fn views(&self, addrs: impl IntoIterator<Item = IpAddr>) -> Vec<AddressView> {
        let time = TimeBase::now();
        addrs
            .into_iter()
            .filter_map(|a| {
                self.registry
                    .records()
                    .get(a)
                    .map(|r| self.view_of(r, &time))
            })
            .collect()
    }

    /// A record's view, with the protection of its live holder's interface, ipq-ipam's hold of
    /// the address and its last hygiene pass.
    fn view_of(&self, record: &AddrRecord, time: &TimeBase) -> AddressView {
        let mut view = self.with_ipam_hold(address_view(record, time));
        if let Some(target) = record
            .status
            .holder()
            .and_then(|h| self.attacher.target(h.ifindex))
        {
            view.protection = Some(target.protection);
            view.attachment = target.attachment();
        }
        view.last_flush = self
            .hygiene
            .last(view.address)
            .map(|r| hygiene_view(&r, Some(time)));
        view.pending_write = self.writes.get(view.address).map(|p| p.view(view.address));
        view
    }

    /// A free address whose entry the kernel refused to delete: the datapath still enforces
    /// its old entry, and its view says so rather than 404.
    fn unwritten_free_view(&self, addr: IpAddr) -> Option<AddressView> {
        let pending = self.writes.get(addr)?;
        Some(AddressView {
            pending_write: Some(pending.view(addr)),
            ..AddressView::free(addr)
        })
    }
}
