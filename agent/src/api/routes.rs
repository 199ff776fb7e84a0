//! `/v1` routing: from an HTTP request to a [`Command`] for the tracker, and from its answer to
//! an HTTP response. Every input is checked here, before anything reaches the registry, and
//! every error names the input it is about.

use std::{convert::Infallible, os::fd::RawFd, sync::Arc, time::Duration};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{
    body::{Frame, Incoming},
    header, Method, Request, Response, StatusCode,
};
use ipq_api::echo::Echo;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::{
    command::{Command, Reply, Subscription, RECENT_CONFLICTS},
    model::{ErrorCode, ErrorResponse, Event, EventBody, ReleaseRequest, Role, API_PREFIX},
    peer::Peer,
    views::{ApiError, TimeBase},
};
use crate::{
    ipam::records::Records,
    listen,
    metrics::{LostAt, Metrics},
    netdev,
};

mod hangup;
mod input;
mod ipam;

use input::{claimable, decode, invalid, parse_ip, parse_state, read_body, read_body_up_to, Query};
use ipam::record_allocation;

pub type Body = BoxBody<Bytes, Infallible>;

/// Largest request body accepted: a claim of a few addresses is a few hundred bytes.
const MAX_BODY: usize = 64 * 1024;

/// Largest CNI GC body: the runtime lists every attachment on the node in it, about 130 bytes
/// each with 64-character container IDs, so a node at `capacity` (65 536) needs ~8.5 MB.
const MAX_GC_BODY: usize = 16 * 1024 * 1024;

/// How long a request body may take to arrive once its head has: as long as the head may.
const BODY_TIMEOUT: Duration = listen::HEADER_TIMEOUT;

/// What every request handler needs.
#[derive(Clone)]
pub struct Context {
    pub commands: mpsc::Sender<Command>,
    pub metrics: Arc<Metrics>,
    /// The CNI bin directories a held release's delegate may come from (`ipam_cni_bin_dirs`).
    pub ipam_bins: Arc<crate::ipam::trust::TrustedBins>,
    /// ipq-ipam's allocation records: a table of their own, written here, off the owner loop
    /// (each is a file written and flushed, which the registry has no part in).
    pub ipam_records: Records,
}

/// Refuses what `peer` may not ask for: changes need the admin role, and what makes the agent
/// run a delegate plugin as root (ipq-ipam runs as root, as every CNI plugin) the root role.
fn require(peer: Peer, role: Role, what: &str) -> Result<(), ApiError> {
    peer.needs(role, what)
        .map_err(|message| ApiError::forbidden(role, message))
}

/// What a request needs: the IPAM routes make the agent run a delegate's DEL as root (an
/// exhausted range may release a held allocation at once), so they are root's; every other
/// route but a GET changes something, the admin role's; reading is everyone's on the socket.
fn role_needed(method: &Method, segments: &[&str]) -> Role {
    if segments.first() == Some(&"ipam") {
        Role::Root
    } else if *method == Method::GET {
        Role::Read
    } else {
        Role::Admin
    }
}

