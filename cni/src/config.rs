//! The network configuration on stdin: the spec's well-known keys, ipq-cni's own keys (the
//! conflist entry `{"type": "ipq-cni", "socket": ..., ...}`), and what the runtime injects
//! (`prevResult`, `cni.dev/valid-attachments`).

use std::{path::PathBuf, time::Duration};

use ipq_api::{echo::Echo, model::Attachment};
use serde_json::{Map, Value};

use super::{
    env::Command,
    error::{code, CniError},
};

/// The spec versions ipq-cni speaks, oldest first. 0.3.x because kube-flannel's stock conflist
/// (and other CNIs' still) says 0.3.1: its results have the 0.4.0 shape, and it has no CHECK.
pub const SUPPORTED_VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// The newest of [`SUPPORTED_VERSIONS`]: what errors say when the config's version is unknown.
pub const LATEST_VERSION: &str = "1.1.0";

/// What to do when the agent does not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnUnavailable {
    /// ADD and CHECK fail with "try again later": no pod starts unprotected.
    Fail,
    /// ADD and CHECK pass the result through and log: pods start without ipq.
    Allow,
}

/// ipq-cni's own keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `socket`: the agent's API socket.
    pub socket: PathBuf,
    /// `stateDir`: the agent's state dir, where DELs are spooled while it is down.
    pub state_dir: PathBuf,
    /// `onUnavailable`: `fail` (default) or `allow`.
    pub on_unavailable: OnUnavailable,
    /// `timeoutMs`: the bound on each call to the agent.
    pub timeout: Duration,
}

pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(2000);

/// The longest `timeoutMs` accepted: a runtime waits for the whole chain.
const MAX_TIMEOUT_MS: u64 = 60_000;

