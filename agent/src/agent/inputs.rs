//! Everything the owner loop reacts to, as one type: each source's queue is read here, a burst
//! taken whole (one journal save and one gauge update per burst, not per item), and handed to
//! the loop as one [`Input`].

use std::time::Duration;

use ipq_common::sample::ConflictSample;
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
    sync::mpsc,
};

use super::{spool_replay::SpooledDels, AgentError};
use crate::{
    api::command::Command,
    datapath::{
        attach::{tc_watch::TcNotice, JobReport},
        bpf_watch::ReportedKey,
        verify::Verification,
    },
    hygiene,
    journal::Synced,
    netlink::NetEvent,
    remote_claim,
    tracker::Observed,
};

/// API requests answered per journal save at most: a burst of CNI ADDs shares one fsync.
pub(super) const MAX_REQUEST_BURST: usize = 256;

/// Items of any other source taken in one input at most: a source that never runs dry must
/// not keep the loop from its tick or from the other sources.
const MAX_BURST: usize = 4096;

/// Why the owner loop ends: SIGTERM or SIGINT, or the netlink subscription closed.
#[derive(Debug)]
pub(super) struct Stop(pub(super) &'static str);

/// One thing the owner loop reacts to.
pub(super) enum Input {
    /// What the node, the kernel, the workers and time said: the tracker's. `resync` when
    /// netlink lost events (the socket's buffer or the queue overflowed) and a fresh dump must
    /// follow these.
    Observed { what: Observed, resync: bool },
    /// API requests, answered once what they changed is saved.
    Commands(Vec<Command>),
    /// Journal flushes that finished off the loop.
    Synced(Vec<Synced>),
    /// DELs ipq-cni spooled, read off the loop, to drain.
    Spooled(SpooledDels),
}

impl From<Observed> for Input {
    fn from(what: Observed) -> Self {
        Input::Observed {
            what,
            resync: false,
        }
    }
}

/// The queues the owner loop reads. A source that has no sender left (the bpf() watcher on a
/// kernel without it) never fires.
pub(super) struct Inputs {
    sigterm: Signal,
    sigint: Signal,
    net: mpsc::Receiver<NetEvent>,
    tc_notices: mpsc::Receiver<TcNotice>,
    verifications: mpsc::Receiver<Verification>,
    reported_keys: mpsc::Receiver<Vec<ReportedKey>>,
    attach_reports: mpsc::Receiver<JobReport>,
    hygiene_reports: mpsc::Receiver<hygiene::Report>,
    samples: mpsc::Receiver<ConflictSample>,
    remote_claim_answers: mpsc::Receiver<remote_claim::Answer>,
    commands: mpsc::Receiver<Command>,
    synced: mpsc::Receiver<Synced>,
    spooled: mpsc::Receiver<SpooledDels>,
}

/// The queues of the node and the datapath, gathered through start-up (the netlink
/// subscription before the dump, the rings when the programs load, the attach workers' and the
/// verification's when they start) until the loop reads them with the rest ([`Inputs`]).
pub(super) struct DatapathInputs {
    pub(super) net: mpsc::Receiver<NetEvent>,
    pub(super) samples: mpsc::Receiver<ConflictSample>,
    pub(super) tc_notices: mpsc::Receiver<TcNotice>,
    pub(super) attach_reports: mpsc::Receiver<JobReport>,
    pub(super) verifications: mpsc::Receiver<Verification>,
    pub(super) reported_keys: mpsc::Receiver<Vec<ReportedKey>>,
}

impl DatapathInputs {
    /// Everything the loop reads: these, the stop signals, hygiene's reports, the API's
    /// requests, the journal's flushes and the CNI spool's DELs.
    pub(super) fn with(
        self,
        (sigterm, sigint): (Signal, Signal),
        hygiene_reports: mpsc::Receiver<hygiene::Report>,
        remote_claim_answers: mpsc::Receiver<remote_claim::Answer>,
        commands: mpsc::Receiver<Command>,
        (synced, spooled): (mpsc::Receiver<Synced>, mpsc::Receiver<SpooledDels>),
    ) -> Inputs {
        Inputs {
            sigterm,
            sigint,
            net: self.net,
            tc_notices: self.tc_notices,
            verifications: self.verifications,
            reported_keys: self.reported_keys,
            attach_reports: self.attach_reports,
            hygiene_reports,
            samples: self.samples,
            remote_claim_answers,
            commands,
            synced,
            spooled,
        }
    }
}

/// The signals the agent stops on, installed before the loop starts.
pub(super) fn stop_signals() -> Result<(Signal, Signal), AgentError> {
    let installed = |kind| {
        signal(kind).map_err(|source| AgentError::Io {
            what: "installing signal handlers",
            source,
        })
    };
    Ok((
        installed(SignalKind::terminate())?,
        installed(SignalKind::interrupt())?,
    ))
}

/// `first` and whatever else `queue` holds now, at most `limit` in all.
fn burst<T>(first: T, queue: &mut mpsc::Receiver<T>, limit: usize) -> Vec<T> {
    let mut items = vec![first];
    while items.len() < limit {
        match queue.try_recv() {
            Ok(item) => items.push(item),
            Err(_) => break,
        }
    }
    items
}

impl Inputs {
    /// The next input, or [`Observed::Tick`] once `delay` passed with none; `Err` when the agent
    /// is to stop.
    pub(super) async fn next(&mut self, delay: Duration) -> Result<Input, Stop> {
        let input = tokio::select! {
            _ = self.sigterm.recv() => return Err(Stop("SIGTERM")),
            _ = self.sigint.recv() => return Err(Stop("SIGINT")),
            event = self.net.recv() => match event {
                None => return Err(Stop("the netlink subscription closed")),
                Some(first) => {
                    let mut events = burst(first, &mut self.net, MAX_BURST);
                    let before = events.len();
                    events.retain(|e| *e != NetEvent::Overrun);
                    let resync = events.len() != before;
                    Input::Observed { what: Observed::Net(events), resync }
                }
            },
            Some(notice) = self.tc_notices.recv() => {
                Observed::TcNotices(burst(notice, &mut self.tc_notices, MAX_BURST)).into()
            }
            Some(verification) = self.verifications.recv() => {
                Observed::Verification(Box::new(verification)).into()
            }
            Some(keys) = self.reported_keys.recv() => Observed::ReportedKeys(keys).into(),
            Some(report) = self.attach_reports.recv() => {
                Observed::AttachReports(burst(report, &mut self.attach_reports, MAX_BURST)).into()
            }
            Some(report) = self.hygiene_reports.recv() => {
                Observed::HygieneReports(burst(report, &mut self.hygiene_reports, MAX_BURST))
                    .into()
            }
            Some(sample) = self.samples.recv() => {
                Observed::Samples(burst(sample, &mut self.samples, MAX_BURST)).into()
            }
            Some(answer) = self.remote_claim_answers.recv() => {
                let answers = burst(answer, &mut self.remote_claim_answers, MAX_BURST);
                Observed::RemoteClaimAnswers(answers).into()
            }
            Some(command) = self.commands.recv() => {
                Input::Commands(burst(command, &mut self.commands, MAX_REQUEST_BURST))
            }
            Some(report) = self.synced.recv() => {
                Input::Synced(burst(report, &mut self.synced, MAX_BURST))
            }
            Some(dels) = self.spooled.recv() => Input::Spooled(dels),
            _ = tokio::time::sleep(delay) => Observed::Tick.into(),
        };
        Ok(input)
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    /// Inputs whose every queue is empty, with the senders of the netlink and command queues.
    fn inputs() -> (Inputs, mpsc::Sender<NetEvent>, mpsc::Sender<Command>) {
        let (net_tx, net) = mpsc::channel(64);
        let (command_tx, commands) = mpsc::channel(1024);
        let datapath = DatapathInputs {
            net,
            samples: mpsc::channel(1).1,
            tc_notices: mpsc::channel(1).1,
            attach_reports: mpsc::channel(1).1,
            verifications: mpsc::channel(1).1,
            reported_keys: mpsc::channel(1).1,
        };
        let inputs = datapath.with(
            stop_signals().unwrap(),
            mpsc::channel(1).1,
            mpsc::channel(1).1,
            commands,
            (mpsc::channel(1).1, mpsc::channel(1).1),
        );
        (inputs, net_tx, command_tx)
    }

    fn route(n: u8) -> NetEvent {
        NetEvent::HostRoute {
            addr: IpAddr::from([10, 0, 0, n]),
            ifindex: 7,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_netlink_burst_is_one_input_and_an_overrun_in_it_asks_for_a_resync() {
        let (mut inputs, net, _commands) = inputs();
        for event in [route(1), NetEvent::Overrun, route(2)] {
            net.send(event).await.unwrap();
        }
        match inputs.next(Duration::from_secs(1)).await {
            Ok(Input::Observed {
                what: Observed::Net(events),
                resync,
            }) => {
                assert_eq!(events, vec![route(1), route(2)]);
                assert!(resync);
            }
            _ => panic!("the queued events, as one input"),
        }
        assert!(
            matches!(
                inputs.next(Duration::from_secs(1)).await,
                Ok(Input::Observed {
                    what: Observed::Tick,
                    ..
                })
            ),
            "nothing queued: the tick"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_taken_at_most_a_bursts_worth_at_a_time() {
        let (mut inputs, _net, commands) = inputs();
        for _ in 0..MAX_REQUEST_BURST + 1 {
            commands
                .send(Command::Subscribe(tokio::sync::oneshot::channel().0))
                .await
                .unwrap();
        }
        let taken = |input| match input {
            Ok(Input::Commands(commands)) => commands.len(),
            _ => panic!("the queued requests"),
        };
        assert_eq!(
            taken(inputs.next(Duration::from_secs(1)).await),
            MAX_REQUEST_BURST
        );
        assert_eq!(taken(inputs.next(Duration::from_secs(1)).await), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_netlink_subscription_stops_the_loop() {
        let (mut inputs, net, _commands) = inputs();
        drop(net);
        assert!(matches!(
            inputs.next(Duration::from_secs(1)).await,
            Err(Stop(_))
        ));
    }

    #[tokio::test]
    async fn a_burst_takes_what_is_queued_up_to_its_limit_and_leaves_the_rest() {
        let (tx, mut rx) = mpsc::channel(16);
        for n in 1..=5 {
            tx.send(n).await.unwrap();
        }
        let first = rx.recv().await.unwrap();
        assert_eq!(burst(first, &mut rx, 3), vec![1, 2, 3]);
        let first = rx.recv().await.unwrap();
        assert_eq!(burst(first, &mut rx, 3), vec![4, 5]);
    }
}
