//! The API's client, shared by the `ipq` CLI and `ipq-cni`: HTTP/1.1 over the agent's unix
//! socket, one connection per call (a CNI plugin makes one or two calls and exits).

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde::{de::DeserializeOwned, Serialize};
use thiserror::Error;
use tokio::net::UnixStream;

use super::model::{
    AddressList, AddressView, ApiErrorBody, ChangedResponse, ClaimRequest, ClaimResponse,
    ConflictList, DrainAttachmentRequest, ErrorResponse, Event, GcRequest, ReleaseRequest, Status,
    API_PREFIX,
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

/// A client of one agent socket.
#[derive(Clone, Debug)]
pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// A client of `socket` whose calls give up after `timeout` (connect, request and answer;
    /// an event stream's wait for the next event is not bounded).
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub async fn status(&self) -> Result<Status, ClientError> {
        self.call(Method::GET, "/status", None::<&()>).await
    }

    pub async fn list(&self, state: Option<StateName>) -> Result<AddressList, ClientError> {
        let path = match state {
            Some(state) => format!("/addresses?state={state}"),
            None => "/addresses".to_owned(),
        };
        self.call(Method::GET, &path, None::<&()>).await
    }

    pub async fn get(&self, addr: IpAddr) -> Result<AddressView, ClientError> {
        self.call(Method::GET, &format!("/addresses/{addr}"), None::<&()>)
            .await
    }

    pub async fn claim(&self, request: &ClaimRequest) -> Result<ClaimResponse, ClientError> {
        self.call(Method::POST, "/claims", Some(request)).await
    }

    /// Drains one address, whoever holds it (`ipq drain`).
    pub async fn drain(&self, addr: IpAddr) -> Result<ChangedResponse, ClientError> {
        self.call(
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
        self.call(Method::POST, "/drains", Some(request)).await
    }

    /// ipq-ipam's DEL: the agent stores `release` durably and answers it as stored.
    pub async fn hold_release(
        &self,
        release: &crate::model::HeldRelease,
    ) -> Result<crate::model::HeldRelease, ClientError> {
        self.call(Method::POST, "/ipam/releases", Some(release))
            .await
    }

    /// ipq-ipam's ADD: the agent records what a later release of the allocation will run.
    pub async fn record_allocation(
        &self,
        record: &crate::model::AllocationRecord,
    ) -> Result<crate::model::AllocationRecord, ClientError> {
        self.call(Method::POST, "/ipam/allocations", Some(record))
            .await
    }

    /// ipq-ipam's delegate found `request.network`'s range exhausted: what the agent did.
    pub async fn ipam_exhausted(
        &self,
        request: &super::model::ExhaustedRequest,
    ) -> Result<super::model::ExhaustedAnswer, ClientError> {
        self.call(Method::POST, "/ipam/exhausted", Some(request))
            .await
    }

    pub async fn release(&self, addr: IpAddr, force: bool) -> Result<ChangedResponse, ClientError> {
        let body = ReleaseRequest { force };
        self.call(
            Method::POST,
            &format!("/addresses/{addr}/release"),
            Some(&body),
        )
        .await
    }

    pub async fn gc(&self, request: &GcRequest) -> Result<ChangedResponse, ClientError> {
        self.call(Method::POST, "/gc", Some(request)).await
    }

    pub async fn conflicts(&self, limit: Option<usize>) -> Result<ConflictList, ClientError> {
        let path = match limit {
            Some(n) => format!("/conflicts?limit={n}"),
            None => "/conflicts".to_owned(),
        };
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// Reads the event feed: the recent backlog, then (with `follow`) live events until
    /// `on_event` returns false or the agent closes the stream.
    pub async fn events(
        &self,
        follow: bool,
        mut on_event: impl FnMut(Event) -> bool,
    ) -> Result<(), ClientError> {
        let path = format!("/events?follow={follow}");
        let response = tokio::time::timeout(self.timeout, self.send(Method::GET, &path, None))
            .await
            .map_err(|_| self.timed_out())??;
        let response = self.check(&path, response).await?;
        let mut body = response.into_body();
        let mut pending = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.protocol(&path, e))?;
            let Some(data) = frame.data_ref() else {
                continue;
            };
            pending.extend_from_slice(data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = &line[..line.len() - 1];
                if line.is_empty() {
                    continue;
                }
                let event: Event =
                    serde_json::from_slice(line).map_err(|e| self.protocol(&path, e))?;
                if !on_event(event) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let body = body
            .map(serde_json::to_vec)
            .transpose()
            .map_err(|e| self.protocol(path, e))?;
        let work = async {
            let response = self.send(method, path, body).await?;
            let response = self.check(path, response).await?;
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| self.protocol(path, e))?
                .to_bytes();
            serde_json::from_slice(&bytes).map_err(|e| self.protocol(path, e))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| self.timed_out())?
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, ClientError> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(|e| self.unavailable(e.to_string()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unavailable(e.to_string()))?;
        tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{API_PREFIX}{path}"))
            .header("host", "ipq");
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.protocol(path, e))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| self.unavailable(e.to_string()))
    }

    /// Turns an error status into [`ClientError::Api`].
    async fn check(
        &self,
        path: &str,
        response: Response<Incoming>,
    ) -> Result<Response<Incoming>, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.protocol(path, e))?
            .to_bytes();
        match serde_json::from_slice::<ErrorResponse>(&bytes) {
            Ok(body) => Err(ClientError::Api {
                status: status.as_u16(),
                error: Box::new(body.error),
            }),
            Err(_) => Err(self.protocol(
                path,
                format!(
                    "status {} {}",
                    status.as_u16(),
                    status.canonical_reason().unwrap_or("")
                ),
            )),
        }
    }

    fn unavailable(&self, reason: String) -> ClientError {
        ClientError::Unavailable {
            socket: self.socket.clone(),
            reason,
        }
    }

    fn timed_out(&self) -> ClientError {
        self.unavailable(format!("no answer within {:?}", self.timeout))
    }

    fn protocol(&self, path: &str, reason: impl ToString) -> ClientError {
        ClientError::Protocol {
            what: format!("{API_PREFIX}{path}"),
            reason: reason.to_string(),
        }
    }
}
