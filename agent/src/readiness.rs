//! Whether the agent is ready: what `/readyz` answers, `ipq status` shows and `ipq_ready`
//! exports, decided in one place. Ready means started (datapath loaded, registry recovered and
//! reconciled, every configured interface attached once) and nothing blocking since: no
//! interface left unprotected, the pins kept, every datapath write through, every change
//! saved.

use std::{collections::BTreeMap, sync::Mutex};

use prometheus::IntGauge;

/// Why the agent is not ready.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    #[error("datapath not attached or registry not reconciled yet (starting)")]
    Starting,
    /// Configured interfaces without ipq's program, each named with its last error.
    #[error("{0}")]
    Unprotected(String),
    /// The pins under `bpffs_dir` cannot be kept: enforcement would end with this agent.
    #[error("{0}")]
    Pins(String),
    /// Datapath entries the kernel refused to write: the kernel does not enforce what the
    /// registry says for those addresses until a retry goes through.
    #[error("{0}")]
    DatapathWrites(String),
    /// Changes cannot be saved in `state_dir` (a full or read-only disk): requests that make
    /// them are answered `unavailable`.
    #[error("changes cannot be saved: {0}")]
    Unsaved(String),
}

/// What readiness is decided from.
#[derive(Debug, Default)]
struct State {
    started: bool,
    /// Why the agent is not ready although started: interfaces left unprotected.
    blocker: Option<String>,
    /// Why the pins under `bpffs_dir` cannot be kept, when they cannot (the verification says).
    pins: Option<String>,
    /// Which datapath writes are pending, while any is.
    writes: Option<String>,
    /// Why changes cannot be saved, by what cannot save them (the journal, ipq-ipam's
    /// releases), while any cannot.
    unsaved: BTreeMap<&'static str, String>,
}

impl State {
    fn check(&self) -> Result<(), NotReady> {
        if !self.started {
            return Err(NotReady::Starting);
        }
        if let Some(problem) = &self.pins {
            return Err(NotReady::Pins(problem.clone()));
        }
        if let Some(pending) = &self.writes {
            return Err(NotReady::DatapathWrites(pending.clone()));
        }
        if !self.unsaved.is_empty() {
            let reasons: Vec<String> = self
                .unsaved
                .iter()
                .map(|(what, reason)| format!("{what}: {reason}"))
                .collect();
            return Err(NotReady::Unsaved(reasons.join("; ")));
        }
        match &self.blocker {
            Some(blocker) => Err(NotReady::Unprotected(blocker.clone())),
            None => Ok(()),
        }
    }
}

/// The agent's readiness, set by the owner loop and by ipq-ipam's release store's thread, read
/// by the listeners. One lock holds the state and is held while the gauge is set: with the
/// gauge set after the lock was let go, two setters on two threads could leave it at the older
/// answer (0 while `/readyz` says 200) until the next change.
#[derive(Debug)]
pub struct Readiness {
    state: Mutex<State>,
    /// `ipq_ready`, kept equal to [`Readiness::check`] being `Ok`.
    gauge: IntGauge,
}

impl Readiness {
    /// Not started, shown on `gauge`.
    pub fn new(gauge: IntGauge) -> Self {
        gauge.set(0);
        Self {
            state: Mutex::new(State::default()),
            gauge,
        }
    }

