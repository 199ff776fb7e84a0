//! Prometheus metrics and the agent's HTTP endpoints: `/metrics`, `/healthz`, `/readyz`.
//!
//! Datapath counters are read from the pinned per-CPU map at scrape time, so a scrape always
//! sees the kernel's own numbers, including what was counted while the agent was down.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use ipq_common::counters::{counter_index, Action, Hook, Reason, SAMPLES_LOST_INDEX};
use log::{debug, warn};
use prometheus::{
    core::{Collector, Desc},
    proto::MetricFamily,
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use thiserror::Error;
use tokio::net::TcpListener;

use crate::datapath::{maps::Source, Counters, DatapathError};
use crate::paths::{AttachPoint, PinLayout};
use crate::registry::{Clock, ConflictKind, Registry as AddressRegistry, StateName};

#[derive(Debug, Error)]
pub enum MetricsError {
    #[error("registering metric: {0}")]
    Register(#[from] prometheus::Error),
    #[error("opening the datapath counters: {0}")]
    Datapath(#[from] DatapathError),
    #[error("listening on metrics_addr {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Builds the three packet-counter families fresh on every scrape from the kernel's counters.
struct DatapathCollector {
    counters: Mutex<Counters>,
    descs: Vec<Desc>,
    /// Events lost in user space, indexed by [`LostAt`]; the kernel's count lives in its map.
    lost: Arc<[AtomicU64; LostAt::ALL.len()]>,
}

/// Where user space loses events (`source` label of `ipq_events_lost_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostAt {
    /// A conflict log line over the log rate limit.
    Log = 0,
    /// An `/v1/events` subscriber that fell too far behind.
    Api = 1,
}

impl LostAt {
    pub const ALL: [LostAt; 2] = [Self::Log, Self::Api];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Log => "log",
            Self::Api => "api",
        }
    }
}

fn packet_families() -> Result<[(Action, IntCounterVec, IntCounterVec); 3], prometheus::Error> {
    let family = |action: Action, what: &str, help: &str| -> Result<_, prometheus::Error> {
        let packets = IntCounterVec::new(
            Opts::new(
                format!("ipq_{what}_packets_total"),
                format!("Packets {help}."),
            ),
            &["hook", "reason"],
        )?;
        let bytes = IntCounterVec::new(
            Opts::new(format!("ipq_{what}_bytes_total"), format!("Bytes {help}.")),
            &["hook", "reason"],
        )?;
        Ok((action, packets, bytes))
    };
    Ok([
        family(
            Action::Dropped,
            "dropped",
            "dropped by the datapath in enforce mode, by hook and reason",
        )?,
        family(
            Action::Observed,
            "observed",
            "that enforce mode would have dropped, passed in observe mode, by hook and reason",
        )?,
        family(
            Action::Reported,
            "reported",
            "passed and reported as evidence (remote claims), by hook and reason",
        )?,
    ])
}

fn events_lost() -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(
        Opts::new(
            "ipq_events_lost_total",
            "Conflict events lost, by where they were lost (kernel: the sample ring was full; \
             log: log lines over the rate limit; api: an event-stream subscriber too slow).",
        ),
        &["source"],
    )
}

impl DatapathCollector {
    fn new(
        counters: Counters,
        lost: Arc<[AtomicU64; LostAt::ALL.len()]>,
    ) -> Result<Self, prometheus::Error> {
        let mut descs = Vec::new();
        for (_, packets, bytes) in packet_families()? {
            descs.extend(packets.desc().into_iter().cloned());
            descs.extend(bytes.desc().into_iter().cloned());
        }
        descs.extend(events_lost()?.desc().into_iter().cloned());
        Ok(Self {
            counters: Mutex::new(counters),
            descs,
            lost,
        })
    }

    fn families(&self) -> Result<Vec<MetricFamily>, Box<dyn std::error::Error>> {
        let values = self
            .counters
            .lock()
            .map_err(|_| "counters lock poisoned")?
            .read()?;
        let mut out = Vec::new();
        for (action, packets, bytes) in packet_families()? {
            for hook in Hook::ALL {
                for reason in Reason::ALL {
                    let c = values[counter_index(action, hook, reason) as usize];
                    let labels = [hook.as_str(), reason.as_str()];
                    packets.with_label_values(&labels).inc_by(c.packets);
                    bytes.with_label_values(&labels).inc_by(c.bytes);
                }
            }
            out.extend(packets.collect());
            out.extend(bytes.collect());
        }
        let lost = events_lost()?;
        lost.with_label_values(&["kernel"])
            .inc_by(values[SAMPLES_LOST_INDEX as usize].packets);
        for at in LostAt::ALL {
            lost.with_label_values(&[at.as_str()])
                .inc_by(self.lost[at as usize].load(Ordering::Relaxed));
        }
        out.extend(lost.collect());
        Ok(out)
    }
}

impl Collector for DatapathCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match self.families() {
            Ok(families) => families,
            Err(e) => {
                warn!("reading datapath counters for /metrics: {e}");
                Vec::new()
            }
        }
    }
}

/// The agent's metrics, shared with whoever updates them.
pub struct Metrics {
    pub registry: Registry,
    pub datapath_interfaces: IntGaugeVec,
    pub registry_entries: IntGauge,
    pub registry_capacity: IntGauge,
    pub addresses: IntGaugeVec,
    pub conflicts: IntCounterVec,
    pub refused_claims: IntCounter,
    pub netlink_resyncs: IntCounter,
    pub stale_traffic_age_seconds: Histogram,
    pub quarantine_duration_seconds: Histogram,
    lost: Arc<[AtomicU64; LostAt::ALL.len()]>,
    ready: AtomicBool,
}

