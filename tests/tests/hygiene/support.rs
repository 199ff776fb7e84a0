//! What every hygiene test needs: `ip` and tools in a namespace, and the agent's API (claims,
//! address views, the last flush).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use ipq_tests::{
    api,
    lab::{poll, Lab},
    netns::NetNs,
};
use serde_json::{json, Value};

/// `ip` in `ns`, split on whitespace.
pub(crate) fn ip(ns: &NetNs, args: &str) -> anyhow::Result<String> {
    ns.ip(&args.split_whitespace().collect::<Vec<_>>())
}

/// Runs `program args` in `ns`; fails with its output unless it succeeds.
pub(crate) fn run(ns: &NetNs, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = ns
        .command(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} (cargo xtask setup installs it)"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?} in {}: {}\n{}",
        ns.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
pub(crate) fn socket(lab: &Lab) -> std::path::PathBuf {
    lab.work_dir().join("ipq.sock")
}

/// `GET /v1/addresses/{addr}`: the view, or `None` for a free address.
pub(crate) fn address(lab: &Lab, addr: IpAddr) -> anyhow::Result<Option<Value>> {
    let answer = api::request(&socket(lab), "GET", &format!("/v1/addresses/{addr}"), None)?;
    match answer.status {
        200 => Ok(Some(answer.json()?)),
        404 => Ok(None),
        other => bail!("GET {addr}: {other} {}", answer.body),
    }
}

/// Waits until `addr`'s last flush has `trigger`, and returns it.
pub(crate) fn wait_flush(lab: &Lab, addr: IpAddr, trigger: &str) -> anyhow::Result<Value> {
    poll(
        &format!("{addr}: a {trigger} flush"),
        Duration::from_secs(10),
        || {
            let view = address(lab, addr)?;
            let flush = view.and_then(|v| v.get("last_flush").cloned());
            Ok(flush.filter(|f| f["trigger"] == trigger))
        },
    )
}

/// `POST /v1/claims` of `addrs` for the holder behind `interface` with `mac`, as ipq-cni
/// sends it; returns the answer and how long it took.
pub(crate) fn claim(
    lab: &Lab,
    addrs: &[IpAddr],
    interface: &str,
    mac: &str,
) -> anyhow::Result<(Value, Duration)> {
    claim_as(
        lab,
        addrs,
        json!({"interface": interface, "mac": mac, "container_id": "c-new"}),
    )
}

/// `POST /v1/claims` of `addrs` for `holder` (the API's holder object, as given); returns the
/// answer and how long it took.
pub(crate) fn claim_as(
    lab: &Lab,
    addrs: &[IpAddr],
    holder: Value,
) -> anyhow::Result<(Value, Duration)> {
    let body = json!({
        "addresses": addrs,
        "holder": holder,
        "source": "cni",
    });
    let started = Instant::now();
    let answer = api::request(&socket(lab), "POST", "/v1/claims", Some(&body.to_string()))?;
    let took = started.elapsed();
    ensure!(
        answer.status == 200,
        "claim: {} {}",
        answer.status,
        answer.body
    );
    Ok((answer.json()?, took))
}
