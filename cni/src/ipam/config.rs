//! The network config `ipq-ipam` gets on stdin: the main plugin's whole config, whose `ipam`
//! section is ipq-ipam's own (`type`, `delegate`, and the settings it shares with ipq-cni).

use ipq_api::echo::Echo;
use serde_json::{Map, Value};

use super::super::{
    config::{config_error, decode_error, parse_version, Settings},
    error::CniError,
};

/// ipq-ipam's own type name: a delegate of this type would run ipq-ipam again, forever.
pub const PLUGIN_TYPE: &str = "ipq-ipam";

/// One invocation's config.
#[derive(Clone, Debug, PartialEq)]
pub struct IpamConf {
    pub cni_version: String,
    /// The network's `name`, which host-local keys its store by.
    pub network: Option<String>,
    pub settings: Settings,
    /// The delegate's `type`: the binary to find on `CNI_PATH`.
    pub delegate_type: String,
    /// What the delegate gets on stdin: the whole config with `ipam` replaced by the delegate's.
    pub delegate_conf: Value,
    /// The main plugin's `prevResult` (DEL, CHECK), if any.
    pub prev_result: Option<Value>,
}

impl IpamConf {
    /// Parses the whole network config on `stdin`.
    pub fn parse(stdin: &[u8]) -> Result<IpamConf, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(decode_error)?;
        let Value::Object(mut map) = value else {
            return Err(decode_error("not a JSON object"));
        };
        let cni_version = parse_version(&map)?;
        let network = match map.get("name") {
            None => None,
            Some(Value::String(name)) if !name.is_empty() => Some(name.clone()),
            Some(other) => {
                return Err(config_error(
                    "name",
                    format!(
                        "must be a non-empty string, not {}",
                        Echo(&other.to_string())
                    ),
                ))
            }
        };
        let prev_result = match map.get("prevResult") {
            Some(value @ Value::Object(_)) => Some(value.clone()),
            _ => None,
        };
        let Some(Value::Object(ipam)) = map.remove("ipam") else {
            return Err(config_error(
                "ipam",
                "is missing or not an object: ipq-ipam is an IPAM plugin and reads its own \
                 section, {\"type\": \"ipq-ipam\", \"delegate\": {...}}",
            ));
        };
        let (settings, delegate) = parse_ipam(&ipam)?;
        let delegate_type = delegate_type(&delegate)?;
        map.insert("ipam".into(), delegate);
        Ok(IpamConf {
            cni_version,
            network,
            settings,
            delegate_type,
            delegate_conf: Value::Object(map),
            prev_result,
        })
    }
}

/// The `ipam` section: the shared settings and the delegate's section.
fn parse_ipam(ipam: &Map<String, Value>) -> Result<(Settings, Value), CniError> {
    let mut settings = Settings::default();
    let mut delegate = None;
    for (key, value) in ipam {
        let named = format!("ipam.{key}");
        match key.as_str() {
            "type" => {}
            "delegate" => delegate = Some(value.clone()),
            _ => {
                if !settings.apply(key, &named, value)? {
                    return Err(config_error(
                        &named,
                        "unknown to ipq-ipam (it takes type, delegate, socket, stateDir, \
                         onUnavailable, timeoutMs)",
                    ));
                }
            }
        }
    }
    let delegate = delegate.ok_or_else(|| {
        config_error(
            "ipam.delegate",
            "is missing: ipq-ipam wraps the node's IPAM plugin, \
             e.g. {\"type\": \"host-local\", \"ranges\": [...]}",
        )
    })?;
    Ok((settings, delegate))
}

