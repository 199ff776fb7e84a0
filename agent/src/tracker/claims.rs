//! An explicit claim (CNI ADD, API): the claimant checked and named from the request, its
//! interface attached at once if netlink has not announced it yet, then the registry's claim,
//! answered only once the new holder's reuse hygiene is done.

use super::{Role, Tracker};
use crate::{
    api::{
        model::{ClaimRequest, ClaimResponse, ClaimSource, ErrorCode},
        views::{conflict_view, ApiError, Outcome, TimeBase},
    },
    netdev,
    netlink::NetEvent,
    registry::{Conflict, Effect, Holder, RegistryError, Source},
};

impl Tracker {
    pub(super) fn api_claim(&mut self, request: ClaimRequest) -> Result<ClaimResponse, ApiError> {
        let holder = self.claimant(&request)?;
        let mac = match request.holder.mac.as_deref() {
            None => None,
            Some(text) => Some(ipq_api::mac::parse_mac(text).ok_or_else(|| {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("holder.mac `{text}`: not a MAC address (write aa:bb:cc:dd:ee:ff)"),
                )
            })?),
        };
        self.hygiene.begin_claim(holder.ifindex, mac);
        let source = match request.source {
            ClaimSource::Cni => Source::Cni,
            ClaimSource::Api => Source::Api,
        };
        match self.registry.claim_all(&request.addresses, &holder, source) {
            Ok(effects) => {
                let conflicts: Vec<Conflict> = effects
                    .iter()
                    .filter_map(|e| match e {
                        Effect::Conflict(c) => Some((**c).clone()),
                        _ => None,
                    })
                    .collect();
                self.apply_effects(effects);
                let time = TimeBase::now();
                let conflicts = conflicts
                    .iter()
                    .map(|c| conflict_view(c, self.outcome_of(c), &time))
                    .collect();
                Ok(ClaimResponse {
                    addresses: self.views(request.addresses.iter().copied()),
                    conflicts,
                })
            }
            Err(error) => {
                if let (
                    RegistryError::Refused {
                        addr, holder: old, ..
                    },
                    Some(kind),
                ) = (&error, error.conflict_kind())
                {
                    self.metrics.refused_claims.inc();
                    let conflict = Conflict {
                        kind,
                        addr: *addr,
                        old: Some((**old).clone()),
                        new: Some(holder.clone()),
                        policy: self.config.on_early_reuse,
                        at: netdev::monotonic_ns(),
                    };
                    self.observer.conflict(&conflict, Outcome::RefusedNew);
                }
                Err(ApiError::from_registry(&error, &TimeBase::now()))
            }
        }
    }

    /// The holder a claim names, on an interface of this node that ipq watches.
    fn claimant(&mut self, request: &ClaimRequest) -> Result<Holder, ApiError> {
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
            .find(|a| self.net.is_node_address(**a))
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
        if self.role(&spec.interface) != Some(Role::Workload) {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "holder.interface `{}`: not a workload interface (interfaces.workload = \
                     {:?}), so ipq could not enforce a claim on it",
                    spec.interface,
                    self.config.interfaces.workload.as_strs()
                ),
            ));
        }
        // CNI can be faster than the netlink event of the veth it just created: the attacher
        // is asked now (the role is checked above), so the claim is enforced the moment it is
        // answered. The node's mirror learns the link too (the kernel just named it), so that
        // a resync that no longer finds it forgets it; its own netlink event changes nothing.
        if self.attacher.target(ifindex).is_none() {
            self.net.apply(&NetEvent::Link {
                ifindex,
                name: spec.interface.clone(),
            });
            self.attacher.want(ifindex, &spec.interface, Role::Workload);
            self.observe_protection();
        }
        Ok(Holder::new(ifindex, spec.interface.clone()).with_identity(
            spec.container_id.clone(),
            spec.cni_ifname.clone(),
            spec.network.clone(),
            spec.netns.clone(),
            spec.pod.clone(),
        ))
    }
}
