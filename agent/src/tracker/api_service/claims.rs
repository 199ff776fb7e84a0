//! An explicit claim (CNI ADD, API) as the API sees it: the request checked and its claimant
//! named, before the owner makes the claim; then the claim's answer, the addresses as they
//! are after it with the conflicts it caused.

use std::net::IpAddr;

use super::ApiService;
use crate::{
    api::{
        model::{ClaimRequest, ClaimResponse, ClaimSource, ErrorCode},
        views::{conflict_view, outcome_of, ApiError, TimeBase},
    },
    datapath::attach::Role,
    netdev,
    registry::{Conflict, Holder, Source},
    tracker,
};

impl ApiService<'_> {
    /// The holder `request` names, on an interface of this node that ipq watches; refused when
    /// the request names no address, an address of the node itself, or an interface that is
    /// missing or not a workload's. Reads the kernel's interface index; changes nothing.
    pub fn claimant(&self, request: &ClaimRequest) -> Result<Holder, ApiError> {
        if request.addresses.is_empty() {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                "addresses: empty; a claim names at least one address",
            ));
        }
        let spec = &request.holder;
        if spec.interface.is_empty() {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                "holder.interface: empty; name the holder's host-side interface",
            ));
        }
        if let Some(own) = request
            .addresses
            .iter()
            .find(|a| self.core.net.is_node_address(**a))
        {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "addresses: {own} is configured on this node itself; no workload can hold it"
                ),
            )
            .with_address(*own));
        }
        let Some(ifindex) = netdev::ifindex(&spec.interface) else {
            return Err(ApiError::new(
                ErrorCode::UnknownInterface,
                format!(
                    "holder.interface `{}`: no such interface on this node",
                    spec.interface
                ),
            ));
        };
        if tracker::decide::role(&self.core.config, &spec.interface) != Some(Role::Workload) {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "holder.interface `{}`: not a workload interface (interfaces.workload = \
                     {:?}), so ipq could not enforce a claim on it",
                    spec.interface,
                    self.core.config.interfaces.workload.as_strs()
                ),
            ));
        }
        Ok(Holder::new(ifindex, spec.interface.clone()).with_identity(
            spec.container_id.clone(),
            spec.cni_ifname.clone(),
            spec.network.clone(),
            spec.netns.clone(),
            spec.pod.clone(),
        ))
    }

    /// A claim's answer: its addresses as they are now, and the conflicts it caused with what
    /// the policy did about each.
    pub fn claimed(&self, addresses: &[IpAddr], conflicts: &[Conflict]) -> ClaimResponse {
        let time = TimeBase::now();
        let conflicts = conflicts
            .iter()
            .map(|c| {
                let outcome = outcome_of(
                    c,
                    self.core.registry.records().get(c.addr),
                    self.core.config.mode,
                );
                conflict_view(c, outcome, &time)
            })
            .collect();
        ClaimResponse {
            addresses: self.views(addresses.iter().copied()),
            conflicts,
        }
    }
}

/// The MAC address a claim names for its holder, for the neighbour caches' announcements.
pub fn claim_mac(request: &ClaimRequest) -> Result<Option<[u8; 6]>, ApiError> {
    let Some(text) = request.holder.mac.as_deref() else {
        return Ok(None);
    };
    ipq_api::mac::parse_mac(text).map(Some).ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!("holder.mac `{text}`: not a MAC address (write aa:bb:cc:dd:ee:ff)"),
        )
    })
}

/// Who the registry is told made a claim.
pub fn claim_source(request: &ClaimRequest) -> Source {
    match request.source {
        ClaimSource::Cni => Source::Cni,
        ClaimSource::Api => Source::Api,
    }
}
