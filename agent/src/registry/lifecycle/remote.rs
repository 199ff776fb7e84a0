//! A remote claim: another machine announced (gratuitous ARP, unsolicited NA) an address a
//! holder here still has. docs/design.md "Remote claim" says what is fenced and why; this is
//! the one place that decides it.

use std::net::IpAddr;

use super::transitions::known;
use crate::config::EarlyReusePolicy;
use crate::registry::{AddrStatus, Clock, ConflictKind, Effect, Holder, Lifecycle, RegistryError};

/// What the cluster said of a remote claim's local holder (its pod, by the API server).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodStanding {
    /// The pod is gone, or another pod has its name now: the cluster freed the address, and
    /// the local holder is the stale one.
    Gone,
    /// The pod is there (terminating or not): the cluster still gives it the address (whereabouts
    /// frees it on the Pod's DELETE), so the announcement is a double allocation or a forgery.
    Present,
    /// The API server did not answer: the announcement is taken at its word, as on a node
    /// without Kubernetes.
    Unknown,
}

impl<C: Clock> Lifecycle<C> {
    /// Another machine announced `addr` while a holder here still has it: a `remote_claim`
    /// conflict. A Draining holder is fenced (it is on its way out and the address now lives
    /// elsewhere). An Active one is fenced under `fence-old` (a cluster IPAM that handed the
    /// address to another node has made the local holder the stale one), but an announcement
    /// is only a packet, which anyone on the uplink's L2 can forge: when the holder names its
    /// pod and `ask_the_cluster` (the agent can ask the API server), nothing is decided yet and
    /// [`Effect::AskAboutHolder`] asks whether the pod is still there; the answer comes back to
    /// [`Self::remote_claim_answered`]. Under `refuse-new` and `observe` it is only reported
    /// (nothing here can refuse a claim made on another node). Neither is fenced while a
    /// blocked claimant holds the datapath's fence slot. A Quarantined address moving to
    /// another machine is no conflict.
    pub fn remote_claim(
        &mut self,
        addr: IpAddr,
        ask_the_cluster: bool,
    ) -> Result<Vec<Effect>, RegistryError> {
        let (addr, record) = known(&self.records, addr)?;
        let Some(holder) = record.status.holder().cloned() else {
            return Ok(Vec::new());
        };
        let would_fence_active = self.settings.policy == EarlyReusePolicy::FenceOld;
        let already_fenced = record.fenced().is_some_and(|f| f.same_as(&holder));
        if ask_the_cluster
            && would_fence_active
            && !already_fenced
            && matches!(record.status, AddrStatus::Active { .. })
            && holder.pod().is_some()
        {
            return Ok(vec![Effect::AskAboutHolder { addr, holder }]);
        }
        self.settle_remote_claim(addr, &holder, would_fence_active)
    }

    /// The cluster's answer about `holder`, the local holder of `addr` when another machine
    /// announced it ([`Self::remote_claim`]). Fenced when its pod is gone or the API server did
    /// not answer; only reported while its pod is there. Nothing when the address has another
    /// holder now or none (a claim still made is sampled again).
    pub fn remote_claim_answered(
        &mut self,
        addr: IpAddr,
        holder: &Holder,
        standing: PodStanding,
    ) -> Result<Vec<Effect>, RegistryError> {
        let Ok((addr, record)) = known(&self.records, addr) else {
            return Ok(Vec::new());
        };
        if !record.status.holder().is_some_and(|h| h.same_as(holder)) {
            return Ok(Vec::new());
        }
        let fence_active =
            self.settings.policy == EarlyReusePolicy::FenceOld && standing != PodStanding::Present;
        self.settle_remote_claim(addr, holder, fence_active)
    }

    /// Records the remote claim's conflict, fencing `holder` when it is Draining, or Active
    /// and `fence_active`.
    fn settle_remote_claim(
        &mut self,
        addr: IpAddr,
        holder: &Holder,
        fence_active: bool,
    ) -> Result<Vec<Effect>, RegistryError> {
        let (addr, record) = known(&self.records, addr)?;
        let mut next = record.clone();
        let fence = match next.status {
            AddrStatus::Draining { .. } => true,
            AddrStatus::Active { .. } => fence_active,
            AddrStatus::Quarantined { .. } => false,
        };
        if fence && next.blocked_claimant().is_none() {
            next.fence(holder.clone());
        }
        let now = self.clock.now();
        let conflict = next.conflict(
            ConflictKind::RemoteClaim,
            Some(holder.clone()),
            None,
            self.settings.policy,
            now,
        );
        let mut out = Vec::new();
        self.records.put(addr, Some(next), &mut out);
        out.push(conflict);
        Ok(out)
    }
}
