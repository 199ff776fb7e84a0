//! Whether the agent is ready: what `/readyz` answers, `ipq status` shows and `ipq_ready`
//! exports, decided in one place. Ready means started (datapath loaded, registry recovered and
//! reconciled, every configured interface attached once) and nothing blocking since: no
//! interface left unprotected, the pins kept, every datapath write through, every change
//! saved.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
};

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

/// The agent's readiness, shared by the owner loop (which sets it) and the listeners.
#[derive(Debug)]
pub struct Readiness {
    started: AtomicBool,
    /// Why the agent is not ready although started: interfaces left unprotected.
    blocker: Mutex<Option<String>>,
    /// Why the pins under `bpffs_dir` cannot be kept, when they cannot (the verification says).
    pins: Mutex<Option<String>>,
    /// Which datapath writes are pending, while any is.
    writes: Mutex<Option<String>>,
    /// Why changes cannot be saved, by what cannot save them (the journal, ipq-ipam's
    /// releases), while any cannot.
    unsaved: Mutex<BTreeMap<&'static str, String>>,
    /// `ipq_ready`, kept equal to [`Readiness::check`] being `Ok`.
    gauge: IntGauge,
}

impl Readiness {
    /// Not started, shown on `gauge`.
    pub fn new(gauge: IntGauge) -> Self {
        gauge.set(0);
        Self {
            started: AtomicBool::new(false),
            blocker: Mutex::new(None),
            pins: Mutex::new(None),
            writes: Mutex::new(None),
            unsaved: Mutex::new(BTreeMap::new()),
            gauge,
        }
    }

    /// Marks the start-up done (or the agent stopping).
    pub fn set_started(&self, started: bool) {
        self.started.store(started, Ordering::SeqCst);
        self.update();
    }

    /// Sets (or clears) what keeps the agent from being ready although started.
    pub fn set_blocker(&self, blocker: Option<String>) {
        *self.blocker.lock().unwrap_or_else(|p| p.into_inner()) = blocker;
        self.update();
    }

    /// Sets (or clears) why the pins under `bpffs_dir` cannot be kept.
    pub fn set_pins_problem(&self, problem: Option<String>) {
        *self.pins.lock().unwrap_or_else(|p| p.into_inner()) = problem;
        self.update();
    }

    /// Sets (or clears) which datapath writes the kernel refused and are retried.
    pub fn set_writes_pending(&self, pending: Option<String>) {
        *self.writes.lock().unwrap_or_else(|p| p.into_inner()) = pending;
        self.update();
    }

    /// Sets (or clears) why `what` (the journal, ipq-ipam's releases) cannot save changes.
    pub fn set_unsaved(&self, what: &'static str, reason: Option<String>) {
        {
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            match reason {
                Some(reason) => unsaved.insert(what, reason),
                None => unsaved.remove(what),
            };
        }
        self.update();
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), NotReady> {
        if !self.started.load(Ordering::SeqCst) {
            return Err(NotReady::Starting);
        }
        if let Some(problem) = &*self.pins.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(NotReady::Pins(problem.clone()));
        }
        if let Some(pending) = &*self.writes.lock().unwrap_or_else(|p| p.into_inner()) {
            return Err(NotReady::DatapathWrites(pending.clone()));
        }
        {
            let unsaved = self.unsaved.lock().unwrap_or_else(|p| p.into_inner());
            if !unsaved.is_empty() {
                let reasons: Vec<String> = unsaved
                    .iter()
                    .map(|(what, reason)| format!("{what}: {reason}"))
                    .collect();
                return Err(NotReady::Unsaved(reasons.join("; ")));
            }
        }
        match &*self.blocker.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(blocker) => Err(NotReady::Unprotected(blocker.clone())),
            None => Ok(()),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.check().is_ok()
    }

    fn update(&self) {
        self.gauge.set(i64::from(self.is_ready()));
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
}
