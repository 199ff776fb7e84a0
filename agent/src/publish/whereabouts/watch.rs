//! The watch of the reservations ipq watches (by the label naming this node), through kube's
//! `watcher`: a list, then a watch from the list's version; a watch that expires (410 Gone: the
//! API server's history was compacted while the watch was behind, or the API server restarted)
//! is listed again. Its failures are retried with ipq's jittered [`Backoff`], like every other
//! call to the API server. What it sees goes to the projection as [`StoreEvent`]s: each list
//! whole, once complete ([`StoreEvent::Listed`]: the projection never acts on part of one),
//! each deletion, each failure (counted; the watcher goes on by itself).
//!
//! The watch is started again (a fresh list, with a new client) when its credentials' files
//! change or are refused (a rotated CA, certificate or token), and when the API server answers
//! again after an outage: at once then, rather than at the end of a backoff that has grown to
//! tens of seconds.

use std::{net::IpAddr, pin::pin, time::Duration};

use futures::StreamExt as _;
use kube::{
    api::DynamicObject,
    runtime::{watcher, WatchStreamExt as _},
    Client,
};
use log::debug;
use tokio::sync::{mpsc, watch};

use super::{
    super::{
        api_health::{ApiHealth, RETURN_SPREAD},
        client::CachedClient,
        kube_sink::failure,
        Backoff, FailureReason, WriteError,
    },
    kube_store::{hold_of, reservations, ADDRESS_ANNOTATION, KIND, NODE_LABEL},
    node_label_value, Hold, StoreEvent, Target,
};

/// How long a watch lasts before the API server ends it (the watcher then watches again from
/// where it was; its own idle timeout is a little longer, so that a dead connection is noticed).
pub const WATCH_SECONDS: u32 = 290;
/// The watcher's retries, and the watch's restarts: as the writers'.
const FIRST_RETRY: Duration = Duration::from_millis(500);
const MAX_RETRY: Duration = Duration::from_secs(30);

/// Why a watch was started again.
enum Restart {
    /// Its credentials' files changed, or the API server refused them.
    Credentials,
    /// The API server answers again after the watch failed.
    ApiReturned,
    /// A watch from the last version seen was refused as expired (410 Gone on the request
    /// itself, not as an event of the stream: kube's watcher would ask for that version again
    /// and again).
    Expired,
    /// The watcher's stream ended (it does not: kept as a restart, never a silent stop).
    Ended,
}

/// Lists and watches the reservations of `target`'s node, and reports what it sees on
/// `events`, until the projection's end of `events` is dropped.
pub async fn follow(
    target: Target,
    mut clients: CachedClient,
    health: ApiHealth,
    events: mpsc::Sender<StoreEvent>,
) {
    let mut restarts = Backoff::new(FIRST_RETRY, MAX_RETRY);
    let mut returns = health.returns();
    loop {
        let client = match clients.get().await {
            Ok(client) => client,
            Err(e) => {
                if events.send(StoreEvent::Failed(e)).await.is_err() {
                    return;
                }
                tokio::time::sleep(restarts.next_delay()).await;
                continue;
            }
        };
        let watch = Watch {
            target: &target,
            clients: &mut clients,
            returns: &mut returns,
            events: &events,
            restarts: &mut restarts,
        };
        match watch.run(client).await {
            Some(Restart::Credentials) => {
                debug!("whereabouts reservations: credentials changed or refused, watching anew");
                tokio::time::sleep(restarts.next_delay()).await;
            }
            Some(Restart::ApiReturned) => {
                debug!("whereabouts reservations: the API server answers again, watching anew");
                tokio::time::sleep(restarts.up_to(RETURN_SPREAD)).await;
            }
            Some(reason @ (Restart::Expired | Restart::Ended)) => {
                let why = match reason {
                    Restart::Expired => "the watch expired",
                    _ => "the watcher ended",
                };
                debug!("whereabouts reservations: {why}, listing anew");
                tokio::time::sleep(restarts.next_delay()).await;
            }
            None => return,
        }
    }
}

/// One run of kube's watcher, with one client.
struct Watch<'a> {
    target: &'a Target,
    clients: &'a mut CachedClient,
    returns: &'a mut watch::Receiver<u64>,
    events: &'a mpsc::Sender<StoreEvent>,
    restarts: &'a mut Backoff,
}

