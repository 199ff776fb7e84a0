//! What the agent's answers mean to a CNI runtime: which API errors are "try again later",
//! which are the agent being away, and how a holder in the way is named in a message.

use std::net::IpAddr;

use ipq_api::{
    client::ClientError,
    model::{ApiErrorBody, ErrorCode},
    Holder,
};

use super::error::{code, CniError};

/// The agent is not there to answer: not running, too slow, starting/stopping, or unable to
/// make changes durable (its journal cannot be saved).
pub fn is_unavailable(err: &ClientError) -> bool {
    match err {
        ClientError::Unavailable { .. } => true,
        ClientError::Api { error, .. } => {
            matches!(error.code, ErrorCode::NotReady | ErrorCode::Unavailable)
        }
        ClientError::Protocol { .. } => false,
    }
}

/// A DEL the agent could not take now but may later: spool it rather than lose it.
pub fn is_worth_spooling(err: &ClientError) -> bool {
    is_unavailable(err) || err.code() == Some(ErrorCode::Internal)
}

/// `container c0ffee on veth1a2b (pod default/web-0)`, or the interface alone.
pub fn describe(holder: &Holder) -> String {
    let mut out = match holder.container_id() {
        Some(id) => format!("container {id} on {}", holder.ifname),
        None => format!("interface {} (ifindex {})", holder.ifname, holder.ifindex),
    };
    if let Some(pod) = holder.pod() {
        out.push_str(&format!(" (pod {}/{})", pod.namespace, pod.name));
    }
    out
}

/// ADD refused under `refuse-new`: code 11, naming the address, the holder and until when.
pub fn refused(error: &ApiErrorBody, claimed: &[IpAddr]) -> CniError {
    let address = error.address.map(|a| a.to_string()).unwrap_or_else(|| {
        claimed
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    });
    let holder = error
        .holder
        .as_ref()
        .map(describe)
        .unwrap_or_else(|| "another holder".to_owned());
    let when = match &error.until {
        Some(until) => format!("its quarantine ends at {until}"),
        None => "that holder is gone and its quarantine is over".to_owned(),
    };
    CniError::new(
        code::TRY_AGAIN_LATER,
        format!(
            "address {address} is still held by {holder}; ipq refuses to give it to a new \
             container until {when} (on_early_reuse = refuse-new)"
        ),
    )
    .with_details(error.message.clone())
}

/// The agent is away and the config says `onUnavailable: fail`.
pub fn unavailable(err: &ClientError, command: &str) -> CniError {
    CniError::new(
        code::TRY_AGAIN_LATER,
        format!(
            "{command}: the ipq agent is unavailable ({err}); onUnavailable is \"fail\", so \
             the container is not attached without it"
        ),
    )
}

/// Any other error answer: the agent refused the request for a reason retrying will not fix.
pub fn rejected(err: &ClientError, command: &str) -> CniError {
    let detail = match err {
        ClientError::Api { error, .. } => format!("{}: {}", error.code.as_ref(), error.message),
        other => other.to_string(),
    };
    CniError::new(
        code::AGENT_REJECTED,
        format!("{command}: the ipq agent refused the request: {detail}"),
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use ipq_api::PodRef;

    fn api(code: ErrorCode) -> ClientError {
        ClientError::Api {
            status: code.http_status(),
            error: Box::new(ApiErrorBody {
                code,
                message: "m".into(),
                address: None,
                holder: None,
                until: None,
                needs: None,
            }),
        }
    }

    #[test]
    fn what_counts_as_unavailable() {
        let away = ClientError::Unavailable {
            socket: PathBuf::from("/run/ipq/ipq.sock"),
            reason: "connection refused".into(),
        };
        assert!(is_unavailable(&away));
        assert!(is_unavailable(&api(ErrorCode::NotReady)));
        assert!(is_unavailable(&api(ErrorCode::Unavailable)));
        assert!(is_worth_spooling(&api(ErrorCode::Unavailable)));
        assert!(!is_unavailable(&api(ErrorCode::Internal)));
        assert!(is_worth_spooling(&api(ErrorCode::Internal)));
        assert!(!is_worth_spooling(&api(ErrorCode::BadRequest)));
        let garbled = ClientError::Protocol {
            what: "/v1/drains".into(),
            reason: "eof".into(),
        };
        assert!(!is_unavailable(&garbled));
        let err = unavailable(&away, "ADD");
        assert_eq!(err.code, code::TRY_AGAIN_LATER);
        assert!(err.msg.contains("/run/ipq/ipq.sock"), "{err}");
        let err = rejected(&api(ErrorCode::UnknownInterface), "ADD");
        assert_eq!(err.code, code::AGENT_REJECTED);
        assert!(err.msg.contains("unknown_interface"), "{err}");
    }

    #[test]
    fn a_refusal_names_address_holder_and_until() {
        let holder = Holder::new(7, "veth1a2b")
            .with_container_id("c0ffee")
            .with_pod(PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: None,
            });
        let body = ApiErrorBody {
            code: ErrorCode::Refused,
            message: "address 10.1.0.5 is draining".into(),
            address: Some("10.1.0.5".parse().unwrap()),
            holder: Some(holder),
            until: Some("2026-01-01T00:00:30Z".into()),
            needs: None,
        };
        let err = refused(&body, &[]);
        assert_eq!(err.code, code::TRY_AGAIN_LATER);
        for needle in [
            "10.1.0.5",
            "container c0ffee on veth1a2b (pod default/web-0)",
            "2026-01-01T00:00:30Z",
        ] {
            assert!(err.msg.contains(needle), "{needle:?} not in {err}");
        }
        let bare = ApiErrorBody {
            address: None,
            holder: None,
            until: None,
            ..body
        };
        let err = refused(&bare, &["10.1.0.6".parse().unwrap()]);
        assert!(
            err.msg.contains("10.1.0.6") && err.msg.contains("quarantine is over"),
            "{err}"
        );
        assert_eq!(
            describe(&Holder::new(3, "vethx")),
            "interface vethx (ifindex 3)"
        );
    }
}
