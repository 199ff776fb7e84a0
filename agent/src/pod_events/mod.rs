//! Kubernetes Events on the pods involved (`events.k8s.io/v1`, `regarding` the Pod): a
//! conflict (early reuse, reuse in cool-down, duplicate source), a fence and a quarantine held
//! by stale traffic become an Event on each pod the CNI named (`K8S_POD_NAMESPACE`,
//! `K8S_POD_NAME`, `K8S_POD_UID`): the fenced pod gets `IpqFenced`, the new holder
//! `IpqEarlyReuse`, the pod that left a quarantined address `IpqQuarantineHeld`
//! ([`EventReason`]). `reportingController` is `ipq.dev/agent`, `reportingInstance` the node.
//!
//! The agent's loop only hands over what happened ([`Feed::send`]: one `try_send` on a channel
//! bounded to [`QUEUE`], O(1); a full queue drops and counts). The writer task off the loop
//! turns it into notices per pod, aggregates them per pod and reason, and writes at most one
//! Event create and then one series patch per [`Pacing::interval`] per series
//! ([`aggregate`]). Everything is counted (`ipq_events_*`); nothing on the loop waits for the
//! API server.

mod aggregate;
mod kube_events;
mod metrics;
mod notice;
mod writer;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, SystemTime},
};

use tokio::sync::mpsc;

pub use aggregate::{Aggregator, Pacing, Taken, Write};
pub use kube_events::{
    event_body, event_name, series_patch, EventSink, KubeEvents, SinkError, REPORTING_CONTROLLER,
};
pub use metrics::{DropCause, EventMetrics};
pub use notice::{EventReason, Happening, Notice, SeriesKey};

use crate::{
    api::views::Outcome,
    registry::{Conflict, Holder},
};

/// Happenings handed over and not yet taken by the writer, at most.
pub const QUEUE: usize = 1024;
/// Pod-and-reason series kept at most.
pub const MAX_SERIES: usize = 4096;
/// A series quiet this long is forgotten: the API server keeps Events an hour by default.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What the writer needs from the configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub node: String,
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Between two writes of one pod's Event of one reason at least.
    pub interval: Duration,
}

/// The agent loop's end.
pub struct Feed {
    happenings: mpsc::Sender<Happening>,
    metrics: Arc<EventMetrics>,
    writer: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Feed {
    /// Hands `happening` over when it names a pod and the queue has room; never waits. A full
    /// queue drops it, counted.
    pub fn send(&self, happening: Happening) {
        if !happening.names_a_pod() {
            return;
        }
        match self.happenings.try_send(happening) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.metrics.dropped(DropCause::QueueFull),
            // The writer stopped (it does not, short of a panic): nothing to count against.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// A conflict, with what its policy did.
    pub fn conflict(&self, conflict: &Conflict, outcome: Outcome) {
        self.send(Happening::Conflict {
            conflict: Box::new(conflict.clone()),
            outcome,
            at: SystemTime::now(),
        });
    }

    /// Traffic of `fenced` with `addr` was dropped; `holder` has the address now.
    pub fn fenced_traffic(&self, addr: std::net::IpAddr, fenced: &Holder, holder: Option<&Holder>) {
        if fenced.pod().is_some() {
            self.send(Happening::FencedTraffic {
                addr,
                fenced: fenced.clone(),
                holder: holder.cloned(),
                at: SystemTime::now(),
            });
        }
    }

    /// Traffic to `addr`, quarantined since `previous` left, arrived.
    pub fn stale_traffic(&self, addr: std::net::IpAddr, previous: &Holder) {
        if previous.pod().is_some() {
            self.send(Happening::StaleTraffic {
                addr,
                previous: previous.clone(),
                at: SystemTime::now(),
            });
        }
    }

    /// Spawns the writer on the current runtime.
    pub fn launch(&mut self) {
        if let Some(writer) = self.writer.take() {
            tokio::spawn(writer);
        }
    }
}

/// The Events' writer through `sink`, once [`Feed::launch`]ed.
pub fn start_with<S: EventSink + Send + 'static>(
    node: String,
    sink: S,
    pacing: Pacing,
    metrics: Arc<EventMetrics>,
) -> Feed {
    let (happenings, received) = mpsc::channel(QUEUE);
    let writer = writer::run(node, sink, received, pacing, metrics.clone());
    Feed {
        happenings,
        metrics,
        writer: Some(Box::pin(writer)),
    }
}

/// The Events' writer to the API server `settings` name, once [`Feed::launch`]ed.
pub fn start(settings: Settings, metrics: Arc<EventMetrics>) -> Feed {
    let sink = KubeEvents::new(settings.node.clone(), settings.kubeconfig);
    let pacing = Pacing {
        interval: settings.interval,
        max_series: MAX_SERIES,
        forget_after: FORGET_AFTER,
    };
    start_with(settings.node, sink, pacing, metrics)
}

#[cfg(test)]
mod tests;
