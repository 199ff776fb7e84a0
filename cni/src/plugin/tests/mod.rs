//! Every command through [`run`], as the binary runs it: against no agent at all, and against
//! a fake agent that answers canned HTTP responses and records what it was asked.

mod add;
mod check;
mod del;
mod fake_agent;
mod gc;
mod input;
mod status;

use std::{collections::HashMap, path::Path};

use serde_json::{json, Value};

use super::*;

fn environment(command: &str) -> HashMap<String, OsString> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", "/var/run/netns/blue"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), OsString::from(v)))
    .collect()
}

fn invoke(vars: &HashMap<String, OsString>, stdin: &Value) -> Outcome {
    run(|name| vars.get(name).cloned(), stdin.to_string().as_bytes())
}

/// The error object of a failed run, checked for shape.
fn error_of(outcome: &Outcome) -> Value {
    assert!(!outcome.success, "expected a failure, got {outcome:?}");
    let value: Value = serde_json::from_str(&outcome.stdout).unwrap();
    assert!(value["cniVersion"].is_string(), "{value}");
    assert!(value["msg"].is_string(), "{value}");
    value
}

fn assert_error(outcome: &Outcome, code: u64, needle: &str) -> Value {
    let err = error_of(outcome);
    assert_eq!(err["code"], code, "{err}");
    assert!(
        err["msg"].as_str().unwrap().contains(needle),
        "{needle:?} not in {err}"
    );
    err
}

/// A ptp-like result: one host-side veth (which does not exist here), v4 + v6.
fn ptp_result(version: &str) -> Value {
    let mut ips = json!([
        {"interface": 1, "address": "10.89.0.7/24", "gateway": "10.89.0.1"},
        {"interface": 1, "address": "fd89::7/64", "gateway": "fd89::1"}
    ]);
    if version == "0.4.0" {
        ips[0]["version"] = json!("4");
        ips[1]["version"] = json!("6");
    }
    json!({
        "cniVersion": version,
        "interfaces": [
            {"name": "vethipqtest0", "mac": "4e:01:02:03:04:05"},
            {"name": "eth0", "mac": "0a:58:0a:58:00:05", "sandbox": "/var/run/netns/blue"}
        ],
        "ips": ips,
        "dns": {}
    })
}

fn conf(version: &str, socket: &Path, state: &Path) -> Value {
    json!({
        "cniVersion": version,
        "name": "ipq-unit",
        "type": "ipq-cni",
        "socket": socket,
        "stateDir": state,
        "timeoutMs": 500,
    })
}

fn with_prev(mut conf: Value, prev: Value) -> Value {
    conf["prevResult"] = prev;
    conf
}

const COMMANDS: [&str; 5] = ["ADD", "DEL", "CHECK", "GC", "STATUS"];
