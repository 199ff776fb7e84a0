//! GC and STATUS (spec 1.1.0), passed to the delegate with ipq's part added.
//!
//! A runtime's GC lists the attachments it still has (`cni.dev/valid-attachments`) and lets the
//! IPAM free everything else. The allocations ipq holds belong to containers the runtime has
//! deleted, so it lists none of them: passed on as it is, a GC would free every held address at
//! once. The delegate's GC therefore gets the runtime's list plus every attachment with a
//! pending release in this network. Those are read from `stateDir` itself (the agent keeps its
//! releases where ipq-ipam spools them), so a GC with the agent away still holds them; a GC
//! that cannot read them fails rather than free what it cannot see.
//!
//! STATUS says whether an ADD would work now: the agent's readiness (ADD asks it about holds)
//! and the delegate's own STATUS.

use std::collections::BTreeSet;

use ipq_api::client::Client;
use ipq_fs::{paths, spool};
use serde_json::{json, Value};

use super::{
    super::{
        env::Env,
        error::{code, CniError},
    },
    config::IpamConf,
    delegate,
    plugin::{cni_path, runtime},
    release::HeldRelease,
};

/// The spec version that has GC and STATUS.
const GC_VERSION: &str = "1.1.0";
/// The GC key of the runtime's attachments.
pub const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";

/// GC: the delegate's, with the held attachments kept.
pub fn gc(env: &Env, conf: &IpamConf) -> Result<String, CniError> {
    let held = held_attachments(conf)?;
    let binary = delegate::find(cni_path(env)?, &conf.delegate_type)?;
    if !delegate::supports(&conf.delegate_type, &binary, &conf.cni_version, GC_VERSION)? {
        log::info!(
            "GC: the delegate {} has no GC (it does not speak {GC_VERSION}); nothing to pass on, \
             {} held attachments stay",
            conf.delegate_type,
            held.len()
        );
        return Ok(String::new());
    }
    let stdin = with_held(&conf.delegate_conf, &held)?;
    delegate::exec(
        &conf.delegate_type,
        &binary,
        &[],
        stdin.to_string().as_bytes(),
    )
    .map(|out| out.trim_end().to_owned())
}

/// STATUS: the agent ready, and the delegate's own STATUS where it has one.
pub fn status(env: &Env, conf: &IpamConf) -> Result<String, CniError> {
    let client = Client::new(&conf.settings.socket, conf.settings.timeout);
    let not_available = |why: String| {
        CniError::new(
            code::PLUGIN_NOT_AVAILABLE,
            format!(
                "the ipq agent on {} {why}; ipq-ipam's ADD asks it which addresses it holds",
                conf.settings.socket.display()
            ),
        )
    };
    match runtime()?.block_on(client.status()) {
        Ok(status) if status.ready => {}
        Ok(_) => return Err(not_available("is not ready (starting or stopping)".into())),
        Err(err) => return Err(not_available(format!("does not answer: {err}"))),
    }
    let binary = delegate::find(cni_path(env)?, &conf.delegate_type)?;
    if !delegate::supports(&conf.delegate_type, &binary, &conf.cni_version, GC_VERSION)? {
        return Ok(String::new());
    }
    let stdin = conf.delegate_conf.to_string();
    delegate::exec(&conf.delegate_type, &binary, &[], stdin.as_bytes())
        .map(|out| out.trim_end().to_owned())
}

/// The attachments of this network whose release ipq holds: (container id, ifname).
fn held_attachments(conf: &IpamConf) -> Result<BTreeSet<(String, String)>, CniError> {
    let dir = paths::ipam_release_dir(&conf.settings.state_dir);
    let pending = spool::pending_of::<HeldRelease>(&dir).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            format!(
                "GC: the releases ipq holds cannot be read ({e}); nothing is collected, so no \
                 held address is freed"
            ),
        )
    })?;
    Ok(pending
        .into_iter()
        .map(|spooled| spooled.request)
        .filter(|release| release.network == conf.network)
        .map(|release| (release.container_id, release.ifname))
        .collect())
}

/// `conf` with `held` added to its valid attachments (kept once each).
fn with_held(conf: &Value, held: &BTreeSet<(String, String)>) -> Result<Value, CniError> {
    let mut conf = conf.clone();
    let listed = match conf.get(VALID_ATTACHMENTS) {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(other) => {
            return Err(CniError::new(
                code::DECODING_FAILURE,
                format!(
                    "{VALID_ATTACHMENTS}: must be a list of {{containerID, ifname}}, not {}",
                    ipq_api::echo::Echo(&other.to_string())
                ),
            ))
        }
    };
    let known: BTreeSet<(String, String)> = listed
        .iter()
        .filter_map(|a| {
            Some((
                a.get("containerID")?.as_str()?.to_owned(),
                a.get("ifname")?.as_str()?.to_owned(),
            ))
        })
        .collect();
    let mut all = listed;
    for (container_id, ifname) in held.difference(&known) {
        all.push(json!({"containerID": container_id, "ifname": ifname}));
    }
    conf[VALID_ATTACHMENTS] = Value::Array(all);
    Ok(conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_attachments_are_added_once_and_the_runtimes_kept() {
        let conf = json!({
            "name": "n",
            VALID_ATTACHMENTS: [{"containerID": "live", "ifname": "eth0"},
                                {"containerID": "gone", "ifname": "eth0"}],
        });
        let held: BTreeSet<_> = [("gone", "eth0"), ("parked-1", "eth0")]
            .into_iter()
            .map(|(c, i)| (c.to_owned(), i.to_owned()))
            .collect();
        let out = with_held(&conf, &held).unwrap();
        assert_eq!(
            out[VALID_ATTACHMENTS],
            json!([{"containerID": "live", "ifname": "eth0"},
                   {"containerID": "gone", "ifname": "eth0"},
                   {"containerID": "parked-1", "ifname": "eth0"}])
        );
        assert_eq!(out["name"], "n");
    }

    #[test]
    fn a_gc_without_a_list_gets_the_held_ones_and_a_bad_list_is_named() {
        let held: BTreeSet<_> = [("gone".to_owned(), "eth0".to_owned())].into();
        let out = with_held(&json!({"name": "n"}), &held).unwrap();
        assert_eq!(
            out[VALID_ATTACHMENTS],
            json!([{"containerID": "gone", "ifname": "eth0"}])
        );
        let err = with_held(&json!({VALID_ATTACHMENTS: "x"}), &held).unwrap_err();
        assert_eq!(err.code, code::DECODING_FAILURE);
        assert!(err.msg.contains(VALID_ATTACHMENTS), "{err}");
    }
}
