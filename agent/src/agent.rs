//! The agent's main loop: load the datapath, recover the registry, follow netlink and the
//! kernel's conflict samples through the tracker, tick cool-downs, serve metrics, and stop on
//! SIGTERM leaving every pin in place so enforcement continues while no agent runs.

use std::time::Duration;

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
    sync::mpsc,
};

use crate::{
    config::{Config, Mode},
    datapath::{decode_sample, Datapath, DatapathError, KernelLogger, LoadOptions, Samples},
    journal::{Journal, JournalError},
    metrics::{self, Metrics, MetricsError},
    netdev,
    netlink::{self, NetEvent, NetlinkError},
    tracker::Tracker,
};

/// Longest sleep between two ticks: stale-traffic stamps are read from the maps on each.
const MAX_TICK: Duration = Duration::from_secs(1);

#[derive(Debug, Error)]
pub enum AgentError {
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Journal(#[from] JournalError),
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
async fn read_samples(
    samples: Samples,
    to_tracker: mpsc::UnboundedSender<ConflictSample>,
) -> Result<(), AgentError> {
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
                Some(sample) => {
                    info!(target: "ipq::conflict", "{}", sample_json(&sample));
                    if to_tracker.send(sample).is_err() {
                        return Ok(());
                    }
                }
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

/// Sleeps until the registry's next deadline, at most `MAX_TICK`.
fn tick_delay(tracker: &Tracker) -> Duration {
    let now = netdev::monotonic_ns();
    tracker
        .next_deadline()
        .map_or(MAX_TICK, |at| Duration::from_nanos(at.saturating_sub(now)))
        .min(MAX_TICK)
}

/// Takes a fresh dump after lost events and feeds the difference to the tracker.
async fn resync(tracker: &mut Tracker, handle: &rtnetlink::Handle, metrics: &Metrics) {
    metrics.netlink_resyncs.inc();
    match netlink::dump(handle).await {
        Ok(state) => {
            warn!("netlink events were lost; resynced from a fresh dump");
            tracker.reconcile(state);
        }
        Err(e) => error!("netlink resync failed: {e}"),
    }
}

pub async fn run(config: Config) -> Result<(), AgentError> {
    info!(
        "ipq-agent {} starting: mode {:?}, on_early_reuse {:?}, bpffs_dir {}",
        env!("CARGO_PKG_VERSION"),
        config.mode,
        config.on_early_reuse,
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
    let (sample_tx, mut sample_rx) = mpsc::unbounded_channel();
    if let Some(samples) = datapath.take_samples() {
        tokio::spawn(async move {
            if let Err(e) = read_samples(samples, sample_tx).await {
                error!("sample reader stopped: {e}");
            }
        });
    }
    if let Some(logger) = datapath.take_logger() {
        tokio::spawn(async move {
            if let Err(e) = forward_kernel_logs(logger).await {
                warn!("kernel log reader stopped: {e}");
            }
        });
    }

    let journal = Journal::open(&config.state_dir)?;
    let metrics_addr = config.metrics_addr;
    let mut tracker = Tracker::new(config, datapath, journal, metrics.clone());
    let recovery = tracker.recover();
    // Subscribe before dumping, so nothing that happens in between is missed.
    let mut events = netlink::subscribe()?;
    let handle = netlink::connect()?;
    tracker.reconcile(netlink::dump(&handle).await?);
    tracker.prune_links();
    tracker.persist();
    metrics.set_ready(true);
    info!(
        "ready: registry recovered from {recovery:?} with {} addresses, {} attachments; \
         metrics on http://{metrics_addr}/metrics",
        tracker.registry().len(),
        tracker.datapath().attached().len(),
    );

    let signal_err = |source| AgentError::Io {
        what: "installing signal handlers",
        source,
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(signal_err)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(signal_err)?;
    loop {
        let delay = tick_delay(&tracker);
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            event = events.recv() => {
                let Some(event) = event else {
                    error!("netlink subscription closed");
                    break;
                };
                let mut overrun = event == NetEvent::Overrun;
                if !overrun {
                    tracker.on_event(event);
                }
                // Take the whole burst before persisting once.
                while let Ok(event) = events.try_recv() {
                    if event == NetEvent::Overrun {
                        overrun = true;
                    } else {
                        tracker.on_event(event);
                    }
                }
                if overrun {
                    resync(&mut tracker, &handle, &metrics).await;
                }
            }
            Some(sample) = sample_rx.recv() => {
                tracker.on_sample(&sample);
                while let Ok(sample) = sample_rx.try_recv() {
                    tracker.on_sample(&sample);
                }
            }
            _ = tokio::time::sleep(delay) => tracker.tick(),
        }
        tracker.persist();
    }
    metrics.set_ready(false);
    tracker.shutdown();
    info!("stopping; programs stay attached through their pins, enforcement continues");
    Ok(())
}
