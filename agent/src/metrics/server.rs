//! The agent's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use http_body_util::Full;
use hyper::{body::Bytes, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use log::debug;
use tokio::net::TcpListener;

use super::{Metrics, MetricsError};
use crate::listen::{self, Guard, WriteDeadline};

/// The text exposition format, version 0.0.4.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

async fn handle(
    metrics: Arc<Metrics>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => respond(StatusCode::OK, TEXT_FORMAT, metrics.render()),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match metrics.readiness.check() {
            Ok(()) => respond(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        _ => respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics, /healthz or /readyz\n".into(),
        ),
    }
}

/// Binds `addr` now (so a bad address fails the start) and serves until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
) -> Result<impl std::future::Future<Output = ()>, MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    Ok(async move {
        let mut guard = Guard::with_peer_limit(
            "metrics",
            listen::METRICS_MAX_CONNECTIONS,
            listen::METRICS_MAX_PER_PEER,
        )
        .counting_refusals(metrics.connections_refused.clone());
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    guard.accept_failed(&e).await;
                    continue;
                }
            };
            let Some(slot) = guard.admit_from(peer.ip()) else {
                drop(stream);
                continue;
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let metrics = metrics.clone();
                    async move { Ok::<_, Infallible>(handle(metrics, req).await) }
                });
                let stream = WriteDeadline::new(stream, listen::WRITE_STALL_TIMEOUT);
                if let Err(e) = listen::http1()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!("metrics: connection from {peer}: {e}");
                }
                drop(slot);
            });
        }
    })
}
