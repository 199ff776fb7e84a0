//! An explicit claim (CNI ADD, API): its claimant's interface attached at once if netlink has
//! not announced it yet, then the registry's claim with its effects, answered only once the
//! new holder's reuse hygiene is done. (The request's checks and the answer are the API
//! service's.)

use std::net::IpAddr;

use super::{api_service, enforcer::Enforcer, Tracker};
use crate::{
    api::{
        model::{ClaimRequest, ClaimResponse, ErrorCode},
        views::{ApiError, Outcome},
    },
    registry::{Conflict, Effect},
};

impl Tracker {
    pub(super) fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimResponse, ApiError> {
        let holder = self.api().claimant(request)?;
        self.protection.watch_claimant(&holder, &mut self.core.net);
        let mac = api_service::claim_mac(request)?;
        self.sinks.hygiene.begin_claim(holder.ifindex, mac);
        let source = api_service::claim_source(request);
        match self
            .core
            .registry
            .claim_all(&request.addresses, &holder, source)
        {
            Ok(effects) => {
                let conflicts: Vec<Conflict> = effects
                    .iter()
                    .filter_map(|e| match e {
                        Effect::Conflict(c) => Some((**c).clone()),
                        _ => None,
                    })
                    .collect();
                self.sinks.apply(&mut self.core, effects);
                if let Some(unwritten) = unwritten(&self.sinks.enforcer, &request.addresses) {
                    return Err(unwritten);
                }
                Ok(self.api().claimed(&request.addresses, &conflicts))
            }
            Err(error) => {
                // A claim the policy refused (`refuse-new`) is a conflict the registry did not
                // record: counted and published here.
                if let Some(conflict) = self.core.refusal(&error, &holder) {
                    self.metrics.refused_claims.inc();
                    self.sinks.observer.conflict(&conflict, Outcome::RefusedNew);
                }
                Err(api_service::refusal(&error))
            }
        }
    }
}

/// A claim whose own entry the kernel refused is not enforced: it is answered
/// `unavailable` (the claim stays in the registry, the write is retried every tick, and
/// the same claim is answered `ok` once it went through), never `ok`.
fn unwritten(enforcer: &Enforcer, addresses: &[IpAddr]) -> Option<ApiError> {
    addresses.iter().find_map(|addr| {
        let pending = enforcer.pending().get(*addr)?;
        Some(
            ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "{addr}: claimed, but the kernel refused its datapath entry ({}, {} \
                     attempts: {}); the agent retries it every tick: retry the claim later",
                    pending.wanted.kind(),
                    pending.failures,
                    pending.error
                ),
            )
            .with_address(*addr),
        )
    })
}
