//! `ipq_remote_claim_checks_*`: the API server asked about remote claims' local holders.
//! Registered whether or not the agent asks (all zeros then): this module owns its series.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

use crate::{registry::PodStanding, series::registered};

pub struct RemoteClaimMetrics {
    /// Answers, by what they said: `gone` (fenced), `present` (reported only), `unknown` (no
    /// answer in time: fenced on the announcement's word).
    pub answers: IntCounterVec,
    /// Questions the task had no room for.
    pub dropped: IntCounter,
}

impl RemoteClaimMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let answers = registered(
            registry,
            IntCounterVec::new(
                Opts::new(
                    "ipq_remote_claim_checks_total",
                    "Remote claims of an Active pod's address (fence-old) checked with the API \
                     server before fencing, by answer: gone (the pod is gone: its holder here \
                     is fenced), present (the pod is still there: reported only, the \
                     announcement is a double allocation or forged), unknown (no answer in \
                     time: fenced on the announcement's word).",
                ),
                &["answer"],
            )?,
        )?;
        for standing in [
            PodStanding::Gone,
            PodStanding::Present,
            PodStanding::Unknown,
        ] {
            answers.with_label_values(&[label(standing)]);
        }
        let dropped = registered(
            registry,
            IntCounter::new(
                "ipq_remote_claim_checks_dropped_total",
                "Remote claims not checked because the checker's queue was full (the claim, \
                 still made, is sampled and checked again).",
            )?,
        )?;
        Ok(Self { answers, dropped })
    }

    pub fn answered(&self, standing: PodStanding) {
        self.answers.with_label_values(&[label(standing)]).inc();
    }
}

/// The `answer` label of `standing`.
fn label(standing: PodStanding) -> &'static str {
    match standing {
        PodStanding::Gone => "gone",
        PodStanding::Present => "present",
        PodStanding::Unknown => "unknown",
    }
}