/// Answers one request on the connection whose descriptor is `connection` (an event follower
/// ends when its peer hangs up).
pub async fn handle(
    request: Request<Incoming>,
    ctx: Context,
    peer: Peer,
    connection: RawFd,
) -> Response<Body> {
    match route(request, &ctx, peer, connection).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

async fn route(
    request: Request<Incoming>,
    ctx: &Context,
    peer: Peer,
    connection: RawFd,
) -> Result<Response<Body>, ApiError> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = Query::parse(request.uri().query().unwrap_or(""))?;
    if let Some(probe) = probe(&method, &path, ctx) {
        return probe;
    }
    let Some(rest) = path.strip_prefix(API_PREFIX) else {
        return Err(not_found(&path));
    };
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    let what = format!("{method} {}", Echo(&path));
    require(peer, role_needed(&method, &segments), &what)?;
    match segments.as_slice() {
        ["status"] => {
            only(&method, Method::GET, &path)?;
            query.allow(&[])?;
            json(ask(ctx, Command::Status).await?)
        }
        ["addresses"] => {
            only(&method, Method::GET, &path)?;
            query.allow(&["state"])?;
            let state = query.get("state").map(parse_state).transpose()?;
            json(ask(ctx, |reply| Command::List { state, reply }).await?)
        }
        ["addresses", ip] => {
            only(&method, Method::GET, &path)?;
            query.allow(&[])?;
            let addr = parse_ip(ip)?;
            json(ask(ctx, |reply| Command::Get { addr, reply }).await?)
        }
        ["addresses", ip, "drain"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let addr = parse_ip(ip)?;
            json(ask(ctx, |reply| Command::Drain { addr, reply }).await?)
        }
        ["addresses", ip, "release"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let addr = parse_ip(ip)?;
            let body = read_body(request, &what).await?;
            let ReleaseRequest { force } = if body.iter().all(u8::is_ascii_whitespace) {
                ReleaseRequest::default()
            } else {
                decode(&body, &what)?
            };
            json(ask(ctx, |reply| Command::Release { addr, force, reply }).await?)
        }
        ["claims"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let request: super::model::ClaimRequest =
                decode(&read_body(request, &what).await?, &what)?;
            claimable(&request.addresses)?;
            let (reply, answer) = oneshot::channel();
            ctx.commands
                .send(Command::Claim { request, reply })
                .await
                .map_err(|_| stopping())?;
            json(answer.await.map_err(|_| stopping())?.await?)
        }
        ["drains"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let request: super::model::DrainAttachmentRequest =
                decode(&read_body(request, &what).await?, &what)?;
            if request.container_id.is_empty() {
                return Err(invalid("container_id: empty; name the container to drain"));
            }
            json(ask(ctx, |reply| Command::DrainAttachment { request, reply }).await?)
        }
        ["ipam", "releases"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let release: ipq_api::model::HeldRelease =
                decode(&read_body(request, &what).await?, &what)?;
            release.validate().map_err(|e| invalid(e.to_string()))?;
            // Refused here rather than failing at every retry of its DEL: the agent would run
            // this delegate as root.
            ctx.ipam_bins
                .check(&release)
                .map_err(|e| invalid(e.to_string()))?;
            let release = Box::new(release);
            json(ask(ctx, |reply| Command::HoldRelease { release, reply }).await?)
        }
        ["ipam", "allocations"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let record: ipq_api::model::AllocationRecord =
                decode(&read_body(request, &what).await?, &what)?;
            record.validate().map_err(|e| invalid(e.to_string()))?;
            ctx.ipam_bins
                .check(&record.release_at(0))
                .map_err(|e| invalid(e.to_string()))?;
            json(record_allocation(ctx, record).await?)
        }
        ["ipam", "exhausted"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let request: super::model::ExhaustedRequest =
                decode(&read_body(request, &what).await?, &what)?;
            json(ask(ctx, |reply| Command::IpamExhausted { request, reply }).await?)
        }
        ["datapath", ip] => {
            query.allow(&[])?;
            let addr = parse_ip(ip)?;
            if method == Method::DELETE {
                return json(ask(ctx, |reply| Command::DatapathDelete { addr, reply }).await?);
            }
            only(&method, Method::PUT, &path)?;
            let request: super::model::DatapathEntryRequest =
                decode(&read_body(request, &what).await?, &what)?;
            json(
                ask(ctx, |reply| Command::DatapathPut {
                    addr,
                    request,
                    reply,
                })
                .await?,
            )
        }
        ["gc"] => {
            only(&method, Method::POST, &path)?;
            query.allow(&[])?;
            let body = read_body_up_to(request, &what, MAX_GC_BODY).await?;
            let request = decode(&body, &what)?;
            json(ask(ctx, |reply| Command::Gc { request, reply }).await?)
        }
        ["conflicts"] => {
            only(&method, Method::GET, &path)?;
            query.allow(&["limit"])?;
            let limit = match query.get("limit") {
                None => RECENT_CONFLICTS,
                Some(raw) => raw
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        invalid(format!(
                            "limit `{}`: must be a whole number from 1",
                            Echo(raw)
                        ))
                    })?,
            };
            json(ask(ctx, |reply| Command::Conflicts { limit, reply }).await?)
        }
        ["events"] => {
            only(&method, Method::GET, &path)?;
            query.allow(&["follow"])?;
            let follow = match query.get("follow") {
                None | Some("false") => false,
                Some("true") => true,
                Some(other) => {
                    return Err(invalid(format!(
                        "follow `{}`: must be true or false",
                        Echo(other)
                    )))
                }
            };
            events(ctx, follow, connection).await
        }
        _ => Err(not_found(&path)),
    }
}

/// Sends a command to the tracker and waits for its answer.
async fn ask<T>(ctx: &Context, command: impl FnOnce(Reply<T>) -> Command) -> Result<T, ApiError> {
    let (reply, answer) = oneshot::channel();
    ctx.commands
        .send(command(reply))
        .await
        .map_err(|_| stopping())?;
    answer.await.map_err(|_| stopping())?
}

