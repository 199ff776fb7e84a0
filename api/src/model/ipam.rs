//! A release ipq-ipam hands to the agent instead of running the delegate's DEL: everything the
//! agent needs to run that DEL later, as a runtime would have.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A release the agent will not store, naming the field.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidRelease {
    pub field: &'static str,
    pub reason: &'static str,
}

/// One held allocation's release.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldRelease {
    /// The network's `name` (host-local keys its store by it).
    pub network: Option<String>,
    /// The config's `cniVersion`.
    pub cni_version: String,
    /// The delegate's `type`, found on `cni_path` when the DEL runs.
    pub delegate_type: String,
    /// The delegate's stdin for its DEL: the network config with `ipam` replaced by the
    /// delegate's section (and the runtime's `prevResult`, if it sent one).
    pub delegate_conf: Value,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, verbatim.
    pub cni_args: Option<String>,
    /// `CNI_PATH`, verbatim.
    pub cni_path: String,
    /// `CNI_NETNS`, if the runtime still had one (a DEL may come without).
    pub netns: Option<String>,
    /// The allocation's addresses, from `prevResult`; empty when the runtime sent none (the
    /// agent then goes by its own record of the container's claims).
    pub addresses: Vec<IpAddr>,
    /// When ipq-ipam's DEL handed the release over (ms since the epoch); 0 in a release of an
    /// older ipq-ipam, which is taken as held when the agent started. A release the registry
    /// cannot vouch for (its journal was lost) waits `max_cooldown` from here.
    #[serde(default)]
    pub held_at_unix_ms: u64,
}

/// Now, in ms since the epoch, as [`HeldRelease::held_at_unix_ms`] has it.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl HeldRelease {
    /// What the agent refuses to store: a release it could never run.
    pub fn validate(&self) -> Result<(), InvalidRelease> {
        for (field, value) in [
            ("containerId", &self.container_id),
            ("ifname", &self.ifname),
            ("delegateType", &self.delegate_type),
            ("cniPath", &self.cni_path),
        ] {
            if value.is_empty() {
                return Err(InvalidRelease {
                    field,
                    reason: "empty; a held release needs it to run the DEL",
                });
            }
        }
        if !self.delegate_conf.is_object() {
            return Err(InvalidRelease {
                field: "delegateConf",
                reason: "not an object (the delegate's network config)",
            });
        }
        Ok(())
    }

    /// The environment the delegate's DEL runs with.
    pub fn del_env(&self) -> Vec<(&'static str, &str)> {
        let mut env = vec![
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", self.container_id.as_str()),
            ("CNI_IFNAME", self.ifname.as_str()),
            ("CNI_PATH", self.cni_path.as_str()),
        ];
        if let Some(args) = &self.cni_args {
            env.push(("CNI_ARGS", args));
        }
        if let Some(netns) = &self.netns {
            env.push(("CNI_NETNS", netns));
        }
        env
    }
}
