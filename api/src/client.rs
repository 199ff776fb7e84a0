//! The API's client, shared by the `ipq` CLI and `ipq-cni`: HTTP/1.1 over the agent's unix
//! socket, one connection per call (a CNI plugin makes one or two calls and exits).
//! [`Client`] knows the routes (a method each: its path, method and types); `transport` knows
//! how a call travels (the connection, JSON bodies, the timeout, error answers, the NDJSON of
//! a stream).

mod transport;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use hyper::Method;
use thiserror::Error;

use self::transport::Transport;
use super::model::{
    AddressList, AddressView, ApiErrorBody, ChangedResponse, ClaimRequest, ClaimResponse,
    ConflictList, DrainAttachmentRequest, Event, GcRequest, ReleaseRequest, Status,
};
use crate::StateName;

#[derive(Debug, Error)]
pub enum ClientError {
    /// No agent answers on the socket (not running, not allowed to connect, or too slow).
    #[error("agent unavailable on {}: {reason}", socket.display())]
    Unavailable { socket: PathBuf, reason: String },
    /// The agent answered with an error.
    #[error("{}", error.message)]
    Api {
        status: u16,
        error: Box<ApiErrorBody>,
    },
    /// The agent answered something this client does not understand.
    #[error("unexpected answer from the agent to {what}: {reason}")]
    Protocol { what: String, reason: String },
}

impl ClientError {
    /// The API error code, when the agent answered with one.
    pub fn code(&self) -> Option<super::model::ErrorCode> {
        match self {
            Self::Api { error, .. } => Some(error.code),
            _ => None,
        }
    }
}

/// A client of one agent socket: one method per route, over its transport.
#[derive(Clone, Debug)]
pub struct Client {
    transport: Transport,
}

impl Client {
    /// A client of `socket` whose calls give up after `timeout` (connect, request and answer;
    /// an event stream's wait for the next event is not bounded).
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            transport: Transport::new(socket.into(), timeout),
        }
    }

    pub fn socket(&self) -> &Path {
        self.transport.socket()
    }

    pub async fn status(&self) -> Result<Status, ClientError> {
        self.transport
            .call(Method::GET, "/status", None::<&()>)
            .await
    }

    pub async fn list(&self, state: Option<StateName>) -> Result<AddressList, ClientError> {
        let path = match state {
            Some(state) => format!("/addresses?state={state}"),
            None => "/addresses".to_owned(),
        };
        self.transport.call(Method::GET, &path, None::<&()>).await
    }

    pub async fn get(&self, addr: IpAddr) -> Result<AddressView, ClientError> {
        self.transport
            .call(Method::GET, &format!("/addresses/{addr}"), None::<&()>)
            .await
    }

    pub async fn claim(&self, request: &ClaimRequest) -> Result<ClaimResponse, ClientError> {
        self.transport
            .call(Method::POST, "/claims", Some(request))
            .await
    }

    /// Drains one address, whoever holds it (`ipq drain`).
    pub async fn drain(&self, addr: IpAddr) -> Result<ChangedResponse, ClientError> {
        self.transport
            .call(
                Method::POST,
                &format!("/addresses/{addr}/drain"),
                None::<&()>,
            )
            .await
    }

    /// Drains what a CNI attachment holds (CNI DEL); idempotent.
    pub async fn drain_attachment(
        &self,
        request: &DrainAttachmentRequest,
    ) -> Result<ChangedResponse, ClientError> {
        self.transport
            .call(Method::POST, "/drains", Some(request))
            .await
    }

    /// ipq-ipam's DEL: the agent stores `release` durably and answers it as stored.
    pub async fn hold_release(
        &self,
        release: &crate::model::HeldRelease,
    ) -> Result<crate::model::HeldRelease, ClientError> {
        self.transport
            .call(Method::POST, "/ipam/releases", Some(release))
            .await
    }

    /// ipq-ipam's ADD: the agent records what a later release of the allocation will run.
    pub async fn record_allocation(
        &self,
        record: &crate::model::AllocationRecord,
    ) -> Result<crate::model::AllocationRecord, ClientError> {
        self.transport
            .call(Method::POST, "/ipam/allocations", Some(record))
            .await
    }

    /// ipq-ipam's delegate found `request.network`'s range exhausted: what the agent did.
    pub async fn ipam_exhausted(
        &self,
        request: &super::model::ExhaustedRequest,
    ) -> Result<super::model::ExhaustedAnswer, ClientError> {
        self.transport
            .call(Method::POST, "/ipam/exhausted", Some(request))
            .await
    }

    pub async fn release(&self, addr: IpAddr, force: bool) -> Result<ChangedResponse, ClientError> {
        let body = ReleaseRequest { force };
        self.transport
            .call(
                Method::POST,
                &format!("/addresses/{addr}/release"),
                Some(&body),
            )
            .await
    }

    pub async fn gc(&self, request: &GcRequest) -> Result<ChangedResponse, ClientError> {
        self.transport
            .call(Method::POST, "/gc", Some(request))
            .await
    }

    pub async fn conflicts(&self, limit: Option<usize>) -> Result<ConflictList, ClientError> {
        let path = match limit {
            Some(n) => format!("/conflicts?limit={n}"),
            None => "/conflicts".to_owned(),
        };
        self.transport.call(Method::GET, &path, None::<&()>).await
    }

    /// Reads the event feed: the recent backlog, then (with `follow`) live events until
    /// `on_event` returns false or the agent closes the stream.
    pub async fn events(
        &self,
        follow: bool,
        on_event: impl FnMut(Event) -> bool,
    ) -> Result<(), ClientError> {
        self.transport
            .stream(&format!("/events?follow={follow}"), on_event)
            .await
    }
}
