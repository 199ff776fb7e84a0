//! The API's requests, dispatched on the registry's owner loop. A read is answered by the
//! API service alone; a change is made here (the registry has one writer: this loop) and its
//! effects applied, then presented by the service. Each answer is handed back as a closure
//! that the loop calls once the journal is saved ([`answer`](api_service::answer)).

use std::{collections::BTreeSet, net::IpAddr};

use log::info;

use super::{
    api_service::{
        self,
        answer::{answer, claim_answer, durable_answer, Answer},
    },
    Tracker,
};
use crate::api::{command::Command, model::DrainAttachmentRequest};

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
                let _ = reply.send(self.sinks.observer.feed().subscribe());
                return Box::new(|_| {});
            }
            Command::HoldRelease { release, reply } => {
                // Answered by the store's thread once the release is durable.
                self.ipam
                    .hold_release(*release, reply, &self.api(), &self.metrics);
                return Box::new(|_| {});
            }
            Command::DatapathPut {
                addr,
                request,
                reply,
            } => {
                let written = api_service::datapath_entry(&request).and_then(|entry| {
                    let put = self.sinks.datapath_put(addr, entry).map(|()| Some(entry));
                    api_service::datapath_view(addr, put)
                });
                return answer(reply, written);
            }
            Command::DatapathDelete { addr, reply } => {
                let removed = self.sinks.datapath_delete(addr);
                return answer(reply, api_service::datapath_view(addr, removed));
            }
            Command::IpamExhausted { request, reply } => {
                self.ipam.exhausted(
                    request,
                    reply,
                    self.core.config.ipam_on_exhausted,
                    &self.core.registry,
                    (&self.metrics, &mut self.sinks.observer),
                );
                return Box::new(|_| {});
            }
            Command::Claim { request, reply } => {
                let result = self.claim(&request);
                let waits = self.sinks.hygiene.end_claim();
                claim_answer(reply, result, waits)
            }
            Command::Drain { addr, reply } => {
                let drained = self
                    .core
                    .registry
                    .lifecycle_mut()
                    .drain(addr, None)
                    .map(|effects| {
                        self.sinks.apply(&mut self.core, effects);
                        self.api().changed([addr])
                    });
                durable_answer(reply, drained.map_err(|e| api_service::refusal(&e)))
            }
            Command::DrainAttachment { request, reply } => {
                let drained = self.drain_attachment(&request);
                durable_answer(reply, Ok(self.api().changed(drained)))
            }
            Command::Release { addr, force, reply } => {
                let released =
                    self.core
                        .registry
                        .lifecycle_mut()
                        .release(addr, force)
                        .map(|effects| {
                            self.sinks.apply(&mut self.core, effects);
                            info!("{addr}: released through the API (force: {force})");
                            self.api().changed([addr])
                        });
                durable_answer(reply, released.map_err(|e| api_service::refusal(&e)))
            }
            Command::Gc { request, reply } => {
                let drained = self.core.gc(&request);
                self.sinks.apply(&mut self.core, drained.effects);
                durable_answer(reply, Ok(self.api().changed(drained.addresses)))
            }
        };
        self.sinks
            .observe_gauges(&self.core.registry, &self.metrics);
        answer
    }

    /// CNI DEL: the attachment's holder is terminating; the addresses drained. Also used to
    /// replay spooled DELs.
    pub fn drain_attachment(&mut self, request: &DrainAttachmentRequest) -> BTreeSet<IpAddr> {
        let drained = self.core.drain_attachment(request);
        self.sinks.apply(&mut self.core, drained.effects);
        drained.addresses
    }
}
