//! The agent's main loop: load the datapath, recover the registry, follow netlink and the
//! kernel's conflict samples through the tracker, tick cool-downs, serve metrics, and stop on
//! SIGTERM leaving every pin in place so enforcement continues while no agent runs.

use std::{sync::Arc, time::Duration};

use ipq_fs::safe_fs::{self, DirError};
use log::{error, info, warn};
use thiserror::Error;
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};

use crate::{
    api::server::{Access, ApiServer, ServerError},
    config::Config,
    datapath::{attach, held_pins, verify, ClaimedDir, Datapath, DatapathError, LoadOptions},
    journal::{Journal, JournalError},
    listen,
    metrics::{self, Metrics, MetricsError},
    netdev,
    netlink::{self, NetEvent, NetlinkError},
    queues::{Overflows, Queue},
    tracker::{Answer, Recovery, Tracker},
};

mod kernel_rings;
mod spool_replay;
mod waiting;

use kernel_rings::{forward_kernel_logs, read_samples};
use spool_replay::replay_spool;
use waiting::WaitingAnswers;

/// API requests answered per journal save at most: a burst of CNI ADDs shares one fsync.
const MAX_REQUEST_BURST: usize = 256;

/// Longest sleep between two ticks: the CNI spool is replayed on each.
const MAX_TICK: Duration = Duration::from_secs(1);
/// How long a shutdown waits for a verification pass under way (each pass is O(interfaces);
/// one stuck in the kernel must not hold the exit up).
const VERIFIER_STOP: Duration = Duration::from_secs(5);

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
    #[error(transparent)]
    Api(#[from] ServerError),
    #[error("CNI spool directory: {0}")]
    SpoolDir(#[from] DirError),
    #[error(transparent)]
    Hygiene(#[from] crate::hygiene::HygieneError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error(
        "this CPU ({0}) is not supported: the programs read IPQ_SLOTS with a sequence lock \
         whose loads only x86-64 keeps in order (BPF has no read barrier before Linux 6.15), \
         so a packet racing the agent's write could be judged on a mix of two entries. Run \
         ipq on x86-64 nodes (the DaemonSet selects kubernetes.io/arch: amd64)"
    )]
    UnsupportedCpu(&'static str),
    #[error("{what}: the task stopped: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

/// Sleeps until the registry's next deadline or the next attach retry, and at most until
/// `MAX_TICK` after the last tick: the sleep starts again on every event, so a steady stream of
/// events less than `MAX_TICK` apart must not put off the periodic work (spool replay,
/// readiness) for ever.
fn tick_delay(tracker: &Tracker, last_tick: std::time::Instant) -> Duration {
    let now = netdev::monotonic_ns();
    let retry = tracker.attacher().next_retry().map_or(MAX_TICK, |at| {
        at.saturating_duration_since(std::time::Instant::now())
    });
    tracker
        .next_deadline()
        .map_or(MAX_TICK, |at| Duration::from_nanos(at.saturating_sub(now)))
        .min(MAX_TICK.saturating_sub(last_tick.elapsed()))
        .min(retry)
}

/// Takes a fresh dump after lost events and feeds the difference to the tracker.
async fn resync(tracker: &mut Tracker, metrics: &Metrics) {
    metrics.netlink_resyncs.inc();
    match netlink::dump().await {
        Ok(state) => {
            warn!("netlink events were lost; resynced from a fresh dump");
            tracker.reconcile(state);
        }
        Err(e) => error!("netlink resync failed: {e}"),
    }
}

pub async fn run(config: Config) -> Result<(), AgentError> {
    // Refused before anything is loaded: a datapath that is right only most of the time is
    // not one to leave attached.
    if !cfg!(target_arch = "x86_64") {
        return Err(AgentError::UnsupportedCpu(std::env::consts::ARCH));
    }
    info!(
        "ipq-agent {} starting: mode {:?}, on_early_reuse {:?}, bpffs_dir {}",
        env!("CARGO_PKG_VERSION"),
        config.mode,
        config.on_early_reuse,
        config.bpffs_dir.display()
    );
    // Before anything opens descriptors: the listeners' caps, not a soft limit of 1024, are
    // what bound the connections.
    match listen::raise_fd_limit() {
        Ok((old, new)) if old != new => info!("open files limit raised from {old} to {new}"),
        Ok(_) => {}
        Err(e) => warn!("raising the open files limit: {e}"),
    }
    let bpffs_dir = ClaimedDir::claim(&config.bpffs_dir)?;
    // Read beside the programs' load (the kernel's verifier) from here: neither the journal nor
    // the node's netlink state depends on the datapath, and at 64k addresses each takes about
    // as long as the load; in turn they made restart-to-ready about 850 ms. Their results are
    // used in the same order as before: the journal, then spooled DELs, then the dump.
    let state_dir = config.state_dir.clone();
    let journal_read = tokio::task::spawn_blocking(move || {
        let mut journal = Journal::open(&state_dir)?;
        let loaded = journal.load();
        Ok::<_, JournalError>((journal, loaded))
    });
    // Subscribed before the dump, so nothing that happens in between is missed; what happens
    // meanwhile waits in the subscription (an overflow takes the resync path).
    // The queue counters exist before the registry they are served from (the datapath's load
    // comes between): the netlink queue counts its overflows from here.
    let queues = Overflows::new().map_err(MetricsError::from)?;
    let mut events = netlink::subscribe(queues.of(Queue::NetlinkEvents))?;
    let dump = tokio::spawn(netlink::dump());
    let mut datapath = Datapath::load_in(
        bpffs_dir,
        &LoadOptions {
            bpffs_dir: config.bpffs_dir.clone(),
            capacity: config.capacity,
            mode: config.mode,
        },
    )?;
    let pins_root = config.bpffs_dir.clone();
    let metrics = Metrics::new(&config.bpffs_dir, queues.clone())?;
    metrics
        .registry_capacity
        .set(i64::from(datapath.capacity()));
    let server = metrics::serve(config.metrics_addr, metrics.clone()).await?;
    tokio::spawn(server);
    let (sample_tx, mut sample_rx) = mpsc::channel(kernel_rings::SAMPLE_QUEUE);
    if let Some(samples) = datapath.take_samples() {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = read_samples(samples, sample_tx, metrics).await {
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

    let access = Access::from_config(config.api_group.as_deref())?;
    let api_socket = config.api_socket.clone();
    let spool_dir = ipq_fs::paths::cni_spool_dir(&config.state_dir);
    let ipam_release_dir = ipq_fs::paths::ipam_release_dir(&config.state_dir);
    // Made the agent's before any ipq-cni can: nobody else may plant or remove spooled DELs.
    safe_fs::ensure_private_dir(&spool_dir)?;
    safe_fs::ensure_private_dir(&ipam_release_dir)?;
    safe_fs::ensure_private_dir(&ipq_fs::paths::ipam_allocation_dir(&config.state_dir))?;
    let metrics_addr = config.metrics_addr;
    let max_cooldown = config.max_cooldown;
    let publish = crate::publish::Settings::from_config(&config.kubernetes);
    let whereabouts_wanted = config.kubernetes.whereabouts;
    let whereabouts_target = publish
        .as_ref()
        .filter(|_| config.kubernetes.whereabouts)
        .map(|settings| crate::publish::whereabouts::Target {
            node: settings.node.clone(),
            namespace: config
                .kubernetes
                .whereabouts_namespace
                .clone()
                .unwrap_or_else(|| crate::publish::whereabouts::DEFAULT_NAMESPACE.to_owned()),
            network_name: config.kubernetes.whereabouts_network_name.clone(),
        });
    let ipam_bins = Arc::new(crate::ipam::trust::TrustedBins::new(
        config.ipam_cni_bin_dirs.clone(),
    ));
    let tc_mode = datapath.tc_mode(config.tc_attach)?;
    info!(
        "tc_attach {:?}: TC programs attach as {}",
        config.tc_attach,
        tc_mode.as_ref()
    );
    // Before the first attach: a deletion of ipq's netlink filter is never missed.
    let mut tc_notices =
        attach::tc_watch::subscribe(queues.of(Queue::TcNotices)).map_err(|source| {
            AgentError::Io {
                what: "subscribing to TC notifications",
                source,
            }
        })?;
    let (attacher, mut attach_reports) =
        datapath.start_attacher(tc_mode, queues.of(Queue::AttachReports))?;
    let (verify_tx, mut verifications) = mpsc::channel(1);
    let (stop_verifier, verifier_stop) = tokio::sync::watch::channel(false);
    let bpf_watch = datapath.take_bpf_watch();
    metrics.tamper.bpf_watcher.set(i64::from(bpf_watch.is_ok()));
    // Map writes' keys the watcher reported, for the owner loop to look at each at once; the
    // sender goes with the watcher, so without one this input never fires.
    let (settled_keys_tx, mut reported_keys) = mpsc::channel(kernel_rings::REPORTED_KEY_BATCHES);
    let watcher = bpf_watch.map(|watch| {
        let pokes = Arc::new(crate::datapath::bpf_watch::Pokes::default());
        let reader = pokes.clone();
        let metrics = metrics.clone();
        let (keys_tx, keys_rx) = mpsc::channel(kernel_rings::REPORTED_KEY_BATCHES);
        tokio::spawn(kernel_rings::settle_reported_keys(
            keys_rx,
            settled_keys_tx,
            pokes.clone(),
        ));
        tokio::spawn(async move {
            let lost_calls = metrics.tamper.bpf_watcher_lost_calls.clone();
            let keys_overflow = metrics.queues.of(crate::queues::Queue::ReportedKeys);
            let reading = kernel_rings::read_bpf_calls(
                watch,
                reader.clone(),
                lost_calls,
                keys_tx,
                keys_overflow,
            );
            let why = match reading.await {
                Ok(()) => "its ring reader ended".to_owned(),
                Err(e) => e.to_string(),
            };
            metrics.tamper.bpf_watcher.set(0);
            metrics.tamper.bpf_watcher_stops.inc();
            error!("bpf() watcher stopped: {why}; periodic verification only");
            reader.stop(why);
        });
        pokes
    });
    let pokes = watcher.as_ref().ok().cloned();
    let verifier = tokio::spawn(verify::run(
        pins_root.clone(),
        attacher.netlink_hooks(),
        config.verify_interval,
        datapath
            .take_maps_mirror()
            .map(|mirror| mirror.counting_overflows(metrics.queues.of(Queue::MapWrites))),
        pokes,
        verify_tx,
        verifier_stop,
    ));
    let (journal, loaded) = journal_read.await.map_err(|e| AgentError::Task {
        what: "reading the journal",
        source: e,
    })??;
    let mut tracker = Tracker::new(config, datapath, attacher, journal, metrics.clone());
    tracker.set_bpf_watcher(watcher);
    let recovery = tracker.recover(loaded);
    // DELs spooled while no agent ran drain their holders before the dump says which are gone,
    // so they end up exactly where a live DEL would have put them.
    replay_spool(&mut tracker, &spool_dir);
    let dump = dump.await.map_err(|e| AgentError::Task {
        what: "dumping the node's netlink state",
        source: e,
    })??;
    tracker.reconcile(dump);
    // Every configured interface attached (or failed) once before pruning: the pins of an
    // interface still being attached are its enforcement until its new program is in.
    while tracker.attaching() {
        match attach_reports.recv().await {
            Some(report) => tracker.on_attach_report(report),
            None => break,
        }
    }
    tracker.prune_links();
    // A failure is logged and counted by persist; the loop retries every tick.
    let _ = tracker.persist();
    // After recovery and the first reconcile: from here on a holder gone or new is a change on
    // the node, and its address is cleaned.
    let mut hygiene_reports = tracker.start_hygiene()?;
    let (command_tx, mut commands) = mpsc::channel(1024);
    // Only now, with the registry recovered and the spool replayed: "free" is then the truth.
    let (urgent_tx, urgent_rx) = mpsc::channel(64);
    tracker.set_ipam_releaser(urgent_tx);
    // With the registry recovered and reconciled: the object's first write is the node's truth.
    match publish {
        Some(settings) => {
            info!(
                "publishing NodeQuarantine {} ({})",
                settings.node,
                settings.kubeconfig.as_ref().map_or_else(
                    || "in-cluster service account".to_owned(),
                    |path| format!("kubeconfig {}", path.display())
                )
            );
            if let Some(target) = whereabouts_target {
                info!(
                    "projecting it into whereabouts' reservations in namespace {} (network \
                     name {:?})",
                    target.namespace, target.network_name
                );
                tracker.start_projecting(crate::publish::whereabouts::start(
                    target,
                    settings.kubeconfig.clone(),
                    metrics.clone(),
                ));
            }
            tracker.start_publishing(crate::publish::start(settings, metrics.clone()));
        }
        None if whereabouts_wanted => warn!(
            "kubernetes.whereabouts is set but there is no Kubernetes node name (NODE_NAME): \
             no NodeQuarantine is published, and no address is kept from whereabouts"
        ),
        None => info!("no Kubernetes node name (NODE_NAME): no NodeQuarantine is published"),
    }
    let releaser_settings = crate::ipam::releaser::Settings {
        dir: ipam_release_dir,
        max_cooldown,
        registry_lost_at: (recovery == Recovery::PinnedMaps).then(ipq_api::model::now_unix_ms),
        bins: ipam_bins.clone(),
        records: tracker.ipam_records(),
    };
    // ipq-ipam's records are not listed here: a release looks its record up by its file name
    // (`Records::get`), and the releaser's scans adopt the rest off the loop, so start-up
    // costs nothing per record.
    let releaser = tokio::spawn(crate::ipam::releaser::run(
        releaser_settings,
        command_tx.clone(),
        urgent_rx,
        metrics.clone(),
        tracker.ipam_holds(),
    ));
    let api = tokio::spawn(ApiServer::bind(&api_socket, access)?.serve(
        command_tx,
        metrics.clone(),
        ipam_bins,
        tracker.ipam_records(),
    ));
    metrics.readiness.set_started(true);
    // Only now: a TCX link create holds rtnl_lock for a grace period, and start-up's netlink
    // requests (the prune above) would wait behind every one.
    let started = tracker.mark_started();
    info!(
        "started: registry recovered from {recovery:?} with {} addresses, {} attachments, \
         {} unprotected, {} interfaces to move from netlink filters to TCX; metrics on \
         http://{metrics_addr}/metrics",
        tracker.registry().len(),
        started.attachments,
        started.unprotected,
        started.tc_upgrades_pending,
    );

    let signal_err = |source| AgentError::Io {
        what: "installing signal handlers",
        source,
    };
    let mut sigterm = signal(SignalKind::terminate()).map_err(signal_err)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(signal_err)?;
    let mut last_tick = std::time::Instant::now();
    let mut trimmer = crate::heap::Trimmer::new();
    // From here on a save's fdatasync runs off this loop; answers wait for it in `waiting`.
    let mut synced = tracker.defer_journal_syncs();
    let mut waiting = WaitingAnswers::default();
    loop {
        let mut ticked = false;
        let delay = tick_delay(&tracker, last_tick);
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
                    resync(&mut tracker, &metrics).await;
                }
            }
            Some(notice) = tc_notices.recv() => {
                tracker.on_tc_notice(notice);
                while let Ok(notice) = tc_notices.try_recv() {
                    tracker.on_tc_notice(notice);
                }
            }
            Some(verification) = verifications.recv() => {
                tracker.on_verification(verification);
            }
            Some(keys) = reported_keys.recv() => {
                tracker.recheck_reported(&keys);
            }
            Some(report) = attach_reports.recv() => {
                tracker.on_attach_report(report);
                while let Ok(report) = attach_reports.try_recv() {
                    tracker.on_attach_report(report);
                }
            }
            Some(report) = hygiene_reports.recv() => {
                tracker.on_hygiene_report(report);
                while let Ok(report) = hygiene_reports.try_recv() {
                    tracker.on_hygiene_report(report);
                }
            }
            Some(sample) = sample_rx.recv() => {
                tracker.on_sample(&sample);
                while let Ok(sample) = sample_rx.try_recv() {
                    tracker.on_sample(&sample);
                }
            }
            Some(command) = commands.recv() => {
                let mut answers: Vec<Answer> = vec![tracker.handle(command)];
                while answers.len() < MAX_REQUEST_BURST {
                    let Ok(command) = commands.try_recv() else { break };
                    answers.push(tracker.handle(command));
                }
                // Answered only once what they changed is on disk (the flush runs off this
                // loop); `unavailable`, with the journal's error, when it cannot be.
                waiting.after_save(answers, tracker.persist_deferred());
            }
            Some(report) = synced.recv() => {
                waiting.on_synced(tracker.on_synced(report));
                while let Ok(report) = synced.try_recv() {
                    waiting.on_synced(tracker.on_synced(report));
                }
            }
            _ = tokio::time::sleep(delay) => {
                last_tick = std::time::Instant::now();
                tracker.tick();
                replay_spool(&mut tracker, &spool_dir);
                ticked = true;
                trimmer.on_tick();
            }
        }
        if !ticked {
            trimmer.on_activity();
        }
        // Also the retry of a failed save: this runs at least once a second.
        waiting.after_quiet_save(&tracker.persist_deferred());
        tracker.publish_changes();
    }
    api.abort();
    let _ = api.await;
    releaser.abort();
    let _ = releaser.await;
    metrics.readiness.set_started(false);
    // The agent's descriptors close on exit: a pin someone removed must be back before that,
    // or its link detaches and its map is not found by the next agent. Done after the last
    // verification pass has ended (no two looks at the pins at once) and while this agent
    // still holds the bpffs_dir lock (the tracker's datapath holds it): a successor started
    // meanwhile is refused the directory, so these pins are never put over its own.
    let _ = stop_verifier.send(true);
    if tokio::time::timeout(VERIFIER_STOP, verifier).await.is_err() {
        warn!(
            "the datapath verification did not end within {VERIFIER_STOP:?}; checking the pins \
             beside it"
        );
    }
    let restored = held_pins::restore(&pins_root);
    held_pins::report(&restored);
    tracker.shutdown();
    let unrestored = restored.iter().filter(|r| r.outcome.is_err()).count();
    crate::datapath::bpffs::say_at_stop(&pins_root, unrestored);
    Ok(())
}
