//! Pool pressure: the delegate's range is exhausted while ipq holds quarantined addresses of
//! that network. The agent's `ipam_on_exhausted` decides:
//!
//! - `wait`: the ADD fails with "try again later" (code 11) naming how many addresses ipq holds
//!   and when the first is released; the kubelet retries the sandbox until then.
//! - `release-quietest`: the agent releases at once the held allocation whose addresses have
//!   been quiet longest (stale traffic stopped longest ago, or never came), and ipq-ipam asks
//!   the delegate once more. Only allocations whose every address is Quarantined (or free)
//!   qualify: never one of a Draining holder, which still lives. The registry's quarantine and
//!   its fence stay: what the released address's old holder sends is still dropped.
//!
//! Each exhaustion is counted (`ipq_ipam_exhausted_total{network,outcome}`) and published
//! (`ipam_exhausted` on `/v1/events`).

use std::net::IpAddr;

use ipq_api::{
    client::Client,
    model::{ExhaustedAnswer, ExhaustedRequest},
};

use super::super::error::{code, CniError};

/// What the delegates say when their range is used up: host-local ("no IP addresses
/// available in range set"), whereabouts ("Could not allocate IP in range"), and the
/// generic wordings of others. Matched case-insensitively in the delegate's message.
const EXHAUSTED: [&str; 4] = [
    "no ip addresses available",
    "could not allocate ip in range",
    "no more free",
    "exhausted",
];

/// Whether the delegate's error says its range is used up.
pub fn is_exhausted(err: &CniError) -> bool {
    let text = err.msg.to_lowercase();
    EXHAUSTED.iter().any(|needle| text.contains(needle))
}

/// What ipq-ipam does after the delegate said its range is exhausted.
#[derive(Debug)]
pub enum Next {
    /// The allocation of these addresses was released: ask the delegate once more, and take
    /// them although ipq still has them quarantined.
    AskAgain(Vec<IpAddr>),
    /// Give up with this error.
    Fail(CniError),
}

/// Asks the agent what to do about `exhausted` (the delegate's error) in `network`.
pub async fn decide(
    client: &Client,
    network: Option<&str>,
    container_id: &str,
    exhausted: CniError,
) -> Next {
    let request = ExhaustedRequest {
        network: network.unwrap_or_default().to_owned(),
        container_id: container_id.to_owned(),
    };
    let answer = match client.ipam_exhausted(&request).await {
        Ok(answer) => answer,
        Err(err) => {
            log::warn!(
                "ADD of container {container_id}: the delegate's range is exhausted and the ipq \
                 agent cannot say whether it holds any of it ({err})"
            );
            return Next::Fail(exhausted);
        }
    };
    if !answer.released.is_empty() {
        return Next::AskAgain(answer.released);
    }
    if answer.quarantined == 0 && answer.draining == 0 {
        return Next::Fail(exhausted);
    }
    Next::Fail(CniError::new(
        code::TRY_AGAIN_LATER,
        wait_message(&answer, &exhausted),
    ))
}

fn wait_message(answer: &ExhaustedAnswer, exhausted: &CniError) -> String {
    let next = answer
        .next_release
        .as_deref()
        .map_or_else(String::new, |at| format!("; the first is released at {at}"));
    format!(
        "{}: ipq holds {} quarantined and {} draining addresses of this network \
         (ipam_on_exhausted = {}){next}",
        exhausted.msg, answer.quarantined, answer.draining, answer.policy
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_local_and_whereabouts_exhaustion_is_recognised_and_other_errors_are_not() {
        let err = |msg: &str| CniError::new(999, msg);
        assert!(is_exhausted(&err(
            "delegate host-local: failed to allocate for range 0: no IP addresses available in \
             range set: 10.93.0.1-10.93.0.6"
        )));
        assert!(is_exhausted(&err(
            "Could not allocate IP in range: ip: 10.0.0.1"
        )));
        assert!(!is_exhausted(&err(
            "requested IP address 10.0.0.2 is not available"
        )));
    }

    #[test]
    fn the_wait_message_names_the_holds_the_policy_and_the_first_release() {
        let answer = ExhaustedAnswer {
            policy: ipq_api::OnExhausted::Wait,
            quarantined: 2,
            draining: 1,
            next_release: Some("2026-11-25T02:00:00Z".into()),
            released: Vec::new(),
        };
        let text = wait_message(&answer, &CniError::new(999, "no IP addresses available"));
        for part in [
            "no IP addresses available",
            "2 quarantined and 1 draining",
            "ipam_on_exhausted = wait",
            "released at 2026-11-25T02:00:00Z",
        ] {
            assert!(text.contains(part), "{part:?} in {text}");
        }
    }
}