    /// Changes the state and sets the gauge from it, under the one lock.
    fn change(&self, edit: impl FnOnce(&mut State)) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        edit(&mut state);
        self.gauge.set(i64::from(state.check().is_ok()));
    }

    /// Marks the start-up done (or the agent stopping).
    pub fn set_started(&self, started: bool) {
        self.change(|s| s.started = started);
    }

    /// Sets (or clears) what keeps the agent from being ready although started.
    pub fn set_blocker(&self, blocker: Option<String>) {
        self.change(|s| s.blocker = blocker);
    }

    /// Sets (or clears) why the pins under `bpffs_dir` cannot be kept.
    pub fn set_pins_problem(&self, problem: Option<String>) {
        self.change(|s| s.pins = problem);
    }

    /// Sets (or clears) which datapath writes the kernel refused and are retried.
    pub fn set_writes_pending(&self, pending: Option<String>) {
        self.change(|s| s.writes = pending);
    }

    /// Sets (or clears) why `what` (the journal, ipq-ipam's releases) cannot save changes.
    pub fn set_unsaved(&self, what: &'static str, reason: Option<String>) {
        self.change(|s| match reason {
            Some(reason) => {
                s.unsaved.insert(what, reason);
            }
            None => {
                s.unsaved.remove(what);
            }
        });
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), NotReady> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).check()
    }

    pub fn is_ready(&self) -> bool {
        self.check().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_once_started_and_while_nothing_blocks_and_the_gauge_follows() {
        let gauge = IntGauge::new("ipq_ready", "test").unwrap();
        let readiness = Readiness::new(gauge.clone());
        assert_eq!(readiness.check(), Err(NotReady::Starting));
        assert_eq!(gauge.get(), 0);
        readiness.set_started(true);
        assert_eq!(readiness.check(), Ok(()));
        assert_eq!(gauge.get(), 1);
        readiness.set_blocker(Some("vethpa (if7) failed: boom".into()));
        assert_eq!(
            readiness.check(),
            Err(NotReady::Unprotected("vethpa (if7) failed: boom".into()))
        );
        assert_eq!(gauge.get(), 0);
        readiness.set_blocker(None);
        assert!(readiness.is_ready());
        readiness.set_writes_pending(Some("datapath writes pending for 1 address".into()));
        assert_eq!(
            readiness.check(),
            Err(NotReady::DatapathWrites(
                "datapath writes pending for 1 address".into()
            ))
        );
        assert_eq!(gauge.get(), 0);
        readiness.set_writes_pending(None);
        assert!(readiness.is_ready());
        assert_eq!(gauge.get(), 1);
        readiness.set_unsaved(
            "journal",
            Some("No space left on device (os error 28)".into()),
        );
        readiness.set_unsaved("ipam releases", Some("ENOSPC".into()));
        assert_eq!(
            readiness.check().map_err(|e| e.to_string()),
            Err(
                "changes cannot be saved: ipam releases: ENOSPC; journal: No space left on \
                 device (os error 28)"
                    .into()
            )
        );
        assert_eq!(gauge.get(), 0);
        readiness.set_unsaved("journal", None);
        assert!(!readiness.is_ready(), "the releases still cannot be saved");
        readiness.set_unsaved("ipam releases", None);
        assert!(readiness.is_ready());
        assert_eq!(gauge.get(), 1);
        readiness.set_started(false);
        assert!(readiness
            .check()
            .unwrap_err()
            .to_string()
            .contains("starting"));
        assert_eq!(gauge.get(), 0);
    }

    /// Setters on several threads at once (the owner loop and the release store's thread):
    /// once they are done, the gauge is what `check` says. (The
    /// race this guards against, a gauge set after its lock was let go, needs a preemption in
    /// a window of a few instructions: this finds it only sometimes, never wrongly.)
    #[test]
    fn the_gauge_follows_setters_on_several_threads() {
        for _ in 0..20 {
            let gauge = IntGauge::new("ipq_ready", "test").unwrap();
            let readiness = std::sync::Arc::new(Readiness::new(gauge.clone()));
            readiness.set_started(true);
            let togglers: Vec<_> = ["journal", "ipam releases", "other"]
                .into_iter()
                .map(|what| {
                    let readiness = readiness.clone();
                    std::thread::spawn(move || {
                        for _ in 0..2000 {
                            readiness.set_unsaved(what, Some("ENOSPC".into()));
                            readiness.set_unsaved(what, None);
                        }
                    })
                })
                .collect();
            for toggler in togglers {
                toggler.join().unwrap();
            }
            assert!(readiness.is_ready());
            assert_eq!(gauge.get(), 1);
        }
    }
}