fn stopping() -> ApiError {
    ApiError::new(
        ErrorCode::NotReady,
        "the agent is stopping; try again shortly",
    )
}

/// `GET /healthz` and `GET /readyz` on the API socket, as on the metrics port: the kubelet's
/// exec probe (`ipq-agent probe`) asks here, where root has connections of its own that no
/// other user can take (the metrics port is open to every local user and the node's network).
fn probe(method: &Method, path: &str, ctx: &Context) -> Option<Result<Response<Body>, ApiError>> {
    let answer = match path {
        "/healthz" => Ok("ok\n".to_owned()),
        "/readyz" => ctx
            .metrics
            .readiness
            .check()
            .map(|()| "ready\n".to_owned())
            .map_err(|why| format!("not ready: {why}\n")),
        _ => return None,
    };
    if let Err(e) = only(method, Method::GET, path) {
        return Some(Err(e));
    }
    let (status, text) = match answer {
        Ok(text) => (StatusCode::OK, text),
        Err(text) => (StatusCode::SERVICE_UNAVAILABLE, text),
    };
    Some(Ok(Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(full(text))
        .expect("a static response is valid")))
}

async fn events(
    ctx: &Context,
    follow: bool,
    connection: RawFd,
) -> Result<Response<Body>, ApiError> {
    let (reply, answer) = oneshot::channel();
    ctx.commands
        .send(Command::Subscribe(reply))
        .await
        .map_err(|_| stopping())?;
    let Subscription {
        backlog,
        live,
        open,
    } = answer.await.map_err(|_| stopping())?;
    let backlog = futures::stream::iter(backlog.into_iter().map(|e| ndjson_line(&e)));
    let body: Body = if follow {
        let metrics = ctx.metrics.clone();
        // Ends the stream once the peer hangs up, with or without an event to write: a
        // follower that is gone gives its slot back at once.
        let hangup = Arc::new(
            hangup::Hangup::watch(connection)
                .map_err(|e| ApiError::new(ErrorCode::Internal, format!("following: {e}")))?,
        );
        // `open` lives as long as the stream: the agent's stop waits for it to end.
        let live = futures::stream::unfold((live, open), move |(mut live, open)| {
            let metrics = metrics.clone();
            let hangup = hangup.clone();
            async move {
                let next = tokio::select! {
                    next = live.recv() => next,
                    () = hangup.wait() => return None,
                };
                match next {
                    Ok(event) => Some((ndjson_line(&event), (live, open))),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        metrics.events_lost(LostAt::Api, n);
                        let lost = Event {
                            seq: 0,
                            at: TimeBase::now().rfc3339(netdev::monotonic_ns()),
                            body: EventBody::Lost { n },
                        };
                        Some((ndjson_line(&lost), (live, open)))
                    }
                    Err(broadcast::error::RecvError::Closed) => None,
                }
            }
        });
        let frames = backlog
            .chain(live)
            .map(|line| Ok::<_, Infallible>(Frame::data(line)));
        BodyExt::boxed(StreamBody::new(frames))
    } else {
        let lines: Vec<Bytes> = backlog.collect().await;
        full(lines.concat())
    };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(body)
        .expect("a static response is valid"))
}

fn ndjson_line(event: &Event) -> Bytes {
    let mut line = serde_json::to_vec(event).expect("events serialize");
    line.push(b'\n');
    Bytes::from(line)
}

fn only(method: &Method, allowed: Method, path: &str) -> Result<(), ApiError> {
    if *method == allowed {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{method} {}: only {allowed} is allowed here", Echo(path)),
        ))
    }
}

fn not_found(path: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "{}: no such path (the API lives under {API_PREFIX}; see `ipq --help`)",
            Echo(path)
        ),
    )
}

fn full(bytes: impl Into<Bytes>) -> Body {
    BodyExt::boxed(Full::new(bytes.into()))
}

fn json<T: Serialize>(value: T) -> Result<Response<Body>, ApiError> {
    let body = serde_json::to_vec(&value)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("encoding the answer: {e}")))?;
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .expect("a static response is valid"))
}

pub fn error_response(error: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(error.code().http_status())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(&ErrorResponse {
        error: (*error.0).clone(),
    })
    .unwrap_or_default();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body))
        .expect("a static response is valid")
}

#[cfg(test)]
mod tests;
