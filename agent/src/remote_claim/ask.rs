//! The task that asks: one question at a time, each answered within [`ANSWER_WITHIN`].

use std::{collections::HashMap, future::Future, path::PathBuf, sync::Arc, time::Duration};

use log::{debug, warn};
use tokio::{sync::mpsc, time::Instant};

use super::{Answer, Question, RemoteClaimMetrics, ANSWER_WITHIN, PRESENT_FOR};
use crate::{
    publish::{pod_present, Backoff, CachedClient, WriteError, REQUEST_TIMEOUT},
    registry::{PodRef, PodStanding},
};

/// Pods remembered as present at most; past it, the expired are forgotten first.
const MAX_REMEMBERED: usize = 4096;
/// How often a kind of answer that keeps coming is logged (each is counted).
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Where pods are looked up.
pub trait PodLookup {
    /// Whether `pod` is in the API server: the same name and, when `pod` has one, the same uid
    /// (a pod made again under its name, a StatefulSet's, is another pod).
    fn present(&mut self, pod: &PodRef) -> impl Future<Output = Result<bool, WriteError>> + Send;
}

/// The API server, through a client made again when its credentials change.
pub struct KubePods {
    client: CachedClient,
}

impl KubePods {
    pub fn new(kubeconfig: Option<PathBuf>) -> Self {
        Self {
            client: CachedClient::new(kubeconfig, REQUEST_TIMEOUT),
        }
    }
}

impl PodLookup for KubePods {
    async fn present(&mut self, pod: &PodRef) -> Result<bool, WriteError> {
        let client = self.client.get().await?;
        let present = pod_present(&client, &pod.namespace, &pod.name, pod.uid.as_deref()).await;
        if let Err(failure) = &present {
            self.client.after_failure(failure);
        }
        present
    }
}

/// Answers each question `asked` brings through `lookup`, sending the answers to the owner
/// loop; ends when either queue closes.
pub async fn run<L: PodLookup>(
    mut lookup: L,
    mut asked: mpsc::Receiver<Question>,
    answers: mpsc::Sender<Answer>,
    metrics: Arc<RemoteClaimMetrics>,
) {
    let mut present: HashMap<PodRef, Instant> = HashMap::new();
    let mut logged = Logged::default();
    while let Some(Question { addr, holder }) = asked.recv().await {
        let standing = match holder.pod() {
            // The lifecycle asks only about holders that name their pod.
            None => PodStanding::Unknown,
            Some(pod) => {
                let now = Instant::now();
                if present.get(pod).is_some_and(|until| *until > now) {
                    PodStanding::Present
                } else {
                    let standing = ask_within(&mut lookup, pod, ANSWER_WITHIN, &mut logged).await;
                    if standing == PodStanding::Present {
                        if present.len() >= MAX_REMEMBERED {
                            present.retain(|_, until| *until > now);
                        }
                        if present.len() < MAX_REMEMBERED {
                            present.insert(pod.clone(), now + PRESENT_FOR);
                        }
                    } else {
                        present.remove(pod);
                    }
                    standing
                }
            }
        };
        metrics.answered(standing);
        logged.answer(addr, &holder, standing);
        if answers
            .send(Answer {
                addr,
                holder,
                standing,
            })
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Asks `lookup` about `pod` until it answers, retrying failures with the shared backoff;
/// `Unknown` once `within` has passed.
async fn ask_within<L: PodLookup>(
    lookup: &mut L,
    pod: &PodRef,
    within: Duration,
    logged: &mut Logged,
) -> PodStanding {
    let deadline = Instant::now() + within;
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
    loop {
        match tokio::time::timeout_at(deadline, lookup.present(pod)).await {
            Ok(Ok(true)) => return PodStanding::Present,
            Ok(Ok(false)) => return PodStanding::Gone,
            Ok(Err(e)) => logged.failure(pod, &e),
            Err(_) => return PodStanding::Unknown,
        }
        let delay = backoff.next_delay();
        if Instant::now() + delay >= deadline {
            return PodStanding::Unknown;
        }
        tokio::time::sleep(delay).await;
    }
}

/// When each kind of log line was last written: a flood of forged announcements or an API
/// server that keeps failing is one WARN a minute, every answer counted in the metrics.
#[derive(Default)]
struct Logged {
    present: Option<Instant>,
    unknown: Option<Instant>,
    failure: Option<Instant>,
}

fn due(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < LOG_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

impl Logged {
    fn answer(
        &mut self,
        addr: std::net::IpAddr,
        holder: &crate::registry::Holder,
        standing: PodStanding,
    ) {
        let pod = holder
            .pod()
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .unwrap_or_default();
        match standing {
            PodStanding::Gone => {
                debug!("remote claim of {addr}: pod {pod} is gone, its holder here is fenced")
            }
            PodStanding::Present if due(&mut self.present) => warn!(
                "remote claim of {addr} while its holder's pod {pod} is still in the API server: \
                 not fenced (a double allocation, or a forged announcement on the uplink); \
                 reported as a remote_claim conflict (further ones counted in \
                 ipq_remote_claim_checks_total{{answer=\"present\"}})"
            ),
            PodStanding::Unknown if due(&mut self.unknown) => warn!(
                "remote claim of {addr}: the API server did not say within {ANSWER_WITHIN:?} \
                 whether pod {pod} is still there; its holder here is fenced on the \
                 announcement's word (further ones counted in \
                 ipq_remote_claim_checks_total{{answer=\"unknown\"}})"
            ),
            PodStanding::Present | PodStanding::Unknown => {}
        }
    }

    fn failure(&mut self, pod: &PodRef, error: &WriteError) {
        if due(&mut self.failure) {
            warn!(
                "asking about pod {}/{} for a remote claim: {}",
                pod.namespace, pod.name, error.message
            );
        }
    }
}
