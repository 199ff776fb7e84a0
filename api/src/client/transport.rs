//! How a call travels to the agent: one HTTP/1.1 connection over its unix socket per call, a
//! JSON body each way, the whole call bounded by the timeout, and an error status read as the
//! API's error answer.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde::{de::DeserializeOwned, Serialize};
use tokio::net::UnixStream;

use super::ClientError;
use crate::model::{ErrorResponse, API_PREFIX};

/// The agent's socket and how long a call may take.
#[derive(Clone, Debug)]
pub(super) struct Transport {
    socket: PathBuf,
    timeout: Duration,
}

impl Transport {
    pub(super) fn new(socket: PathBuf, timeout: Duration) -> Self {
        Self { socket, timeout }
    }

    pub(super) fn socket(&self) -> &Path {
        &self.socket
    }

    /// A stream of JSON lines at `path` (GET): each handed to `on_item` until it returns false
    /// or the agent closes the stream. Only the connection and the answer's head are bounded
    /// by the timeout.
    pub(super) async fn stream<T: DeserializeOwned>(
        &self,
        path: &str,
        mut on_item: impl FnMut(T) -> bool,
    ) -> Result<(), ClientError> {
        let response = tokio::time::timeout(self.timeout, self.send(Method::GET, path, None))
            .await
            .map_err(|_| self.timed_out())??;
        let response = self.check(path, response).await?;
        let mut body = response.into_body();
        let mut pending = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| self.protocol(path, e))?;
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
                let item: T = serde_json::from_slice(line).map_err(|e| self.protocol(path, e))?;
                if !on_item(item) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    pub(super) async fn call<B: Serialize, T: DeserializeOwned>(
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
            let bytes = self.body(path, response).await?;
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

    /// The whole body of `response`, an answer to `path`.
    async fn body(&self, path: &str, response: Response<Incoming>) -> Result<Bytes, ClientError> {
        Ok(response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.protocol(path, e))?
            .to_bytes())
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
        let bytes = self.body(path, response).await?;
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