impl Default for Settings {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(ipq_api::DEFAULT_SOCKET),
            state_dir: PathBuf::from(ipq_api::DEFAULT_STATE_DIR),
            on_unavailable: OnUnavailable::Fail,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Settings {
    /// Applies `key` if it is one of the settings ipq-cni and ipq-ipam share (`socket`,
    /// `stateDir`, `onUnavailable`, `timeoutMs`); false for any other key. Errors
    /// name the key as `shown_as` (ipq-ipam's keys live under `ipam.`).
    pub fn apply(&mut self, key: &str, shown_as: &str, value: &Value) -> Result<bool, CniError> {
        let string = || -> Result<&str, CniError> {
            match value {
                Value::String(s) if !s.is_empty() => Ok(s),
                _ => Err(config_error(
                    shown_as,
                    format!(
                        "must be a non-empty string, not {}",
                        Echo(&value.to_string())
                    ),
                )),
            }
        };
        match key {
            "socket" => self.socket = PathBuf::from(string()?),
            "stateDir" => {
                let dir = PathBuf::from(string()?);
                // Relative to whatever directory the runtime runs plugins in: the agent would
                // never find, nor replay, what is spooled there.
                if !dir.is_absolute() {
                    return Err(config_error(
                        shown_as,
                        format!("must be an absolute path, not {}", Echo(&value.to_string())),
                    ));
                }
                self.state_dir = dir;
            }
            "onUnavailable" => {
                self.on_unavailable = match value.as_str() {
                    Some("fail") => OnUnavailable::Fail,
                    Some("allow") => OnUnavailable::Allow,
                    _ => {
                        return Err(config_error(
                            shown_as,
                            format!(
                                "must be \"fail\" or \"allow\", not {}",
                                Echo(&value.to_string())
                            ),
                        ))
                    }
                }
            }
            "timeoutMs" => {
                let ms = value
                    .as_u64()
                    .filter(|ms| (1..=MAX_TIMEOUT_MS).contains(ms))
                    .ok_or_else(|| {
                        config_error(
                    shown_as,
                            format!("must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}, not {}", Echo(&value.to_string())),
                        )
                    })?;
                self.timeout = Duration::from_millis(ms);
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// One plugin's configuration, as the runtime passed it.
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    pub cni_version: String,
    pub name: Option<String>,
    pub settings: Settings,
    /// The previous plugin's result (ADD) or the ADD's result (CHECK, DEL), as JSON.
    pub prev_result: Option<Value>,
    /// GC: the attachments the runtime still knows.
    pub valid_attachments: Option<Vec<Attachment>>,
}

/// Keys of the spec, or injected by runtimes, that ipq-cni reads no further.
const IGNORED_KEYS: [&str; 10] = [
    "type",
    "cniVersions",
    "args",
    "ipMasq",
    "ipam",
    "dns",
    "runtimeConfig",
    "capabilities",
    "disableCheck",
    "disableGC",
];

pub(crate) fn decode_error(what: impl std::fmt::Display) -> CniError {
    CniError::new(
        code::DECODING_FAILURE,
        format!("network config on stdin: {what}"),
    )
}

pub(crate) fn config_error(key: &str, why: impl std::fmt::Display) -> CniError {
    CniError::new(
        code::INVALID_NETWORK_CONFIG,
        format!("network config key {:?}: {why}", Echo(key).to_string()),
    )
}

/// The `cniVersion` of `stdin` if it has one, for the error object of a failure found later.
pub fn version_hint(stdin: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(stdin).ok()?;
    let version = value.get("cniVersion")?.as_str()?;
    SUPPORTED_VERSIONS
        .contains(&version)
        .then(|| version.to_owned())
}

/// Compares spec versions `a` and `b` (both `X.Y.Z`).
fn at_least(a: &str, b: &str) -> bool {
    let parse = |v: &str| -> Vec<u32> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parse(a) >= parse(b)
}

impl NetConf {
    /// Parses `stdin` for `command`.
    pub fn parse(stdin: &[u8], command: Command) -> Result<NetConf, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(decode_error)?;
        let Value::Object(map) = value else {
            return Err(decode_error("not a JSON object"));
        };
        let cni_version = parse_version(&map)?;
        if command == Command::Check && !at_least(&cni_version, "0.4.0") {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "config version {cni_version} does not allow CHECK: it needs cniVersion 0.4.0"
                ),
            ));
        }
        if matches!(command, Command::Gc | Command::Status) && !at_least(&cni_version, "1.1.0") {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "config version {cni_version} does not allow {}: it needs cniVersion 1.1.0",
                    command.as_ref()
                ),
            ));
        }
        let mut conf = NetConf {
            cni_version,
            name: None,
            settings: Settings::default(),
            prev_result: None,
            valid_attachments: None,
        };
        for (key, value) in &map {
            conf.apply(key, value)?;
        }
        Ok(conf)
    }

    fn apply(&mut self, key: &str, value: &Value) -> Result<(), CniError> {
        let string = || -> Result<&str, CniError> {
            match value {
                Value::String(s) if !s.is_empty() => Ok(s),
                _ => Err(config_error(
                    key,
                    format!(
                        "must be a non-empty string, not {}",
                        Echo(&value.to_string())
                    ),
                )),
            }
        };
        match key {
            "cniVersion" => {}
            "name" => self.name = Some(string()?.to_owned()),
            _ if self.settings.apply(key, key, value)? => {}
            "prevResult" => match value {
                Value::Object(_) => self.prev_result = Some(value.clone()),
                // Runtimes serialize an absent result as null.
                Value::Null => {}
                _ => {
                    return Err(decode_error(format!(
                        "prevResult must be a result object, not {}",
                        Echo(&value.to_string())
                    )))
                }
            },
            // libcni sends both names (the second one by mistake of an older spec draft).
            "cni.dev/valid-attachments" | "cni.dev/attachments" => {
                let attachments = parse_attachments(key, value)?;
                if key == "cni.dev/valid-attachments" || self.valid_attachments.is_none() {
                    self.valid_attachments = Some(attachments);
                }
            }
            _ if IGNORED_KEYS.contains(&key) => {}
            _ => {
                return Err(config_error(
                    key,
                    "unknown to ipq-cni (it takes socket, stateDir, onUnavailable, timeoutMs)",
                ))
            }
        }
        Ok(())
    }
}

pub(crate) fn parse_version(map: &Map<String, Value>) -> Result<String, CniError> {
    let version = match map.get("cniVersion") {
        None => {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!(
                    "the network config has no cniVersion; ipq-cni supports {}",
                    SUPPORTED_VERSIONS.join(", ")
                ),
            ))
        }
        Some(Value::String(v)) => v,
        Some(other) => {
            return Err(config_error(
                "cniVersion",
                format!("must be a string, not {other}"),
            ))
        }
    };
    if !SUPPORTED_VERSIONS.contains(&version.as_str()) {
        return Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!(
                "cniVersion {version:?} is not supported; ipq-cni supports {}",
                SUPPORTED_VERSIONS.join(", ")
            ),
        ));
    }
    Ok(version.clone())
}

/// `[{"containerID": "...", "ifname": "..."}, ...]`.
fn parse_attachments(key: &str, value: &Value) -> Result<Vec<Attachment>, CniError> {
    let Value::Array(items) = value else {
        return Err(config_error(
            key,
            format!("must be a list, not {}", Echo(&value.to_string())),
        ));
    };
    items
        .iter()
        .map(|item| {
            let field = |name: &str| item.get(name).and_then(Value::as_str).map(str::to_owned);
            match (field("containerID"), field("ifname")) {
                (Some(container_id), Some(ifname)) => Ok(Attachment {
                    container_id,
                    ifname,
                }),
                _ => Err(config_error(
                    key,
                    format!(
                        "entry {} needs string fields containerID and ifname",
                        Echo(&item.to_string())
                    ),
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
