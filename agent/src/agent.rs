//! The agent's main loop: load the datapath, attach to the configured interfaces, follow
//! interfaces as they come and go, report conflict samples, serve metrics, and stop on SIGTERM
//! leaving every pin in place so enforcement continues while no agent runs.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use ipq_common::{
    addr::AddrState,
    counters::{Action, Hook, Reason},
    sample::ConflictSample,
};
use log::{error, info, warn};
use thiserror::Error;
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    config::{Config, Mode},
    datapath::{decode_sample, Datapath, DatapathError, KernelLogger, LoadOptions, Samples},
    metrics::{self, Metrics, MetricsError},
    netdev,
    paths::AttachPoint,
};

/// How often the interface list is compared with what is attached.
const RESCAN_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

fn datapath_mode(mode: Mode) -> ipq_common::config::Mode {
    match mode {
        Mode::Enforce => ipq_common::config::Mode::Enforce,
        Mode::Observe => ipq_common::config::Mode::Observe,
    }
}

/// The role an interface has under `config`, if any.
fn role(config: &Config, ifname: &str) -> Option<AttachPoint> {
    if config.is_uplink(ifname) {
        Some(AttachPoint::Xdp)
    } else if config.workload_glob_matching(ifname).is_some() {
        Some(AttachPoint::TcxIngress)
    } else {
        None
    }
}

struct Agent {
    config: Config,
    datapath: Datapath,
    metrics: Arc<Metrics>,
    /// Interfaces attached, ifindex → name.
    known: BTreeMap<u32, String>,
}

impl Agent {
    /// Attaches every configured interface that exists and is not attached yet; forgets those
    /// that went away. Failures are per interface: one bad interface does not stop the rest.
    fn sync_interfaces(&mut self) -> Result<(), AgentError> {
        let present = netdev::interfaces().map_err(|source| AgentError::Io {
            what: "listing network interfaces",
            source,
        })?;
        let present: BTreeMap<u32, String> = present.into_iter().collect();
        let gone: Vec<u32> = self
            .known
            .keys()
            .filter(|i| present.get(i) != self.known.get(i))
            .copied()
            .collect();
        for ifindex in gone {
            if let Some(name) = self.known.remove(&ifindex) {
                info!("{name} (if{ifindex}) is gone; its links went with it");
            }
            self.datapath.forget_interface(ifindex)?;
        }
        for (ifindex, name) in &present {
            if self.known.contains_key(ifindex) {
                continue;
            }
            let result = match role(&self.config, name) {
                Some(AttachPoint::Xdp) => self.datapath.attach_uplink(name, *ifindex),
                Some(_) => self.datapath.attach_workload(name, *ifindex),
                None => continue,
            };
            match result {
                Ok(()) => {
                    self.known.insert(*ifindex, name.clone());
                }
                Err(e) => error!("{name} (if{ifindex}): not attached: {e}"),
            }
        }
        self.update_gauges();
        Ok(())
    }

    fn update_gauges(&self) {
        let attached = self.datapath.attached();
        for (hook, point) in [
            (Hook::TcIngress, AttachPoint::TcxIngress),
            (Hook::TcEgress, AttachPoint::TcxEgress),
            (Hook::Xdp, AttachPoint::Xdp),
        ] {
            let count = attached.keys().filter(|(_, p)| *p == point).count();
            self.metrics
                .datapath_interfaces
                .with_label_values(&[hook.as_str()])
                .set(count as i64);
        }
        self.metrics
            .registry_entries
            .set(self.datapath.maps.table.len() as i64);
    }
}

/// One conflict sample as a JSON log line.
fn sample_json(sample: &ConflictSample) -> serde_json::Value {
    let hook = Hook::ALL
        .into_iter()
        .find(|h| *h as u32 == sample.hook)
        .map_or("unknown", Hook::as_str);
    let m = sample.src_mac;
    serde_json::json!({
        "event": "conflict_sample",
        "addr": sample.addr.to_ip().to_string(),
        "hook": hook,
        "reason": Reason::from_raw(sample.reason).map_or("unknown", Reason::as_str),
        "action": Action::from_raw(sample.action).map_or("unknown", Action::as_str),
        "state": AddrState::from_raw(sample.state).map_or("unknown", AddrState::as_str),
        "ifindex": sample.ifindex,
        "holder_ifindex": sample.holder_ifindex,
        "src_mac": format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5]),
        "pkt_len": sample.pkt_len,
        "ts_monotonic_ns": sample.ts_ns,
    })
}

