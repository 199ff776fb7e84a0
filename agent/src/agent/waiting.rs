//! API answers waiting for the journal's flush: a burst's answers go out once a flush that
//! covers its commit reported (so "done" is on disk), or with the reason it is not.

use std::collections::VecDeque;

use crate::{
    journal::{Commit, JournalError},
    tracker::Answer,
};

/// Bursts of answers in commit order, each with the ticket of its commit. Bounded by the
/// requests in flight (each answer is a request the API's listeners admitted under their
/// connection caps, through a command queue of 1024), however long a flush takes.
#[derive(Default)]
pub struct WaitingAnswers {
    waiting: VecDeque<(u64, Vec<Answer>)>,
}

impl WaitingAnswers {
    /// `answers` of a burst, after its save: sent now (durable, or failed), or kept until
    /// their flush reports.
    pub fn after_save(&mut self, answers: Vec<Answer>, saved: Result<Commit, JournalError>) {
        match saved {
            Ok(Commit::Durable) => {
                self.release_through(u64::MAX);
                send(answers, Ok(()));
            }
            Ok(Commit::Syncing(ticket)) => self.waiting.push_back((ticket, answers)),
            Err(e) => send(answers, Err(&e.to_string())),
        }
    }

    /// A save with no answers of its own: a `Durable` one (a rewrite, or nothing left to
    /// flush) covers every commit before it.
    pub fn after_quiet_save(&mut self, saved: &Result<Commit, JournalError>) {
        if let Ok(Commit::Durable) = saved {
            self.release_through(u64::MAX);
        }
    }

    /// A flush's report, as the journal judged it (see `Tracker::on_synced`).
    pub fn on_synced(&mut self, outcome: Option<Result<u64, JournalError>>) {
        match outcome {
            None => {}
            Some(Ok(through)) => self.release_through(through),
            Some(Err(e)) => {
                let reason = e.to_string();
                for (_, answers) in self.waiting.drain(..) {
                    send(answers, Err(&reason));
                }
            }
        }
    }

    fn release_through(&mut self, ticket: u64) {
        while self.waiting.front().is_some_and(|(t, _)| *t <= ticket) {
            if let Some((_, answers)) = self.waiting.pop_front() {
                send(answers, Ok(()));
            }
        }
    }
}

fn send(answers: Vec<Answer>, saved: Result<(), &str>) {
    for answer in answers {
        answer(saved);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Answers that record what they were told, under a name.
    fn answers(log: &Arc<Mutex<Vec<String>>>, name: &str) -> Vec<Answer> {
        let (log, name) = (log.clone(), name.to_owned());
        vec![Box::new(move |saved: Result<(), &str>| {
            log.lock()
                .unwrap()
                .push(format!("{name}: {}", saved.err().unwrap_or("saved")));
        })]
    }

    fn eio() -> JournalError {
        JournalError::Io {
            path: "registry.journal".into(),
            source: std::io::Error::from_raw_os_error(libc::EIO),
        }
    }

    #[test]
    fn bursts_are_answered_when_a_flush_covering_them_reports() {
        let log = Arc::default();
        let mut waiting = WaitingAnswers::default();
        waiting.after_save(answers(&log, "a"), Ok(Commit::Syncing(1)));
        waiting.after_save(answers(&log, "b"), Ok(Commit::Syncing(2)));
        waiting.after_save(answers(&log, "c"), Ok(Commit::Syncing(3)));
        assert!(log.lock().unwrap().is_empty(), "nothing before its flush");
        waiting.on_synced(None);
        waiting.on_synced(Some(Ok(2)));
        assert_eq!(*log.lock().unwrap(), ["a: saved", "b: saved"]);
        // A save that made everything durable (a rewrite) answers the rest.
        waiting.after_quiet_save(&Ok(Commit::Syncing(3)));
        assert_eq!(log.lock().unwrap().len(), 2);
        waiting.after_quiet_save(&Ok(Commit::Durable));
        assert_eq!(*log.lock().unwrap(), ["a: saved", "b: saved", "c: saved"]);
    }

    #[test]
    fn a_failed_flush_answers_every_waiting_burst_with_why() {
        let log = Arc::default();
        let mut waiting = WaitingAnswers::default();
        waiting.after_save(answers(&log, "a"), Ok(Commit::Syncing(1)));
        waiting.after_save(answers(&log, "b"), Ok(Commit::Syncing(2)));
        waiting.on_synced(Some(Err(eio())));
        let told = log.lock().unwrap().clone();
        assert_eq!(told.len(), 2);
        assert!(
            told.iter().all(|t| t.contains("Input/output error")),
            "{told:?}"
        );
        // A save that fails answers its own burst at once; nothing is left waiting.
        waiting.after_save(answers(&log, "c"), Err(eio()));
        assert!(log.lock().unwrap()[2].starts_with("c: journal"));
        waiting.on_synced(Some(Ok(9)));
        assert_eq!(log.lock().unwrap().len(), 3);
    }
}
