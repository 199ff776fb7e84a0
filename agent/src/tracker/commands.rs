//! The API's requests, dispatched on the registry's owner loop. A read is answered by the
//! API service alone; a change is made here (the registry has one writer: this loop) and its
//! effects applied, then presented by the service. Each answer is handed back as a closure
//! that the loop calls once the journal is saved ([`answer`](api_service::answer)).

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use log::info;

use super::{
    api_service::{
        self,
        answer::{answer, claim_answer, durable_answer, Answer},
    },
    Tracker,
};
use crate::{
    api::{
        command::Command,
        model::{DrainAttachmentRequest, GcRequest},
    },
    registry::{Holder, RegistryError, StateName},
};

impl Tracker {
    /// Carries out one API request; the returned answer is to be sent after [`persist`].
    ///
    /// [`persist`]: Tracker::persist
    pub fn handle(&mut self, command: Command) -> Answer {
        let answer = match command {
            // Reads change nothing: no gauges to update.
            Command::Status(reply) => return answer(reply, Ok(self.api().status())),
            Command::List { state, reply } => return answer(reply, Ok(self.api().list(state))),
            Command::Get { addr, reply } => return answer(reply, self.api().get(addr)),
            Command::Conflicts { limit, reply } => {
                return answer(reply, Ok(self.api().conflicts(limit)))
            }
            Command::AllocationBusy { query, reply } => {
                return answer(reply, Ok(self.api().allocation_busy(&query)))
            }
            Command::Subscribe(reply) => {
                let _ = reply.send(self.observer.feed().subscribe());
                return Box::new(|_| {});
            }
            Command::HoldRelease { release, reply } => {
                return answer(
                    reply,
                    self.ipam.hold_release(*release, &self.api(), &self.metrics),
                )
            }
            Command::DatapathPut {
                addr,
                request,
                reply,
            } => {
                let written = api_service::datapath_entry(&request).and_then(|entry| {
                    let put = self.datapath_put(addr, entry).map(|()| Some(entry));
                    api_service::datapath_view(addr, put)
                });
                return answer(reply, written);
            }
            Command::DatapathDelete { addr, reply } => {
                let removed = self.datapath_delete(addr);
                return answer(reply, api_service::datapath_view(addr, removed));
            }
            Command::IpamExhausted { request, reply } => {
                self.ipam_exhausted(request, reply);
                return Box::new(|_| {});
            }
            Command::Claim { request, reply } => {
                let result = self.claim(&request);
                let waits = self.hygiene.end_claim();
                claim_answer(reply, result, waits)
            }
            Command::Drain { addr, reply } => {
                let drained = self.drain(addr).map(|()| self.api().changed([addr]));
                durable_answer(reply, drained.map_err(|e| api_service::refusal(&e)))
            }
            Command::DrainAttachment { request, reply } => {
                let drained = self.drain_attachment(&request);
                durable_answer(reply, Ok(self.api().changed(drained)))
            }
            Command::Release { addr, force, reply } => {
                let released = self
                    .release(addr, force)
                    .map(|()| self.api().changed([addr]));
                durable_answer(reply, released.map_err(|e| api_service::refusal(&e)))
            }
            Command::Gc { request, reply } => {
                let drained = self.gc(&request);
                durable_answer(reply, Ok(self.api().changed(drained)))
            }
        };
        self.update_gauges();
        answer
    }

    fn drain(&mut self, addr: IpAddr) -> Result<(), RegistryError> {
        let effects = self.core.registry.drain(addr, None)?;
        self.apply_effects(effects);
        Ok(())
    }

    fn release(&mut self, addr: IpAddr, force: bool) -> Result<(), RegistryError> {
        let effects = self.core.registry.release(addr, force)?;
        self.apply_effects(effects);
        info!("{addr}: released through the API (force: {force})");
        Ok(())
    }

    /// CNI DEL: the attachment's holder is terminating; the addresses drained. Also used to
    /// replay spooled DELs.
    pub fn drain_attachment(&mut self, request: &DrainAttachmentRequest) -> BTreeSet<IpAddr> {
        let of_attachment = |h: &Holder| {
            h.container_id() == Some(request.container_id.as_str())
                && match (request.cni_ifname.as_deref(), h.cni_ifname()) {
                    (Some(asked), Some(known)) => asked == known,
                    _ => true,
                }
        };
        let targets: Vec<(IpAddr, Holder)> = self
            .core
            .registry
            .held_by_container(&request.container_id)
            .filter_map(|r| {
                let holder = r.status.holder()?;
                of_attachment(holder).then(|| (r.addr, holder.clone()))
            })
            .collect();
        self.drain_all(targets, "CNI DEL")
    }

    /// CNI GC: every CNI-made holder whose attachment the runtime no longer lists drains.
    /// O(n + m) for n records and m attachments: the runtime's list is hashed once, not
    /// searched per record. (A GC compares the whole registry with the runtime's whole list,
    /// so it cannot be less than O(n); runtimes send one at start and then rarely.)
    fn gc(&mut self, request: &GcRequest) -> BTreeSet<IpAddr> {
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
            .core
            .registry
            .iter()
            .filter(|r| r.state() == StateName::Active)
            .filter_map(|r| {
                let holder = r.status.holder()?;
                (!valid(holder)).then(|| (r.addr, holder.clone()))
            })
            .collect();
        self.drain_all(targets, "CNI GC")
    }

    /// Drains each target from its holder: the addresses drained.
    fn drain_all(&mut self, targets: Vec<(IpAddr, Holder)>, why: &str) -> BTreeSet<IpAddr> {
        let mut drained = BTreeSet::new();
        for (addr, holder) in targets {
            let result = self.core.registry.drain(addr, Some(&holder));
            if result.is_ok() {
                drained.insert(addr);
            }
            self.apply(result, why);
        }
        drained
    }
}