/// Reads the sample ring until the agent stops. Samples are already rate-limited per address
/// by the kernel, so each becomes one log line.
async fn read_samples(samples: Samples) -> Result<(), AgentError> {
    // SAFETY: the ring buffer owns its map fd, which stays open and unchanged for as long as
    // the AsyncFd owns the ring.
    let mut ring = unsafe { AsyncFd::register_with_interest(samples.0, Interest::READABLE) }
        .map_err(|e| AgentError::Io {
            what: "polling the sample ring buffer",
            source: e.into_parts().1,
        })?;
    loop {
        let mut guard = ring.readable_mut().await.map_err(|source| AgentError::Io {
            what: "polling the sample ring buffer",
            source,
        })?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode_sample(&item) {
                Some(sample) => info!(target: "ipq::conflict", "{}", sample_json(&sample)),
                None => warn!("sample ring: record of {} bytes ignored", item.len()),
            }
        }
        guard.clear_ready();
    }
}

/// Forwards the kernel programs' aya-log records to the agent's log (debug level).
async fn forward_kernel_logs(logger: KernelLogger) -> Result<(), AgentError> {
    // SAFETY: the logger owns its ring buffer's fd for as long as the AsyncFd owns it.
    let mut logger = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
        .map_err(|e| AgentError::Io {
            what: "polling the kernel log ring",
            source: e.into_parts().1,
        })?;
    loop {
        let mut guard = logger
            .readable_mut()
            .await
            .map_err(|source| AgentError::Io {
                what: "polling the kernel log ring",
                source,
            })?;
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

pub async fn run(config: Config) -> Result<(), AgentError> {
    info!(
        "ipq-agent {} starting: mode {:?}, bpffs_dir {}",
        env!("CARGO_PKG_VERSION"),
        config.mode,
        config.bpffs_dir.display()
    );
    let mut datapath = Datapath::load(&LoadOptions {
        bpffs_dir: config.bpffs_dir.clone(),
        capacity: config.capacity,
        mode: datapath_mode(config.mode),
    })?;
    let metrics = Metrics::new(&config.bpffs_dir)?;
    metrics
        .registry_capacity
        .set(i64::from(datapath.capacity()));
    let server = metrics::serve(config.metrics_addr, metrics.clone()).await?;
    tokio::spawn(server);
    let samples = datapath.take_samples();
    if let Some(logger) = datapath.take_logger() {
        tokio::spawn(async move {
            if let Err(e) = forward_kernel_logs(logger).await {
                warn!("kernel log reader stopped: {e}");
            }
        });
    }

    let mut agent = Agent {
        config,
        datapath,
        metrics: metrics.clone(),
        known: BTreeMap::new(),
    };
    agent.sync_interfaces()?;
    for (ifindex, point) in agent.datapath.prune_links()? {
        info!(
            "detached if{ifindex} {}: no longer configured or gone",
            point.as_str()
        );
    }
    metrics.set_ready(true);
    info!(
        "ready: {} interfaces attached; metrics on http://{}/metrics",
        agent.known.len(),
        agent.config.metrics_addr
    );

    if let Some(samples) = samples {
        tokio::spawn(async move {
            if let Err(e) = read_samples(samples).await {
                error!("sample reader stopped: {e}");
            }
        });
    }

    let signal_err = |source| AgentError::Io {
        what: "installing signal handlers",
        source,
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(signal_err)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(signal_err)?;
    let mut rescan = tokio::time::interval(RESCAN_INTERVAL);
    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            _ = rescan.tick() => {
                if let Err(e) = agent.sync_interfaces() {
                    error!("interface rescan: {e}");
                }
            }
        }
    }
    metrics.set_ready(false);
    info!("stopping; programs stay attached through their pins, enforcement continues");
    Ok(())
}