/// The delegate's `type`: a plugin's file name, not ipq-ipam itself. As strict as the agent,
/// which refuses to hold a release for any other (it runs the DEL as root): a config it would
/// refuse fails at ADD, not at the pod's DEL.
fn delegate_type(delegate: &Value) -> Result<String, CniError> {
    let Value::Object(section) = delegate else {
        return Err(config_error(
            "ipam.delegate",
            format!("must be an object, not {}", Echo(&delegate.to_string())),
        ));
    };
    match section.get("type") {
        Some(Value::String(kind)) if ipq_api::model::is_plugin_name(kind) => {
            if kind == PLUGIN_TYPE {
                return Err(config_error(
                    "ipam.delegate.type",
                    "is ipq-ipam itself: name the IPAM plugin it wraps (host-local, static...)",
                ));
            }
            Ok(kind.clone())
        }
        other => Err(config_error(
            "ipam.delegate.type",
            format!(
                "must be a plugin's file name (host-local, static...), not {}",
                Echo(
                    &other
                        .map(Value::to_string)
                        .unwrap_or_else(|| "missing".into())
                )
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::error::code;

    fn parse(value: Value) -> Result<IpamConf, CniError> {
        IpamConf::parse(value.to_string().as_bytes())
    }

    fn assert_error(value: Value, code: u32, needle: &str) {
        let err = parse(value).expect_err("must fail");
        assert_eq!(err.code, code, "{err}");
        assert!(err.msg.contains(needle), "{needle:?} not in {err}");
    }

    #[test]
    fn the_delegate_replaces_ipam_and_every_other_key_stays() {
        let conf = parse(json!({
            "cniVersion": "1.0.0", "name": "net", "type": "bridge", "bridge": "cni0",
            "ipam": {"type": "ipq-ipam", "socket": "/tmp/s.sock", "stateDir": "/tmp/st",
                     "timeoutMs": 150,
                     "delegate": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/29"}]]}},
            "prevResult": {"cniVersion": "1.0.0", "ips": []},
        }))
        .unwrap();
        assert_eq!(conf.network.as_deref(), Some("net"));
        assert_eq!(conf.delegate_type, "host-local");
        assert_eq!(conf.settings.socket, std::path::Path::new("/tmp/s.sock"));
        assert_eq!(conf.settings.state_dir, std::path::Path::new("/tmp/st"));
        assert_eq!(conf.settings.timeout.as_millis(), 150);
        assert!(conf.prev_result.is_some());
        assert_eq!(
            conf.delegate_conf,
            json!({
                "cniVersion": "1.0.0", "name": "net", "type": "bridge", "bridge": "cni0",
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.1.0.0/29"}]]},
                "prevResult": {"cniVersion": "1.0.0", "ips": []},
            })
        );
    }

    #[test]
    fn bad_input_is_named() {
        let with_ipam = |ipam: Value| json!({"cniVersion": "1.0.0", "name": "n", "ipam": ipam});
        assert_error(json!({"cniVersion": "1.0.0"}), 7, "\"ipam\"");
        assert_error(with_ipam(json!("host-local")), 7, "\"ipam\"");
        assert_error(
            with_ipam(json!({"type": "ipq-ipam"})),
            7,
            "\"ipam.delegate\"",
        );
        assert_error(
            with_ipam(json!({"type": "ipq-ipam", "delegate": []})),
            7,
            "\"ipam.delegate\"",
        );
        for bad in [
            json!({}),
            json!({"type": ""}),
            json!({"type": "../x"}),
            json!({"type": "host local"}),
            json!({"type": 3}),
        ] {
            assert_error(
                with_ipam(json!({"type": "ipq-ipam", "delegate": bad})),
                7,
                "\"ipam.delegate.type\"",
            );
        }
        assert_error(
            with_ipam(json!({"type": "ipq-ipam", "delegate": {"type": "ipq-ipam"}})),
            7,
            "ipq-ipam itself",
        );
        let delegate = json!({"type": "host-local"});
        assert_error(
            with_ipam(json!({"type": "ipq-ipam", "delegate": delegate, "sockett": "/x"})),
            7,
            "\"ipam.sockett\"",
        );
        assert_error(
            with_ipam(json!({"type": "ipq-ipam", "delegate": delegate, "timeoutMs": 0})),
            7,
            "\"ipam.timeoutMs\"",
        );
        assert_error(
            json!({"name": "n"}),
            code::INCOMPATIBLE_VERSION,
            "cniVersion",
        );
        let err = IpamConf::parse(b"{").expect_err("not JSON");
        assert_eq!(err.code, code::DECODING_FAILURE);
    }
}
