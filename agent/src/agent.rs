//! The agent: its start-up as typed phases (`startup`: preflight, the datapath loaded beside the
//! journal's read and the netlink dump, the watching threads, the registry recovered and
//! reconciled, the surfaces served), one owner loop over one input type (`inputs`,
//! `owner_loop`), and the stop, which leaves every pin in place so enforcement continues while
//! no agent runs.

use std::time::Duration;

use ipq_fs::safe_fs::DirError;
use log::{error, warn};
use thiserror::Error;

use crate::{
    api::server::ServerError,
    config::Config,
    datapath::{held_pins, DatapathError},
    journal::JournalError,
    metrics::MetricsError,
    netlink::NetlinkError,
};

mod inputs;
mod kernel_rings;
mod owner_loop;
mod spool_replay;
mod startup;
mod waiting;

/// How long a shutdown waits for a verification pass under way (each pass is O(interfaces);
/// one stuck in the kernel must not hold the exit up).
const VERIFIER_STOP: Duration = Duration::from_secs(5);

/// How long the stop waits for the event feed's followers to take the last events.
const EVENT_STREAMS_STOP: Duration = Duration::from_secs(1);

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
    #[error("the kernel's clocks cannot be read as the datapath programs read them: {0}")]
    Clock(#[from] crate::kernel_clock::ClockError),
    #[error("{what}: the task stopped: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
}

/// Runs the agent until SIGTERM or SIGINT: the start-up's phases in their order, the owner
/// loop, and the shutdown.
pub async fn run(config: Config) -> Result<(), AgentError> {
    let bpffs_dir = startup::preflight(&config)?;
    let serving = startup::load(config, bpffs_dir)
        .await?
        .watch()?
        .recover()
        .await?
        .serve()?;
    let startup::Serving {
        owner,
        api,
        releaser,
        verifier,
        metrics,
        pins_root,
    } = serving;
    let (mut tracker, mut durable) = owner.run().await;

    api.abort();
    let _ = api.await;
    // No new connection now: whoever follows the event feed gets what was published before
    // the stop (the last DELs' drains, say), then the end of its stream.
    if !tracker
        .close_event_streams()
        .ended_within(EVENT_STREAMS_STOP)
        .await
    {
        warn!(
            "an event stream did not take the last events within {EVENT_STREAMS_STOP:?}; \
             stopping without it"
        );
    }
    releaser.abort();
    let _ = releaser.await;
    metrics.readiness.set_started(false);
    // The agent's descriptors close on exit: a pin someone removed must be back before that,
    // or its link detaches and its map is not found by the next agent. Done after the last
    // verification pass has ended (no two looks at the pins at once) and while this agent
    // still holds the bpffs_dir lock (the tracker's datapath holds it): a successor started
    // meanwhile is refused the directory, so these pins are never put over its own.
    let _ = verifier.stop.send(true);
    if tokio::time::timeout(VERIFIER_STOP, verifier.task)
        .await
        .is_err()
    {
        warn!(
            "the datapath verification did not end within {VERIFIER_STOP:?}; checking the pins \
             beside it"
        );
    }
    let restored = held_pins::restore(&pins_root);
    held_pins::report(&restored);
    // What is still unsaved; the datapath keeps enforcing through its pins.
    if let Err(reason) = durable.persist(tracker.journaled()) {
        error!("journal: the last changes were not saved at shutdown ({reason})");
    }
    let unrestored = restored.iter().filter(|r| r.outcome.is_err()).count();
    crate::datapath::bpffs::say_at_stop(&pins_root, unrestored);
    Ok(())
}
