//! Addresses a pod asks for by name (`CNI_ARGS IP=`, the `ips` capability in
//! `runtimeConfig.ips`, or `args.cni.ips`), checked against what ipq holds before the delegate
//! runs: a held address gets "try again later" naming its holder and until when, not the
//! delegate's "already allocated" (or, for a delegate that does not know about holds, the
//! address itself).

use std::net::IpAddr;

use ipq_api::{
    client::Client,
    model::{AddressView, ErrorCode},
    StateName,
};
use serde_json::Value;

use super::super::{
    agent_error::{self, describe, is_unavailable},
    config::OnUnavailable,
    error::{code, CniError},
};

/// Every address asked for, in the order given, without duplicates. What does not parse is
/// left to the delegate, which names it in its own error.
pub fn requested(cni_args: Option<&str>, netconf: &Value) -> Vec<IpAddr> {
    let from_args = cni_args
        .into_iter()
        .flat_map(|args| args.split(';'))
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| *key == "IP")
        .flat_map(|(_, value)| value.split(','))
        .map(str::to_owned);
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|list| {
                list.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let from_capability = strings(&netconf["runtimeConfig"]["ips"]);
    let from_conf_args = strings(&netconf["args"]["cni"]["ips"]);
    let mut out = Vec::new();
    for text in from_args.chain(from_capability).chain(from_conf_args) {
        let bare = text.trim().split('/').next().unwrap_or_default();
        if let Ok(addr) = bare.parse::<IpAddr>() {
            let addr = addr.to_canonical();
            if !out.contains(&addr) {
                out.push(addr);
            }
        }
    }
    out
}

/// The code-11 error naming the first of `addresses` ipq holds for another attachment than
/// `container_id`, if one is; an error when the agent cannot say.
pub async fn first_held(
    client: &Client,
    addresses: &[IpAddr],
    container_id: &str,
    on_unavailable: OnUnavailable,
) -> Result<Option<CniError>, CniError> {
    for addr in addresses {
        match client.get(*addr).await {
            Ok(view) => {
                if let Some(err) = held_for_another(&view, container_id) {
                    return Ok(Some(err));
                }
            }
            Err(err) if err.code() == Some(ErrorCode::NotFound) => {}
            Err(err) if is_unavailable(&err) => match on_unavailable {
                OnUnavailable::Fail => return Err(agent_error::unavailable(&err, "ADD")),
                OnUnavailable::Allow => {
                    log::warn!(
                        "ADD: {addr} handed out without checking ipq's holds: the agent is \
                         unavailable ({err}) and onUnavailable is \"allow\""
                    );
                    return Ok(None);
                }
            },
            Err(err) => return Err(agent_error::rejected(&err, "ADD")),
        }
    }
    Ok(None)
}

/// The error for `view` when its holder (live or, quarantined, previous) is not `container_id`.
///
/// An Active holder that ipq knows only from netlink (no container id) is not a hold: a
/// delegate that puts the address on the wire while the ADD runs (dhcp: the server's ARP entry
/// on the bridge) makes the pod being added show up that way before the ADD returns. Were it
/// another live pod after all, the claim that follows is a conflict `on_early_reuse` judges.
fn held_for_another(view: &AddressView, container_id: &str) -> Option<CniError> {
    let holder = match view.state {
        StateName::Active | StateName::Draining => view.holder.as_ref(),
        _ => view.previous_holder.as_ref(),
    };
    if view.state == StateName::Active && holder.is_none_or(|h| h.container_id().is_none()) {
        return None;
    }
    if holder.and_then(|h| h.container_id()) == Some(container_id)
        && view.state != StateName::Quarantined
    {
        return None;
    }
    let who = holder
        .map(describe)
        .unwrap_or_else(|| "a holder that is gone".into());
    let until = match (&view.until, view.state) {
        (Some(until), _) => format!("until {until}"),
        (None, StateName::Quarantined) => "until its quarantine ends".into(),
        (None, _) => "until that holder is gone and its quarantine is over".into(),
    };
    Some(CniError::new(
        code::TRY_AGAIN_LATER,
        format!(
            "address {} is held by ipq ({}, {who}) {until}: ipq-ipam does not ask the \
             delegate for it",
            view.address, view.state
        ),
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_way_of_asking_is_read() {
        let conf = json!({
            "runtimeConfig": {"ips": ["10.0.0.7/24", "fd00::7/64"]},
            "args": {"cni": {"ips": ["10.0.0.8"]}},
        });
        let got = requested(
            Some("IgnoreUnknown=1;IP=10.0.0.5,10.0.0.6;K8S_POD_NAME=x"),
            &conf,
        );
        let want: Vec<IpAddr> = ["10.0.0.5", "10.0.0.6", "10.0.0.7", "fd00::7", "10.0.0.8"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(got, want);
        assert!(requested(Some("IP=not-an-ip"), &json!({})).is_empty());
        assert!(requested(None, &json!({"runtimeConfig": {"ips": "x"}})).is_empty());
    }
}
