//! The asking task, against a lookup that answers as told (the API server's own answers are
//! the cluster tier's: `cluster/cross_node.rs`).

use std::{
    collections::VecDeque,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use super::*;
use crate::{
    publish::{FailureReason, WriteError},
    registry::PodRef,
};

/// What the lookup answers next, in order; past the script, `Hang`.
#[derive(Clone, Copy, Debug)]
enum Reply {
    Present,
    Absent,
    Fail,
    Hang,
}

#[derive(Clone, Default)]
struct Scripted {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    asked: Arc<Mutex<Vec<PodRef>>>,
}

impl Scripted {
    fn new(replies: &[Reply]) -> Self {
        let scripted = Self::default();
        scripted.replies.lock().unwrap().extend(replies);
        scripted
    }

    fn asked(&self) -> usize {
        self.asked.lock().unwrap().len()
    }
}

impl PodLookup for Scripted {
    fn present(
        &mut self,
        pod: &PodRef,
    ) -> impl std::future::Future<Output = Result<bool, WriteError>> + Send {
        self.asked.lock().unwrap().push(pod.clone());
        let reply = self
            .replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Reply::Hang);
        async move {
            match reply {
                Reply::Present => Ok(true),
                Reply::Absent => Ok(false),
                Reply::Fail => Err(WriteError {
                    reason: FailureReason::Unreachable,
                    message: "connection refused".into(),
                }),
                Reply::Hang => std::future::pending().await,
            }
        }
    }
}

fn holder(name: &str) -> Holder {
    Holder::new(5, "veth5").with_pod(PodRef {
        namespace: "default".into(),
        name: name.into(),
        uid: Some(format!("uid-{name}")),
    })
}

fn addr() -> IpAddr {
    "10.0.0.1".parse().unwrap()
}

fn metrics() -> Arc<RemoteClaimMetrics> {
    Arc::new(RemoteClaimMetrics::register(&prometheus::Registry::new()).unwrap())
}

async fn answer(asker: &Asker, answers: &mut mpsc::Receiver<Answer>, name: &str) -> PodStanding {
    asker.ask(addr(), holder(name));
    let answer = answers.recv().await.expect("an answer");
    assert_eq!((answer.addr, answer.holder), (addr(), holder(name)));
    answer.standing
}

#[tokio::test(start_paused = true)]
async fn a_pod_in_the_api_server_is_present_and_remembered_for_a_while() {
    let lookup = Scripted::new(&[Reply::Present, Reply::Absent]);
    let metrics = metrics();
    let (asker, mut answers) = start_with(lookup.clone(), metrics.clone());
    assert_eq!(
        answer(&asker, &mut answers, "web").await,
        PodStanding::Present
    );
    // A flood of announcements costs one lookup per pod per PRESENT_FOR.
    for _ in 0..10 {
        assert_eq!(
            answer(&asker, &mut answers, "web").await,
            PodStanding::Present
        );
    }
    assert_eq!(lookup.asked(), 1);
    tokio::time::advance(PRESENT_FOR + Duration::from_millis(1)).await;
    assert_eq!(answer(&asker, &mut answers, "web").await, PodStanding::Gone);
    assert_eq!(lookup.asked(), 2);
    assert_eq!(metrics.answers.with_label_values(&["present"]).get(), 11);
    assert_eq!(metrics.answers.with_label_values(&["gone"]).get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_not_in_the_api_server_is_gone() {
    let lookup = Scripted::new(&[Reply::Absent]);
    let (asker, mut answers) = start_with(lookup, metrics());
    assert_eq!(answer(&asker, &mut answers, "web").await, PodStanding::Gone);
}

#[tokio::test(start_paused = true)]
async fn failures_are_retried_until_an_answer() {
    let lookup = Scripted::new(&[Reply::Fail, Reply::Fail, Reply::Absent]);
    let (asker, mut answers) = start_with(lookup.clone(), metrics());
    let began = tokio::time::Instant::now();
    assert_eq!(answer(&asker, &mut answers, "web").await, PodStanding::Gone);
    assert_eq!(lookup.asked(), 3);
    assert!(began.elapsed() < ANSWER_WITHIN, "{:?}", began.elapsed());
}

#[tokio::test(start_paused = true)]
async fn no_answer_in_time_is_unknown() {
    for script in [vec![Reply::Hang], vec![Reply::Fail; 100]] {
        let lookup = Scripted::new(&script);
        let metrics = metrics();
        let (asker, mut answers) = start_with(lookup, metrics.clone());
        let began = tokio::time::Instant::now();
        assert_eq!(
            answer(&asker, &mut answers, "web").await,
            PodStanding::Unknown,
            "{script:?}"
        );
        assert!(began.elapsed() <= ANSWER_WITHIN, "{:?}", began.elapsed());
        assert_eq!(metrics.answers.with_label_values(&["unknown"]).get(), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_drops_the_question_counted() {
    let lookup = Scripted::new(&[]);
    let metrics = metrics();
    // Every lookup hangs; on this single-threaded runtime the task has not run yet, so the
    // queue takes QUEUE questions and the rest are dropped.
    let (asker, _answers) = start_with(lookup, metrics.clone());
    for _ in 0..QUEUE + 10 {
        asker.ask(addr(), holder("web"));
    }
    assert_eq!(metrics.dropped.get(), 10);
}
