//! ADD: the delegate's allocation, unless it is an address ipq holds.
//!
//! An address asked for by name that ipq holds is refused before the delegate runs. An address
//! the delegate hands out although ipq holds it (a delegate that does not know about holds, a
//! hold lost by hand) is kept held too, and the delegate asked again, at most [`MAX_TRIES`]
//! times. host-local keys allocations by container id and ifname and refuses a second one for
//! the same pair ("duplicate allocation"), so the held allocation is moved to a parking id
//! (`<container id>-ipqheld-<n>`): freed under the pod's id and at once taken again under the
//! parking id by `CNI_ARGS IP=`, and the parking allocation's release handed to the agent like
//! a DEL's. The pod's id then asks again, and round-robin moves on past the parked address.
//!
//! A delegate whose range is exhausted is answered by the agent's `ipam_on_exhausted`
//! ([`pressure`]): wait, or ask again once after the quietest held allocation is released.

use std::{
    ffi::OsString,
    net::IpAddr,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use ipq_api::client::Client;

use super::{
    super::{
        env::Env,
        error::{code, CniError},
        result::PrevResult,
    },
    config::IpamConf,
    delegate,
    plugin::{cni_path, hand_over, runtime},
    pressure, recording, requested,
};

/// How many allocations of held addresses one ADD parks before it gives up with code 11.
pub const MAX_TRIES: usize = 3;

/// ADD through the delegate; its result as printed.
pub fn add(
    var: &impl Fn(&str) -> Option<OsString>,
    env: &Env,
    conf: &IpamConf,
) -> Result<String, CniError> {
    let cni_args = var("CNI_ARGS").and_then(|v| v.into_string().ok());
    let client = Client::new(&conf.settings.socket, conf.settings.timeout);
    let container_id = env.container_id.as_deref().unwrap_or_default();
    let runtime = runtime()?;
    // Addresses the agent released for this ADD (pool pressure): still quarantined, theirs to
    // take.
    let mut released: Vec<IpAddr> = Vec::new();
    let check = |addresses: &[IpAddr], released: &[IpAddr]| {
        let unreleased: Vec<IpAddr> = addresses
            .iter()
            .filter(|a| !released.contains(a))
            .copied()
            .collect();
        runtime.block_on(requested::first_held(
            &client,
            &unreleased,
            container_id,
            conf.settings.on_unavailable,
        ))
    };
    let asked = requested::requested(cni_args.as_deref(), &conf.delegate_conf);
    if !asked.is_empty() {
        if let Some(held) = check(&asked, &[])? {
            return Err(held);
        }
    }
    let binary = delegate::find(cni_path(env)?, &conf.delegate_type)?;
    let stdin = conf.delegate_conf.to_string();
    let mut last_hold = None;
    let allocate = || delegate::exec(&conf.delegate_type, &binary, &[], stdin.as_bytes());
    let mut pressure_asked = false;
    for attempt in 0..MAX_TRIES {
        let stdout = match allocate() {
            Ok(stdout) => stdout,
            // Once per ADD: the agent waits, or frees the quietest held allocation.
            Err(err) if !pressure_asked && pressure::is_exhausted(&err) => {
                pressure_asked = true;
                let network = conf.network.as_deref();
                match runtime.block_on(pressure::decide(&client, network, container_id, err)) {
                    pressure::Next::AskAgain(freed) => {
                        released = freed;
                        allocate()?
                    }
                    pressure::Next::Fail(err) => return Err(err),
                }
            }
            Err(err) => return Err(err),
        };
        let result: serde_json::Value = serde_json::from_str(&stdout).map_err(|e| {
            CniError::new(
                code::DELEGATE_FAILED,
                format!(
                    "delegate {}: its result is not JSON ({e}): {:?}",
                    conf.delegate_type,
                    stdout.trim()
                ),
            )
        })?;
        let addresses = PrevResult::parse(&result)?.addresses;
        let Some(held) = check(&addresses, &released)? else {
            // What a later release of it will run: recorded before the ADD succeeds.
            let record = recording::of(env, conf, container_id, cni_args.clone(), &addresses)?;
            recording::record(&record, conf)?;
            return Ok(stdout.trim_end().to_owned());
        };
        log::warn!(
            "ADD of container {container_id}: the delegate {} handed out an address ipq holds \
             ({}); parked and asked again (try {} of {MAX_TRIES})",
            conf.delegate_type,
            held.msg,
            attempt + 1
        );
        park(env, conf, &binary, &addresses)?;
        last_hold = Some(held);
    }
    let held = last_hold.unwrap_or_else(|| CniError::new(code::TRY_AGAIN_LATER, "no tries"));
    Err(CniError::new(
        code::TRY_AGAIN_LATER,
        format!(
            "the delegate {} handed out {MAX_TRIES} allocations of addresses ipq holds, each \
             kept held; the last: {}",
            conf.delegate_type, held.msg
        ),
    ))
}

/// Moves the pod's allocation of `addresses` to a parking id whose release the agent holds.
fn park(env: &Env, conf: &IpamConf, binary: &Path, addresses: &[IpAddr]) -> Result<(), CniError> {
    let container_id = env.container_id.as_deref().unwrap_or_default();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let parking_id = format!("{container_id}-ipqheld-{nanos}");
    let listed: Vec<String> = addresses.iter().map(ToString::to_string).collect();
    let park_args = format!("IgnoreUnknown=1;IP={}", listed.join(","));
    let stdin = conf.delegate_conf.to_string();
    let kind = &conf.delegate_type;
    delegate::exec(kind, binary, &[("CNI_COMMAND", "DEL")], stdin.as_bytes())?;
    let parked = delegate::exec(
        kind,
        binary,
        &[
            ("CNI_COMMAND", "ADD"),
            ("CNI_CONTAINERID", &parking_id),
            ("CNI_ARGS", &park_args),
        ],
        stdin.as_bytes(),
    );
    if let Err(e) = parked {
        // Between the two calls the delegate gave the address to another ADD: nothing of it
        // is left to hold (and the agent's fence stands behind it).
        log::warn!("ADD of container {container_id}: parking {listed:?} failed: {e}");
        return Ok(());
    }
    // The parking allocation is an allocation like any: its release completes its record.
    let record = recording::of(env, conf, &parking_id, Some(park_args), addresses)?;
    recording::record(&record, conf)?;
    hand_over(&record.release_at(super::release::now_unix_ms()), conf)
}
