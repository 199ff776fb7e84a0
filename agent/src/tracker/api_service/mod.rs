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

use std::{net::IpAddr, time::SystemTime};

use super::{
    decide::Core, effects::Sinks, ipam::IpamSide, protection::Protection, publish::Publishing,
    Tracker,
};
use crate::{
    api::{
        model::{
            AddressList, AddressView, ChangedResponse, ConflictList, ErrorCode, RecoveryView,
            Status,
        },
        views::{address_view, status_view, ApiError, StatusFacts, TimeBase},
    },
    metrics::Metrics,
    registry::{AddrRecord, StateName},
};

/// The registry owner's parts as the API reads them: borrowed for one answer, never changed.
/// Each part makes its own share of a view (`Protection::status`, `Sinks::status`, their
/// `annotate`s, ipq-ipam's holds, the publishers' views); the service puts them together with
/// the registry's records.
pub struct ApiService<'a> {
    /// The registry, the node's links and the configuration.
    core: &'a Core,
    sinks: &'a Sinks,
    protection: &'a Protection,
    ipam: &'a IpamSide,
    publishing: &'a Publishing,
    metrics: &'a Metrics,
    started_at: SystemTime,
    recovered: Option<&'a RecoveryView>,
}

impl Tracker {
    /// The API's reading of this owner's state, for one answer.
    pub(super) fn api(&self) -> ApiService<'_> {
        ApiService {
            core: &self.core,
            sinks: &self.sinks,
            protection: &self.protection,
            ipam: &self.ipam,
            publishing: &self.publishing,
            metrics: &self.metrics,
            started_at: self.started_at,
            recovered: self.recovered.as_ref(),
        }
    }
}

impl ApiService<'_> {
    /// `GET /v1/status`.
    pub fn status(&self) -> Status {
        let config = &self.core.config;
        let protection = self.protection.status(config.verify_interval);
        let sinks = self.sinks.status();
        let conflicts_total = crate::registry::ConflictKind::VARIANTS
            .iter()
            .map(|k| {
                self.metrics
                    .conflicts
                    .with_label_values(&[k.as_ref()])
                    .get()
            })
            .sum();
        let facts = StatusFacts {
            ready: self.metrics.readiness.is_ready(),
            not_ready: self.metrics.readiness.check().err().map(|e| e.to_string()),
            tc_attach: protection.tc_attach,
            conntrack_claim_flush: sinks.conntrack_claim_flush,
            mode: config.mode,
            on_early_reuse: config.on_early_reuse,
            conflicts_total,
            refused_claims_total: self.metrics.refused_claims.get(),
            started_at: self.started_at,
            verification: protection.verification,
            unannounced: protection.unannounced,
            recovery: self.recovered.cloned(),
            started: protection.started,
            writes_pending: sinks.writes_pending,
            pending_writes: sinks.pending_writes,
            publish: self
                .publishing
                .publish
                .as_ref()
                .map(crate::publish::Feed::view),
            whereabouts: self
                .publishing
                .whereabouts
                .as_ref()
                .map(crate::publish::whereabouts::Feed::view),
            cluster: self.publishing.cluster.as_ref().map(|c| c.view()),
            namespaces: self.core.config.namespaces.lists(),
        };
        status_view(facts, &self.core.registry, protection.interfaces)
    }

    /// `GET /v1/addresses[?state=S]`: the registry's records, and under `free` the addresses
    /// ipq-ipam still holds that the registry has freed.
    pub fn list(&self, state: Option<StateName>) -> AddressList {
        let time = TimeBase::now();
        let mut addresses: Vec<AddressView> = self
            .core
            .registry
            .records()
            .iter()
            .filter(|r| state.is_none_or(|s| r.state() == s))
            .map(|r| self.view_of(r, &time))
            .collect();
        if state.is_none_or(|s| s == StateName::Free) {
            addresses.extend(self.ipam.held_free_views(&self.core.registry));
        }
        AddressList { addresses }
    }

    /// `GET /v1/addresses/{ip}`.
    pub fn get(&self, addr: IpAddr) -> Result<AddressView, ApiError> {
        let time = TimeBase::now();
        self.core
            .registry
            .records()
            .get(addr)
            .map(|r| self.view_of(r, &time))
            .or_else(|| self.ipam.held_free_view(addr))
            .or_else(|| self.sinks.unwritten_free_view(addr))
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
            conflicts: self.sinks.observer.feed().recent_conflicts(limit),
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
                self.core
                    .registry
                    .records()
                    .get(a)
                    .map(|r| self.view_of(r, &time))
            })
            .collect()
    }

    /// A record's view, with what each part knows of its address: the protection of its live
    /// holder's interface, its last hygiene pass and refused write, ipq-ipam's hold of it.
    fn view_of(&self, record: &AddrRecord, time: &TimeBase) -> AddressView {
        let mut view = address_view(record, time);
        self.protection.annotate(&mut view, record);
        self.sinks.annotate(&mut view, time);
        self.ipam.annotate(&mut view);
        view
    }
}