/// Buckets for durations from a few hundred milliseconds to an hour: cool-downs are seconds to
/// minutes, and the tail is what an operator sizing `cooldown` needs to see.
const DURATION_BUCKETS: [f64; 14] = [
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
];

impl Metrics {
    /// Registers every metric; the datapath counters come from the maps pinned under
    /// `bpffs_dir`.
    pub fn new(bpffs_dir: &Path) -> Result<Arc<Self>, MetricsError> {
        let registry = Registry::new();
        let layout = PinLayout::new(bpffs_dir);
        let counters = Counters::open(&mut Source::Pinned(&layout))?;
        let lost = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        registry.register(Box::new(DatapathCollector::new(counters, lost.clone())?))?;

        let datapath_interfaces = IntGaugeVec::new(
            Opts::new(
                "ipq_datapath_interfaces",
                "Interfaces with an ipq program attached, by hook.",
            ),
            &["hook"],
        )?;
        registry.register(Box::new(datapath_interfaces.clone()))?;
        for hook in Hook::ALL {
            datapath_interfaces
                .with_label_values(&[hook.as_str()])
                .set(0);
        }
        let registry_entries = IntGauge::new(
            "ipq_registry_entries",
            "Addresses in the datapath's address map.",
        )?;
        registry.register(Box::new(registry_entries.clone()))?;
        let registry_capacity = IntGauge::new(
            "ipq_registry_capacity",
            "Addresses the datapath's address map can hold.",
        )?;
        registry.register(Box::new(registry_capacity.clone()))?;
        let build_info = IntGaugeVec::new(
            Opts::new("ipq_build_info", "Always 1; the labels say which ipq runs."),
            &["version"],
        )?;
        registry.register(Box::new(build_info.clone()))?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);

        let addresses = IntGaugeVec::new(
            Opts::new(
                "ipq_addresses",
                "Addresses in the registry, by lifecycle state.",
            ),
            &["state"],
        )?;
        registry.register(Box::new(addresses.clone()))?;
        for state in [
            StateName::Active,
            StateName::Draining,
            StateName::Quarantined,
        ] {
            addresses.with_label_values(&[state.as_str()]).set(0);
        }
        let conflicts = IntCounterVec::new(
            Opts::new("ipq_conflicts_total", "Address conflicts seen, by kind."),
            &["kind"],
        )?;
        registry.register(Box::new(conflicts.clone()))?;
        for kind in ConflictKind::ALL {
            conflicts.with_label_values(&[kind.as_str()]).inc_by(0);
        }
        let refused_claims = IntCounter::new(
            "ipq_refused_claims_total",
            "Claims refused under on_early_reuse = refuse-new.",
        )?;
        registry.register(Box::new(refused_claims.clone()))?;
        let netlink_resyncs = IntCounter::new(
            "ipq_netlink_resyncs_total",
            "Full netlink dumps taken because events were lost.",
        )?;
        registry.register(Box::new(netlink_resyncs.clone()))?;
        let stale_traffic_age_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "ipq_stale_traffic_age_seconds",
                "Time since its holder left at which stale traffic for a quarantined address \
                 arrived (sampled): the evidence for choosing cooldown.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(stale_traffic_age_seconds.clone()))?;
        let quarantine_duration_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "ipq_quarantine_duration_seconds",
                "How long addresses stayed quarantined before release.",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
        )?;
        registry.register(Box::new(quarantine_duration_seconds.clone()))?;

        Ok(Arc::new(Self {
            registry,
            datapath_interfaces,
            registry_entries,
            registry_capacity,
            addresses,
            conflicts,
            refused_claims,
            netlink_resyncs,
            stale_traffic_age_seconds,
            quarantine_duration_seconds,
            lost,
            ready: AtomicBool::new(false),
        }))
    }

    /// Counts `n` events lost at `at` (`ipq_events_lost_total{source}`).
    pub fn events_lost(&self, at: LostAt, n: u64) {
        self.lost[at as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Sets the per-state address gauge from the registry.
    pub fn observe_registry<C: Clock>(&self, registry: &AddressRegistry<C>) {
        for state in [
            StateName::Active,
            StateName::Draining,
            StateName::Quarantined,
        ] {
            self.addresses
                .with_label_values(&[state.as_str()])
                .set(registry.count(state) as i64);
        }
    }

    /// Sets the attached-interface gauge from the attach points in use.
    pub fn observe_attachments(&self, points: impl Iterator<Item = AttachPoint>) {
        let mut counts = [0i64; 3];
        for point in points {
            counts[match point {
                AttachPoint::TcxIngress => 0,
                AttachPoint::TcxEgress => 1,
                AttachPoint::Xdp => 2,
            }] += 1;
        }
        for (hook, count) in [Hook::TcIngress, Hook::TcEgress, Hook::Xdp]
            .into_iter()
            .zip(counts)
        {
            self.datapath_interfaces
                .with_label_values(&[hook.as_str()])
                .set(count);
        }
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The registry in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            warn!("encoding metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

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
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" if metrics.is_ready() => respond(StatusCode::OK, "text/plain", "ready\n".into()),
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "not ready: datapath not attached yet\n".into(),
        ),
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
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    warn!("metrics: accept failed: {e}");
                    continue;
                }
            };
            let metrics = metrics.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let metrics = metrics.clone();
                    async move { Ok::<_, Infallible>(handle(metrics, req).await) }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!("metrics: connection from {peer}: {e}");
                }
            });
        }
    })
}
