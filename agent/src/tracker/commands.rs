//! The API's requests, answered by the registry's owner. Each answer is handed back as a
//! closure: the loop saves the journal once per burst of requests, then sends the answers with
//! how the save went, so a success is only ever reported for a change that is on disk. When
//! the save failed, a request that succeeded is answered `unavailable` (503) with the reason;
//! a read, or a request that failed anyway, is answered as it is.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::IpAddr,
};

use log::info;

use super::Tracker;
use crate::{
    api::{
        command::{Command, Reply},
        model::{
            AddressList, AddressView, ChangedResponse, ClaimFlushView, ConflictList,
            DrainAttachmentRequest, ErrorCode, GcRequest, InterfaceStatus, Status,
            VerificationView,
        },
        views::{address_view, status_view, ApiError, StatusFacts, TimeBase},
    },
    registry::{Holder, StateName},
};

/// An answer waiting for the journal to be saved; called with how the save went (`Err` names
/// why it failed).
pub type Answer = Box<dyn FnOnce(Result<(), &str>) + Send>;

/// The answer to a request that changed nothing: sent whatever the journal did.
fn answer<T: Send + 'static>(reply: Reply<T>, result: Result<T, ApiError>) -> Answer {
    Box::new(move |_saved| {
        // The caller may have hung up; its request was still carried out.
        let _ = reply.send(result);
    })
}

/// The answer to a request that may have changed the registry: a success is only sent once
/// the journal holds it; otherwise `unavailable`, naming why.
fn durable_answer<T: Send + 'static>(reply: Reply<T>, result: Result<T, ApiError>) -> Answer {
    Box::new(move |saved| {
        let result = match (result, saved) {
            (Ok(_), Err(reason)) => Err(ApiError::unavailable(reason)),
            (result, _) => result,
        };
        let _ = reply.send(result);
    })
}

impl Tracker {
    /// Carries out one API request; the returned answer is to be sent after [`persist`].
    ///
    /// [`persist`]: Tracker::persist
    pub fn handle(&mut self, command: Command) -> Answer {
        let answer = match command {
            // Reads change nothing: no gauges to update.
            Command::Status(reply) => return answer(reply, Ok(self.status())),
            Command::List { state, reply } => return answer(reply, Ok(self.list(state))),
            Command::Get { addr, reply } => return answer(reply, self.view(addr)),
            Command::Conflicts { limit, reply } => {
                return answer(
                    reply,
                    Ok(ConflictList {
                        conflicts: self.observer.feed().recent_conflicts(limit),
                    }),
                )
            }
            Command::HoldRelease { release, reply } => {
                return answer(reply, self.hold_release(*release))
            }
            Command::DatapathPut {
                addr,
                request,
                reply,
            } => return answer(reply, self.datapath_put(addr, &request)),
            Command::DatapathDelete { addr, reply } => {
                return answer(reply, self.datapath_delete(addr))
            }
            Command::IpamExhausted { request, reply } => {
                self.ipam_exhausted(request, reply);
                return Box::new(|_| {});
            }
            Command::AllocationBusy { query, reply } => {
                return answer(reply, Ok(self.allocation_busy(&query)))
            }
            Command::Subscribe(reply) => {
                let _ = reply.send(self.observer.feed().subscribe());
                return Box::new(|_| {});
            }
            Command::Claim { request, reply } => {
                let result = self.api_claim(request);
                let waits = self.hygiene.end_claim();
                super::hygiene::claim_answer(reply, result, waits)
            }
            Command::Drain { addr, reply } => durable_answer(reply, self.api_drain(addr)),
            Command::DrainAttachment { request, reply } => {
                durable_answer(reply, Ok(self.drain_attachment(&request)))
            }
            Command::Release { addr, force, reply } => {
                durable_answer(reply, self.api_release(addr, force))
            }
            Command::Gc { request, reply } => durable_answer(reply, Ok(self.gc(&request))),
        };
        self.update_gauges();
        answer
    }

