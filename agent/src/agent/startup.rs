//! The agent's start-up, as phases whose types say what each has in hand: the datapath loaded
//! beside the journal's read and the netlink dump ([`Loaded`]); the threads that watch the
//! datapath started ([`Watching`]); the registry recovered and reconciled with the node
//! ([`Recovered`]); and the surfaces that change it started, the loop's inputs gathered
//! ([`Serving`]). The order is the contract: each phase's comment says what must come before.

use std::{path::PathBuf, sync::Arc};

use ipq_fs::safe_fs;
use log::{error, info, warn};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

use super::{
    inputs::{self, DatapathInputs},
    kernel_rings::{self, forward_kernel_logs, read_samples},
    owner_loop::OwnerLoop,
    spool_replay::{self, replay_spool},
    waiting::WaitingAnswers,
    AgentError,
};
use crate::{
    api::server::{Access, ApiServer},
    config::Config,
    datapath::{
        attach::{self, tc_watch::TcNotice, Attacher, JobReport},
        bpf_watch::{Pokes, ReportedKey},
        verify::{self, Verification},
        ClaimedDir, Datapath, LoadOptions,
    },
    heap::Trimmer,
    journal::{self, Journal, JournalError},
    listen,
    metrics::{self, Metrics, MetricsError},
    netlink::{self, NetEvent, NetState, NetlinkError},
    queues::{Overflows, Queue},
    registry::AddrRecord,
    tracker::{Durable, Recovery, ServeWith, Tracker},
};

/// Refuses what ipq cannot run on, raises the descriptors' limit and claims the pins'
/// directory: nothing is loaded yet.
pub(super) fn preflight(config: &Config) -> Result<ClaimedDir, AgentError> {
    info!(
        "ipq-agent {} starting: mode {:?}, on_early_reuse {:?}, bpffs_dir {}",
        env!("CARGO_PKG_VERSION"),
        config.mode,
        config.on_early_reuse,
        config.bpffs_dir.display()
    );
    // The programs stamp with the kernel's clock, which a time namespace does not move: the
    // agent reads it the same way, its namespace's offsets taken off (`kernel_clock`).
    match crate::kernel_clock::offsets()? {
        offsets if offsets.is_zero() => {}
        offsets => info!(
            "running in a time namespace (monotonic offset {} ns, boottime offset {} ns):              reading the kernel's clocks without them, as the datapath programs do",
            offsets.monotonic_ns, offsets.boottime_ns
        ),
    }
    // Before anything opens descriptors: the listeners' caps, not a soft limit of 1024, are
    // what bound the connections.
    match listen::raise_fd_limit() {
        Ok((old, new)) if old != new => info!("open files limit raised from {old} to {new}"),
        Ok(_) => {}
        Err(e) => warn!("raising the open files limit: {e}"),
    }
    Ok(ClaimedDir::claim(&config.bpffs_dir)?)
}

/// The datapath loaded, its metrics served and its rings read; the journal's read and the
/// node's netlink dump still under way beside it.
pub(super) struct Loaded {
    config: Config,
    api: ApiServer,
    datapath: Datapath,
    metrics: Arc<Metrics>,
    journal_read: JoinHandle<Result<(Journal, JournalLoad), JournalError>>,
    dump: JoinHandle<Result<NetState, NetlinkError>>,
    net_events: mpsc::Receiver<NetEvent>,
    samples: mpsc::Receiver<ipq_common::sample::ConflictSample>,
}

type JournalLoad = Result<Option<journal::Loaded<AddrRecord>>, JournalError>;

