//! The runtime's drains as the core decides them: a CNI DEL drains its attachment's addresses,
//! a CNI GC every CNI-made holder the runtime no longer lists.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use super::{settled, Core};
use crate::{
    api::model::{DrainAttachmentRequest, GcRequest},
    registry::{Effect, Holder, Registry, StateName},
};

/// What a drain of several holders did: the addresses drained, and the registry's effects.
#[derive(Debug, Default)]
pub(in crate::tracker) struct Drained {
    pub(in crate::tracker) addresses: BTreeSet<IpAddr>,
    pub(in crate::tracker) effects: Vec<Effect>,
}

impl Core {
    /// CNI DEL: the attachment's holder is terminating.
    pub(in crate::tracker) fn drain_attachment(
        &mut self,
        request: &DrainAttachmentRequest,
    ) -> Drained {
        let of_attachment = |h: &Holder| {
            h.container_id() == Some(request.container_id.as_str())
                && match (request.cni_ifname.as_deref(), h.cni_ifname()) {
                    (Some(asked), Some(known)) => asked == known,
                    _ => true,
                }
        };
        let targets: Vec<(IpAddr, Holder)> = self
            .registry
            .records()
            .held_by_container(&request.container_id)
            .filter_map(|r| {
                let holder = r.status.holder()?;
                of_attachment(holder).then(|| (r.addr, holder.clone()))
            })
            .collect();
        drain_all(&mut self.registry, targets, "CNI DEL")
    }

    /// CNI GC: every CNI-made holder whose attachment the runtime no longer lists drains.
    /// O(n + m) for n records and m attachments: the runtime's list is hashed once, not
    /// searched per record. (A GC compares the whole registry with the runtime's whole list,
    /// so it cannot be less than O(n); runtimes send one at start and then rarely.)
    pub(in crate::tracker) fn gc(&mut self, request: &GcRequest) -> Drained {
        let mut listed: HashMap<&str, HashSet<&str>> = HashMap::new();
        for a in &request.valid_attachments {
            listed
                .entry(a.container_id.as_str())
                .or_default()
                .insert(a.ifname.as_str());
        }
        let valid = |h: &Holder| {
            let Some(id) = h.container_id() else {
                // Not made through CNI: GC has no say over it.
                return true;
            };
            if let (Some(collected), Some(own)) = (request.network.as_deref(), h.network()) {
                if collected != own {
                    // Another network's runtime state: its own GC judges it.
                    return true;
                }
            }
            listed
                .get(id)
                .is_some_and(|ifnames| h.cni_ifname().is_none_or(|i| ifnames.contains(i)))
        };
        let targets: Vec<(IpAddr, Holder)> = self
            .registry
            .records()
            .iter()
            .filter(|r| r.state() == StateName::Active)
            .filter_map(|r| {
                let holder = r.status.holder()?;
                (!valid(holder)).then(|| (r.addr, holder.clone()))
            })
            .collect();
        drain_all(&mut self.registry, targets, "CNI GC")
    }
}

/// Drains each target from its holder.
fn drain_all(registry: &mut Registry, targets: Vec<(IpAddr, Holder)>, why: &str) -> Drained {
    let mut drained = Drained::default();
    for (addr, holder) in targets {
        let result = registry.lifecycle_mut().drain(addr, Some(&holder));
        if result.is_ok() {
            drained.addresses.insert(addr);
        }
        drained.effects.extend(settled(result, why));
    }
    drained
}
