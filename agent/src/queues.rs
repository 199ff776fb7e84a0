//! The agent's bounded queues between its threads and tasks and the owner loop, what each does
//! when full, and the one counter that says how often that happened
//! (`ipq_queue_overflows_total{queue}`).
//!
//! Every queue is bounded: a flood (the kernel's notifications, a worker faster than the loop)
//! costs counted items or a resync, never the agent's heap. Four rules, chosen per queue:
//!
//! - **Resync** ([`forward_or_resync`]): items that only say where to look (netlink events, TC
//!   notices) are dropped while the queue is full and folded into one resync item (a netlink
//!   dump, a look at every hook) that takes the next free slot. Nothing is missed: the resync
//!   looks after every dropped item happened.
//! - **Wait** ([`send_or_wait`]): a worker thread's reports (attach, hygiene) wait for room;
//!   the worker pauses, never the owner loop, and nothing is lost.
//! - **Merge**: journal commits waiting for a flush that hangs merge into the newest one
//!   (a flush covers every commit before it); the address table's writes on their way to the
//!   verification's mirror keep the last of each key.
//! - **Drop** (reuse hygiene's jobs, the kernel's conflict samples): what cannot wait and has
//!   nothing to resync from is dropped and counted, and whoever waits for it is told.
//!   (Conflict samples are counted as the kernel's ring counts its own,
//!   `ipq_events_lost_total{source="queue"}`.)

use futures::{Stream, StreamExt as _};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use strum::VariantArray as _;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::series::registered;

/// The bounded queues that count their overflows (the `queue` label).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum Queue {
    /// Netlink link, route, address and neighbour events: resync (a fresh dump).
    NetlinkEvents,
    /// TC notifications that may concern ipq's hooks: resync (a look at every hook).
    TcNotices,
    /// The attach workers' reports: the worker waits.
    AttachReports,
    /// Reuse hygiene's reports: the worker waits.
    HygieneReports,
    /// Reuse hygiene's jobs: dropped, the address not cleaned (alerted on; a claim waiting for
    /// it is told).
    HygieneJobs,
    /// Journal commits waiting for their flush (a hung disk): a new one takes the newest's
    /// place, so the generation known saved lags until the flush reports.
    JournalCommits,
    /// The address table's writes on their way to the verification's mirror: past the bound
    /// each takes the place of the last of its key (the mirror ends up the same).
    MapWrites,
    /// Keys of map writes the bpf() watcher reported, on their way to the owner loop's look
    /// at each: dropped, and the whole maps compared instead (a few tens of ms later).
    ReportedKeys,
}

/// `ipq_queue_overflows_total{queue}`. Made before the metrics registry exists (the netlink
/// subscription precedes the datapath's load) and registered with it.
#[derive(Clone, Debug)]
pub struct Overflows(IntCounterVec);

impl Overflows {
    pub fn new() -> Result<Self, prometheus::Error> {
        let counter = IntCounterVec::new(
            Opts::new(
                "ipq_queue_overflows_total",
                "Items that found one of the agent's bounded queues full, by queue. What became \
                 of them is the queue's rule: netlink_events and tc_notices were dropped and \
                 folded into one resync (a netlink dump; a look at every hook), so nothing was \
                 missed; attach_reports and hygiene_reports waited (their worker paused); \
                 hygiene_jobs were dropped, leaving an address's old conntrack and neighbour \
                 state in place (a claim waiting for it is told); journal_commits waiting for \
                 a hung flush were merged into the newest (saved later, nothing lost); \
                 map_writes on their way to the verification's mirror took the place of the \
                 last of their key (nothing lost); reported_keys of other processes' map \
                 writes were dropped and the whole maps compared instead (found later, not \
                 missed).",
            ),
            &["queue"],
        )?;
        for &queue in Queue::VARIANTS {
            counter.with_label_values(&[queue.as_ref()]).inc_by(0);
        }
        Ok(Self(counter))
    }

    /// Registers the family in the agent's registry.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registered(registry, self.0.clone()).map(drop)
    }

    /// The counter of one queue, for its producer to keep.
    pub fn of(&self, queue: Queue) -> IntCounter {
        self.0.with_label_values(&[queue.as_ref()])
    }
}

/// Which side of a forwarder ended it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The source ran dry (its socket closed); an owed resync was delivered first.
    Source,
    /// The owner loop dropped its receiver (the agent is stopping).
    Loop,
}

/// Forwards `items` into `tx` until either side ends, and says which. An item that finds `tx`
/// full is dropped and counted in `overflows`, and `resync()` is owed: it is sent as soon as a
/// slot frees, while the items that arrive meanwhile are read (so the kernel's socket does not
/// overrun for the loop's slowness) and dropped too, each counted, since the resync covers
/// them. Once `items` ends, an owed resync is still delivered.
pub async fn forward_or_resync<T>(
    items: impl Stream<Item = T>,
    tx: mpsc::Sender<T>,
    resync: impl Fn() -> T,
    overflows: IntCounter,
) -> Ended {
    let mut items = std::pin::pin!(items);
    loop {
        let Some(item) = items.next().await else {
            return Ended::Source;
        };
        match tx.try_send(item) {
            Ok(()) => continue,
            Err(TrySendError::Closed(_)) => return Ended::Loop,
            Err(TrySendError::Full(_)) => overflows.inc(),
        }
        // A resync is owed: wait for room, reading and dropping what comes meanwhile.
        loop {
            tokio::select! {
                biased;
                permit = tx.reserve() => match permit {
                    Ok(permit) => {
                        permit.send(resync());
                        break;
                    }
                    Err(_) => return Ended::Loop,
                },
                item = items.next() => match item {
                    Some(_) => overflows.inc(),
                    None => {
                        return match tx.reserve().await {
                            Ok(permit) => {
                                permit.send(resync());
                                Ended::Source
                            }
                            Err(_) => Ended::Loop,
                        };
                    }
                },
            }
        }
    }
}

/// The owner loop is gone: nobody reads reports any more.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed;

/// Sends `item` from a worker thread (never from the runtime), waiting for room if the queue
/// is full; a wait is counted in `overflows`. The worker pauses, the owner loop never does.
pub fn send_or_wait<T>(
    tx: &mpsc::Sender<T>,
    item: T,
    overflows: &IntCounter,
) -> Result<(), Closed> {
    match tx.try_send(item) {
        Ok(()) => Ok(()),
        Err(TrySendError::Closed(_)) => Err(Closed),
        Err(TrySendError::Full(item)) => {
            overflows.inc();
            tx.blocking_send(item).map_err(|_| Closed)
        }
    }
}

#[cfg(test)]
mod tests;