pub(super) async fn load(config: Config, bpffs_dir: ClaimedDir) -> Result<Loaded, AgentError> {
    // A group that does not resolve stops the agent before anything is loaded.
    let access = Access::from_config(
        config.api_group.as_deref(),
        config.api_admin_group.as_deref(),
        config.api_peer_procfs.as_deref(),
    )?;
    // Bound now, served once the registry is back: a CNI DEL sent during start-up waits in the
    // socket's backlog for this agent instead of being spooled after the spool was replayed,
    // where the netlink dump would see its pod's veth gone and quarantine the address before
    // the DEL drained it. (Only after the bpffs_dir lock: the socket is the running agent's.)
    let api = ApiServer::bind(&config.api_socket, access)?;
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
    let net_events = netlink::subscribe(queues.of(Queue::NetlinkEvents))?;
    let dump = tokio::spawn(netlink::dump());
    let mut datapath = Datapath::load_in(
        bpffs_dir,
        &LoadOptions {
            bpffs_dir: config.bpffs_dir.clone(),
            capacity: config.capacity,
            mode: config.mode,
            slots_order: None,
            bpf_watcher: config.bpf_watcher,
        },
    )?;
    let metrics = Metrics::new(&config.bpffs_dir, queues)?;
    metrics
        .registry_capacity
        .set(i64::from(datapath.capacity()));
    tokio::spawn(metrics::serve(config.metrics_addr, metrics.clone()).await?);
    let (sample_tx, samples) = mpsc::channel(kernel_rings::SAMPLE_QUEUE);
    if let Some(ring) = datapath.take_samples() {
        let metrics = metrics.clone();
        tokio::spawn(async move {
            if let Err(e) = read_samples(ring, sample_tx, metrics).await {
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
    Ok(Loaded {
        config,
        api,
        datapath,
        metrics,
        journal_read,
        dump,
        net_events,
        samples,
    })
}

/// The threads that keep the datapath ipq's: the attach workers, TC notices, the bpf() watcher
/// and the verification; the registry not yet back.
pub(super) struct Watching {
    loaded: Loaded,
    attacher: Attacher,
    tc_notices: mpsc::Receiver<TcNotice>,
    attach_reports: mpsc::Receiver<JobReport>,
    verifications: mpsc::Receiver<Verification>,
    reported_keys: mpsc::Receiver<Vec<ReportedKey>>,
    watcher: Result<Arc<Pokes>, String>,
    verifier: Verifier,
}

/// The verification's task, and how to stop it.
pub(super) struct Verifier {
    pub(super) task: JoinHandle<()>,
    pub(super) stop: watch::Sender<bool>,
}

impl Loaded {
    pub(super) fn watch(mut self) -> Result<Watching, AgentError> {
        let tc_mode = self.datapath.tc_mode(self.config.tc_attach)?;
        info!(
            "tc_attach {:?}: TC programs attach as {}",
            self.config.tc_attach,
            tc_mode.as_ref()
        );
        let queues = &self.metrics.queues;
        // Before the first attach: a deletion of ipq's netlink filter is never missed.
        let tc_notices =
            attach::tc_watch::subscribe(queues.of(Queue::TcNotices)).map_err(|source| {
                AgentError::Io {
                    what: "subscribing to TC notifications",
                    source,
                }
            })?;
        let (attacher, attach_reports) = self
            .datapath
            .start_attacher(tc_mode, queues.of(Queue::AttachReports))?;
        // Map writes' keys the watcher reported, for the owner loop to look at each at once;
        // the sender goes with the watcher, so without one this input never fires.
        let (settled_keys, reported_keys) = mpsc::channel(kernel_rings::REPORTED_KEY_BATCHES);
        let watcher = self
            .datapath
            .take_bpf_watch()
            .map(|watch| kernel_rings::start_bpf_watch(watch, settled_keys, &self.metrics));
        self.metrics
            .tamper
            .bpf_watcher
            .set(i64::from(watcher.is_ok()));
        if watcher.is_err() {
            self.metrics
                .tamper
                .set_bpf_watcher_mode(ipq_common::watch::WatchMode::None);
        }
        let (findings, verifications) = mpsc::channel(1);
        let (stop, stopped) = watch::channel(false);
        let mirror = self
            .datapath
            .take_maps_mirror()
            .map(|mirror| mirror.counting_overflows(self.metrics.queues.of(Queue::MapWrites)));
        let task = tokio::spawn(verify::run(
            self.config.bpffs_dir.clone(),
            attacher.ledger().netlink_hooks(),
            self.config.verify_interval,
            mirror,
            verify::Triggers {
                pokes: watcher.as_ref().ok().cloned(),
                passes: self.metrics.tamper.verify_passes.clone(),
            },
            findings,
            stopped,
        ));
        Ok(Watching {
            loaded: self,
            attacher,
            tc_notices,
            attach_reports,
            verifications,
            reported_keys,
            watcher,
            verifier: Verifier { task, stop },
        })
    }
}

/// The registry recovered, the spooled DELs replayed, the node's state reconciled, every
/// configured interface attached (or failed) once and the journal saved.
pub(super) struct Recovered {
    config: Config,
    api: ApiServer,
    tracker: Tracker,
    durable: Durable,
    recovery: Recovery,
    metrics: Arc<Metrics>,
    spool_dir: PathBuf,
    inputs: DatapathInputs,
    verifier: Verifier,
}

impl Watching {
    pub(super) async fn recover(self) -> Result<Recovered, AgentError> {
        let loaded = self.loaded;
        let mut inputs = DatapathInputs {
            net: loaded.net_events,
            samples: loaded.samples,
            tc_notices: self.tc_notices,
            attach_reports: self.attach_reports,
            verifications: self.verifications,
            reported_keys: self.reported_keys,
        };
        let (journal, journal_load) =
            loaded
                .journal_read
                .await
                .map_err(|source| AgentError::Task {
                    what: "reading the journal",
                    source,
                })??;
        let config = loaded.config;
        let spool_dir = ipq_fs::paths::cni_spool_dir(&config.state_dir);
        // Made the agent's before any ipq-cni can: nobody else may plant or remove spooled
        // DELs or ipq-ipam's releases and records.
        safe_fs::ensure_private_dir(&spool_dir)?;
        safe_fs::ensure_private_dir(&ipq_fs::paths::ipam_release_dir(&config.state_dir))?;
        safe_fs::ensure_private_dir(&ipq_fs::paths::ipam_allocation_dir(&config.state_dir))?;
        let metrics = loaded.metrics;
        let mut tracker = Tracker::new(
            config.clone(),
            loaded.datapath,
            self.attacher,
            self.watcher,
            metrics.clone(),
        );
        let mut durable = Durable::new(journal, metrics.clone());
        let recovery = tracker.recover(journal_load, durable.journal_mut());
        // DELs spooled while no agent ran drain their holders before the dump says which are
        // gone, so they end up exactly where a live DEL would have put them.
        replay_spool(&mut tracker, &mut durable, &spool_dir);
        let dump = loaded.dump.await.map_err(|source| AgentError::Task {
            what: "dumping the node's netlink state",
            source,
        })??;
        tracker.reconcile(dump);
        tracker.first_attach(&mut inputs.attach_reports).await;
        // A failure is logged and counted by persist; the loop retries every tick.
        let _ = durable.persist(tracker.journaled());
        Ok(Recovered {
            config,
            api: loaded.api,
            tracker,
            durable,
            recovery,
            metrics,
            spool_dir,
            inputs,
            verifier: self.verifier,
        })
    }
}

/// The agent serving: hygiene, the publisher, the IPAM releaser and the API started, the
/// owner loop ready to run over its inputs.
pub(super) struct Serving {
    pub(super) owner: OwnerLoop,
    pub(super) api: JoinHandle<()>,
    pub(super) releaser: JoinHandle<()>,
    pub(super) verifier: Verifier,
    pub(super) metrics: Arc<Metrics>,
    pub(super) pins_root: PathBuf,
}

impl Recovered {
    pub(super) fn serve(self) -> Result<Serving, AgentError> {
        let (config, metrics, recovery) = (self.config, self.metrics, self.recovery);
        let (mut tracker, mut durable) = (self.tracker, self.durable);
        let (command_tx, commands) = mpsc::channel(1024);
        let (urgent_tx, urgent_rx) = mpsc::channel(64);
        let release_dir = ipq_fs::paths::ipam_release_dir(&config.state_dir);
        // Releases answered as stored, from the store's thread to the releaser.
        let handed = crate::ipam::store::Handed::default();
        let (remote_claims, remote_claim_answers) = start_remote_claim_checks(&config, &metrics)
            .map_err(|e| AgentError::Metrics(e.into()))?;
        let serving = tracker.serve(ServeWith {
            urgent: urgent_tx,
            publish: start_publishing(&config, &metrics)?,
            pod_events: start_pod_events(&config, &metrics)
                .map_err(|e| AgentError::Metrics(e.into()))?,
            remote_claims,
        })?;
        let (ipam_holds, ipam_records) = (serving.ipam_holds, serving.ipam_records);
        let store = crate::ipam::store::ReleaseStore::start(
            release_dir.clone(),
            handed.clone(),
            ipam_holds.clone(),
            metrics.clone(),
        )
        .map_err(|source| AgentError::Io {
            what: "starting the thread that stores ipq-ipam's releases",
            source,
        })?;
        tracker.store_releases_with(store);
        let ipam_bins = Arc::new(crate::ipam::trust::TrustedBins::new(
            config.ipam_cni_bin_dirs.clone(),
        ));
        let releaser_settings = crate::ipam::releaser::Settings {
            dir: release_dir,
            handed,
            max_cooldown: config.max_cooldown,
            registry_lost_at: (recovery == Recovery::PinnedMaps)
                .then(crate::kernel_clock::boottime_ns),
            bins: ipam_bins.clone(),
            records: ipam_records.clone(),
        };
        // ipq-ipam's records are not listed here: a release looks its record up by its file
        // name (`Records::get`), and the releaser's scans adopt the rest off the loop, so
        // start-up costs nothing per record.
        let releaser = tokio::spawn(crate::ipam::releaser::run(
            releaser_settings,
            command_tx.clone(),
            urgent_rx,
            metrics.clone(),
            ipam_holds,
        ));
        let api =
            tokio::spawn(
                self.api
                    .serve(command_tx, metrics.clone(), ipam_bins, ipam_records),
            );
        let stop_signals = inputs::stop_signals()?;
        metrics.readiness.set_started(true);
        let started = serving.started;
        info!(
            "started: registry recovered from {recovery:?} with {} addresses, {} attachments, \
             {} unprotected, {} interfaces to move from netlink filters to TCX; metrics on \
             http://{}/metrics",
            serving.addresses,
            started.attachments,
            started.unprotected,
            started.tc_upgrades_pending,
            config.metrics_addr,
        );
        // From here on a save's fdatasync runs off the loop; answers wait for it.
        let synced = durable.defer_syncs();
        // From here on the CNI spool is read off the loop too.
        let (spooled_tx, spooled) = mpsc::channel(1);
        tokio::spawn(spool_replay::read_spool(self.spool_dir, spooled_tx));
        let inputs = self.inputs.with(
            stop_signals,
            serving.hygiene_reports,
            remote_claim_answers,
            commands,
            (synced, spooled),
        );
        Ok(Serving {
            owner: OwnerLoop {
                tracker,
                durable,
                inputs,
                metrics: metrics.clone(),
                waiting: WaitingAnswers::default(),
                trimmer: Trimmer::new(),
                last_tick: std::time::Instant::now(),
            },
            api,
            releaser,
            verifier: self.verifier,
            metrics,
            pins_root: config.bpffs_dir.clone(),
        })
    }
}

/// Registers the remote-claim checks' metrics (always) and, when the agent knows its
/// Kubernetes node, starts asking the API server about remote claims' local holders; the
/// answers' queue (never fires when nothing asks).
fn start_remote_claim_checks(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<
    (
        Option<crate::remote_claim::Asker>,
        mpsc::Receiver<crate::remote_claim::Answer>,
    ),
    prometheus::Error,
> {
    let check_metrics = Arc::new(crate::remote_claim::RemoteClaimMetrics::register(
        &metrics.registry,
    )?);
    let Some(publish) = crate::publish::Settings::from_config(&config.kubernetes) else {
        return Ok((None, mpsc::channel(1).1));
    };
    info!(
        "a remote claim of an Active pod's address is checked with the API server before the \
         pod is fenced"
    );
    let (asker, answers) = crate::remote_claim::start(
        crate::remote_claim::Settings {
            kubeconfig: publish.kubeconfig,
        },
        check_metrics,
    );
    Ok((Some(asker), answers))
}

/// Registers the pod Events' metrics (always: the same series on every node) and starts their
/// writer when the agent knows its Kubernetes node and `kubernetes.pod_events` is on.
fn start_pod_events(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<Option<crate::pod_events::Feed>, prometheus::Error> {
    let event_metrics = Arc::new(crate::pod_events::EventMetrics::register(
        &metrics.registry,
    )?);
    let Some(publish) = crate::publish::Settings::from_config(&config.kubernetes) else {
        return Ok(None);
    };
    if !config.kubernetes.pod_events {
        info!("kubernetes.pod_events is off: no Events are written on pods");
        return Ok(None);
    }
    info!(
        "writing Events on the pods involved (at most one write per pod and reason every {:?})",
        config.kubernetes.pod_events_interval
    );
    let settings = crate::pod_events::Settings {
        node: publish.node,
        kubeconfig: publish.kubeconfig,
        interval: config.kubernetes.pod_events_interval,
    };
    Ok(Some(crate::pod_events::start(settings, event_metrics)))
}

/// Starts the NodeQuarantine publisher and, when asked, the whereabouts projection, when the
/// agent knows its Kubernetes node; their ends, for the tracker.
fn start_publishing(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<
    Option<(
        crate::publish::Feed,
        Option<crate::publish::whereabouts::Feed>,
        crate::publish::cluster::ClusterReader,
    )>,
    MetricsError,
> {
    // Registered whether or not the agent publishes (all zeros then): dashboards and alerts
    // see the same series on every node. Each part registers its own.
    let publish_metrics = Arc::new(crate::publish::PublishMetrics::register(&metrics.registry)?);
    let projection_metrics = Arc::new(crate::publish::whereabouts::ProjectionMetrics::register(
        &metrics.registry,
    )?);
    let Some(settings) = crate::publish::Settings::from_config(&config.kubernetes) else {
        if config.kubernetes.whereabouts {
            warn!(
                "kubernetes.whereabouts is set but there is no Kubernetes node name \
                 (NODE_NAME): no NodeQuarantine is published, and no address is kept from \
                 whereabouts"
            );
        } else {
            info!("no Kubernetes node name (NODE_NAME): no NodeQuarantine is published");
        }
        return Ok(None);
    };
    info!(
        "publishing NodeQuarantine {} ({})",
        settings.node,
        settings.kubeconfig.as_ref().map_or_else(
            || "in-cluster service account".to_owned(),
            |path| format!("kubeconfig {}", path.display())
        )
    );
    // One view of the API server for both: a return either sees ends both backoffs.
    let health = crate::publish::ApiHealth::new();
    let feed = crate::publish::start(settings.clone(), publish_metrics.clone(), health.clone());
    let projection = config.kubernetes.whereabouts.then(|| {
        let target = crate::publish::whereabouts::Target {
            node: settings.node.clone(),
            namespace: config
                .kubernetes
                .whereabouts_namespace
                .clone()
                .unwrap_or_else(|| crate::publish::whereabouts::DEFAULT_NAMESPACE.to_owned()),
            network_name: config.kubernetes.whereabouts_network_name.clone(),
        };
        info!(
            "projecting it into whereabouts' reservations in namespace {} (network name {:?})",
            target.namespace, target.network_name
        );
        let task_metrics = crate::publish::whereabouts::TaskMetrics {
            projection: projection_metrics,
            feed_full: publish_metrics.feed_full.clone(),
        };
        crate::publish::whereabouts::start(
            target,
            settings.kubeconfig.clone(),
            task_metrics,
            health.clone(),
            feed.orphans(),
        )
    });
    let cluster = crate::publish::cluster::ClusterReader::start(
        settings.node.clone(),
        settings.kubeconfig.clone(),
    );
    Ok(Some((feed, projection, cluster)))
}