    fn status(&self) -> Status {
        let interfaces: Vec<InterfaceStatus> = self
            .attacher
            .targets()
            .iter()
            .map(|(ifindex, target)| InterfaceStatus {
                ifindex: *ifindex,
                name: target.name.clone(),
                hooks: target
                    .attached
                    .keys()
                    .map(|p| p.as_str().to_owned())
                    .collect(),
                protection: target.protection.as_str().to_owned(),
                attachment: target.attachment(),
                error: target.last_error.clone(),
                failed_attempts: target.failures,
            })
            .collect();
        let conflicts_total = crate::registry::ConflictKind::ALL
            .iter()
            .map(|k| {
                self.metrics
                    .conflicts
                    .with_label_values(&[k.as_str()])
                    .get()
            })
            .sum();
        let facts = StatusFacts {
            ready: self.metrics.readiness.is_ready(),
            not_ready: self.metrics.readiness.check().err().map(|e| e.to_string()),
            tc_attach: self.attacher.mode().as_str(),
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
            }),
            recovery: self.recovered.clone(),
            started: self.started.clone(),
        };
        status_view(facts, &self.registry, interfaces)
    }

    pub(super) fn interface_name(&self, ifindex: u32) -> String {
        self.net
            .link_name(ifindex)
            .map(str::to_owned)
            .or_else(|| self.attacher.target(ifindex).map(|t| t.name.clone()))
            .unwrap_or_else(|| format!("if{ifindex}"))
    }

    fn list(&self, state: Option<StateName>) -> AddressList {
        let time = TimeBase::now();
        let mut addresses: Vec<AddressView> = self
            .registry
            .iter()
            .filter(|r| state.is_none_or(|s| r.state() == s))
            .map(|r| self.with_last_flush(self.view_of(r, &time), &time))
            .collect();
        if state.is_none_or(|s| s == StateName::Free) {
            addresses.extend(self.held_free_views());
        }
        AddressList { addresses }
    }

    pub(super) fn view(&self, addr: IpAddr) -> Result<AddressView, ApiError> {
        let time = TimeBase::now();
        self.registry
            .get(addr)
            .map(|r| self.with_last_flush(self.view_of(r, &time), &time))
            .or_else(|| self.held_free_view(addr))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorCode::NotFound,
                    format!("{addr}: free (not in the registry)"),
                )
                .with_address(addr)
            })
    }

    /// A record's view, with the protection of its live holder's interface.
    fn view_of(&self, record: &crate::registry::AddrRecord, time: &TimeBase) -> AddressView {
        let mut view = self.with_ipam_hold(address_view(record, time));
        if let Some(target) = record
            .status
            .holder()
            .and_then(|h| self.protection_of(h.ifindex))
        {
            view.protection = Some(target.protection.as_str().to_owned());
            view.attachment = target.attachment();
        }
        view
    }

    pub(super) fn views(&self, addrs: impl IntoIterator<Item = IpAddr>) -> Vec<AddressView> {
        let time = TimeBase::now();
        addrs
            .into_iter()
            .filter_map(|a| {
                self.registry
                    .get(a)
                    .map(|r| self.with_last_flush(self.view_of(r, &time), &time))
            })
            .collect()
    }

    fn api_drain(&mut self, addr: IpAddr) -> Result<ChangedResponse, ApiError> {
        let effects = self
            .registry
            .drain(addr, None)
            .map_err(|e| ApiError::from_registry(&e, &TimeBase::now()))?;
        self.apply_effects(effects);
        Ok(ChangedResponse {
            addresses: self.views([addr]),
        })
    }

    fn api_release(&mut self, addr: IpAddr, force: bool) -> Result<ChangedResponse, ApiError> {
        let effects = self
            .registry
            .release(addr, force)
            .map_err(|e| ApiError::from_registry(&e, &TimeBase::now()))?;
        self.apply_effects(effects);
        info!("{addr}: released through the API (force: {force})");
        Ok(ChangedResponse {
            addresses: self.views([addr]),
        })
    }

    /// CNI DEL: the attachment's holder is terminating. Also used to replay spooled DELs.
    pub fn drain_attachment(&mut self, request: &DrainAttachmentRequest) -> ChangedResponse {
        let of_attachment = |h: &Holder| {
            h.container_id() == Some(request.container_id.as_str())
                && match (request.cni_ifname.as_deref(), h.cni_ifname()) {
                    (Some(asked), Some(known)) => asked == known,
                    _ => true,
                }
        };
        let targets: Vec<(IpAddr, Holder)> = self
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
    fn gc(&mut self, request: &GcRequest) -> ChangedResponse {
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
            .iter()
            .filter(|r| r.state() == StateName::Active)
            .filter_map(|r| {
                let holder = r.status.holder()?;
                (!valid(holder)).then(|| (r.addr, holder.clone()))
            })
            .collect();
        self.drain_all(targets, "CNI GC")
    }

    fn drain_all(&mut self, targets: Vec<(IpAddr, Holder)>, why: &str) -> ChangedResponse {
        let mut drained = BTreeSet::new();
        for (addr, holder) in targets {
            let result = self.registry.drain(addr, Some(&holder));
            if result.is_ok() {
                drained.insert(addr);
            }
            self.apply(result, why);
        }
        ChangedResponse {
            addresses: self.views(drained),
        }
    }
}