impl Watch<'_> {
    /// Until the watch must start again (`None`: the projection is gone).
    async fn run(mut self, client: Client) -> Option<Restart> {
        let api = reservations(client, &self.target.namespace);
        let config = watcher::Config::default()
            .labels(&format!(
                "{NODE_LABEL}={}",
                node_label_value(&self.target.node)
            ))
            .timeout(WATCH_SECONDS);
        let stream = watcher(api, config).backoff(Backoff::new(FIRST_RETRY, MAX_RETRY));
        let mut stream = pin!(stream);
        // The list being received (between `Init` and `InitDone`).
        let mut listing: Vec<(IpAddr, Hold)> = Vec::new();
        let mut failing = false;
        loop {
            tokio::select! {
                item = stream.next() => {
                    // The watcher never ends, and ipq's backoff never gives up.
                    let Some(item) = item else { return Some(Restart::Ended) };
                    match item {
                        Ok(event) => {
                            failing = false;
                            if !self.seen(event, &mut listing).await {
                                return None;
                            }
                        }
                        Err(watcher::Error::WatchStartFailed(kube::Error::Api(status)))
                            if status.code == 410 =>
                        {
                            return Some(Restart::Expired);
                        }
                        Err(e) => {
                            let Some(failure) = failure_of(e) else { continue };
                            if !failing {
                                // Only a return after this failure restarts the watch.
                                self.returns.borrow_and_update();
                                failing = true;
                            }
                            let refused = failure.reason == FailureReason::Config;
                            self.events.send(StoreEvent::Failed(failure)).await.ok()?;
                            if refused || self.clients.files_changed() {
                                return Some(Restart::Credentials);
                            }
                        }
                    }
                }
                returned = self.returns.changed(), if failing => {
                    if returned.is_ok() {
                        return Some(Restart::ApiReturned);
                    }
                }
            }
        }
    }

    /// Reports `event`; `false` when the projection is gone.
    async fn seen(
        &mut self,
        event: watcher::Event<DynamicObject>,
        listing: &mut Vec<(IpAddr, Hold)>,
    ) -> bool {
        let report = match event {
            watcher::Event::Init => {
                listing.clear();
                return true;
            }
            watcher::Event::InitApply(object) => {
                listing.extend(listed(&self.target.node, &object));
                return true;
            }
            watcher::Event::InitDone => {
                self.restarts.reset();
                StoreEvent::Listed(std::mem::take(listing))
            }
            watcher::Event::Delete(object) => match object.metadata.uid {
                Some(uid) => StoreEvent::Deleted(uid),
                None => return true,
            },
            // Made or labelled by ipq (its call's answer says so), or changed by whereabouts
            // (the spec is whereabouts'): nothing the projection acts on.
            watcher::Event::Apply(_) => return true,
        };
        self.events.send(report).await.is_ok()
    }
}

/// The address and hold of a listed reservation (ipq's own or one it labelled).
pub fn listed(node: &str, object: &DynamicObject) -> Option<(IpAddr, Hold)> {
    let addr = object
        .metadata
        .annotations
        .as_ref()?
        .get(ADDRESS_ANNOTATION)?
        .parse()
        .ok()?;
    Some((addr, hold_of(node, object)?))
}

/// A watcher error as a failure; `None` for an expired watch (410 Gone), which the watcher
/// answers with a fresh list, and which is no failure of the API server.
fn failure_of(e: watcher::Error) -> Option<WriteError> {
    let what = format!("watching ipq's {KIND}s");
    match e {
        watcher::Error::WatchError(status) if status.code == 410 => {
            debug!("{what}: expired ({}), listing again", status.message);
            None
        }
        watcher::Error::WatchError(status) => Some(WriteError {
            reason: if status.code == 401 {
                FailureReason::Config
            } else {
                FailureReason::Refused
            },
            message: format!("{what}: {}", status.message),
        }),
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => Some(failure(&what, e)),
        watcher::Error::NoResourceVersion => Some(WriteError {
            reason: FailureReason::Refused,
            message: format!("{what}: no resourceVersion in the answer"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use futures::stream;
    use tokio::time::Instant;

    use super::*;

    /// The moments (from the start) at which kube's watcher, wrapped as [`Watch::run`] wraps
    /// it, tries again: a stream that fails at every poll, with ipq's backoff.
    async fn retries(count: usize) -> Vec<Duration> {
        let start = Instant::now();
        let failing = stream::repeat_with(|| Err::<(), ()>(()));
        let mut retried = pin!(failing.backoff(Backoff::new(FIRST_RETRY, MAX_RETRY)));
        let mut at = Vec::new();
        for _ in 0..count {
            retried.next().await;
            at.push(start.elapsed());
        }
        at
    }

    /// Every node's watch fails at the same moment (the API server stopped): each waits the
    /// doubling delays with their random part, so two nodes' watchers do not come back in
    /// lockstep.
    #[tokio::test(start_paused = true)]
    async fn the_watchers_retries_back_off_with_jitter_and_two_agents_differ() {
        let (a, b) = (retries(8).await, retries(8).await);
        let mut step = FIRST_RETRY;
        for pair in a.windows(2) {
            let waited = pair[1] - pair[0];
            // The timer's resolution is a millisecond.
            assert!(
                waited >= step && waited <= step * 3 / 2 + Duration::from_millis(1),
                "waited {waited:?} for a step of {step:?}: {a:?}"
            );
            step = (step * 2).min(MAX_RETRY);
        }
        assert_ne!(a, b, "two agents' watchers retried at the same moments");
    }
}
