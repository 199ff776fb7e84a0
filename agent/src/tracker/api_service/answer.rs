//! Answers waiting for the journal. The owner loop saves the journal once per burst of
//! requests, then calls each answer with how the save went: a success is only ever reported
//! for a change that is on disk. When the save failed, a request that succeeded is answered
//! `unavailable` (503) with the reason; a read, or a request that failed anyway, is answered
//! as it is.

use std::net::IpAddr;

use tokio::sync::oneshot;

use crate::{
    api::{
        command::{PendingClaim, Reply},
        model::{ClaimResponse, HygieneView},
        views::{ApiError, TimeBase},
    },
    hygiene::{Report, Trigger, CLAIM_WAIT},
    tracker::hygiene::hygiene_view,
};

/// An answer waiting for the journal to be saved; called with how the save went (`Err` names
/// why it failed).
pub type Answer = Box<dyn FnOnce(Result<(), &str>) + Send>;

/// The answer to a request that changed nothing: sent whatever the journal did.
pub fn answer<T: Send + 'static>(reply: Reply<T>, result: Result<T, ApiError>) -> Answer {
    Box::new(move |_saved| {
        // The caller may have hung up; its request was still carried out.
        let _ = reply.send(result);
    })
}

/// The answer to a request that may have changed the registry: a success is only sent once
/// the journal holds it; otherwise `unavailable`, naming why.
pub fn durable_answer<T: Send + 'static>(reply: Reply<T>, result: Result<T, ApiError>) -> Answer {
    Box::new(move |saved| {
        let result = match (result, saved) {
            (Ok(_), Err(reason)) => Err(ApiError::unavailable(reason)),
            (result, _) => result,
        };
        let _ = reply.send(result);
    })
}

/// The answer to a claim: sent once the journal has it, to be awaited by the request's task
/// until every flush the claim started has finished (bounded by [`CLAIM_WAIT`]), with what
/// each did.
pub fn claim_answer(
    reply: oneshot::Sender<PendingClaim>,
    result: Result<ClaimResponse, ApiError>,
    waits: Vec<(IpAddr, oneshot::Receiver<Report>)>,
) -> Answer {
    Box::new(move |saved| {
        // Not durable, not done: the same rule as every other change (`durable_answer`).
        let result = match (result, saved) {
            (Ok(_), Err(reason)) => Err(ApiError::unavailable(reason)),
            (result, _) => result,
        };
        let _ = reply.send(Box::pin(with_flushes(result, waits)));
    })
}

/// `result` once each of `waits` has reported, or [`CLAIM_WAIT`] has passed.
async fn with_flushes(
    mut result: Result<ClaimResponse, ApiError>,
    waits: Vec<(IpAddr, oneshot::Receiver<Report>)>,
) -> Result<ClaimResponse, ApiError> {
    if waits.is_empty() {
        return result;
    }
    let deadline = tokio::time::Instant::now() + CLAIM_WAIT;
    for (addr, wait) in waits {
        let report = match tokio::time::timeout_at(deadline, wait).await {
            Ok(Ok(report)) => Ok(report),
            Ok(Err(_)) => Err("the hygiene worker stopped before it finished"),
            Err(_) => Err("still running when the claim was answered"),
        };
        if let Ok(response) = result.as_mut() {
            note_flush(response, addr, report);
        }
    }
    result
}

/// Puts a flush's report, or why there is none, into the claim's answer: a claim is never
/// answered as if its address were clean when that is not known.
fn note_flush(response: &mut ClaimResponse, addr: IpAddr, report: Result<Report, &str>) {
    let Some(view) = response.addresses.iter_mut().find(|v| v.address == addr) else {
        return;
    };
    view.last_flush = Some(match report {
        Ok(report) => hygiene_view(&report, Some(&TimeBase::now())),
        Err(why) => {
            log::error!("{addr}: claim answered before its reuse hygiene finished: {why}");
            HygieneView {
                address: addr,
                trigger: Trigger::NewHolder.into(),
                at: String::new(),
                conntrack_entries: 0,
                conntrack_flush: None,
                neighbours: 0,
                announcements: 0,
                announce_skipped: None,
                skipped: None,
                permanent_neighbours: Vec::new(),
                errors: vec![format!(
                    "{why} (after {})",
                    humantime::format_duration(CLAIM_WAIT)
                )],
            }
        }
    });
}
