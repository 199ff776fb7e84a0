//! An explicit claim (CNI ADD, API): its claimant's interface attached at once if netlink has
//! not announced it yet, then the registry's claim with its effects, answered only once the
//! new holder's reuse hygiene is done. (The request's checks and the answer are the API
//! service's.)

use std::net::IpAddr;

use super::{api_service, enforcer::Enforcer, Role, Tracker};
use crate::{
    api::{
        model::{ClaimRequest, ClaimResponse, ErrorCode},
        views::{ApiError, Outcome},
    },
    netlink::NetEvent,
    registry::{Conflict, Effect, Holder},
};

impl Tracker {
    pub(super) fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimResponse, ApiError> {
        let holder = self.api().claimant(request)?;
        self.watch_claimant(&holder);
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

    /// CNI can be faster than the netlink event of the veth it just created: the attacher is
    /// asked now (the API service checked the role), so the claim is enforced the moment it is
    /// answered. The node's mirror learns the link too (the kernel just named it), so that a
    /// resync that no longer finds it forgets it; its own netlink event changes nothing.
    fn watch_claimant(&mut self, holder: &Holder) {
        if self
            .protection
            .attacher
            .ledger()
            .target(holder.ifindex)
            .is_none()
        {
            self.core.net.apply(&NetEvent::Link {
                ifindex: holder.ifindex,
                name: holder.ifname.clone(),
            });
            self.protection
                .attacher
                .want(holder.ifindex, &holder.ifname, Role::Workload);
            self.protection.observe();
        }
    }
}

/// A claim whose own entry the kernel refused is not enforced: it is answered
/// `unavailable` (the claim stays in the registry, the write is retried every tick, and
/// the same claim is answered `ok` once it went through), never `ok`.
fn unwritten(enforcer: &Enforcer, addresses: &[IpAddr]) -> Option<ApiError> {
    addresses.iter().find_map(|addr| {
        let pending = enforcer.pending_for(*addr)?;
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
