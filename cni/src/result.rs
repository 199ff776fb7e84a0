//! The previous plugin's result: what ipq-cni reads from it (the addresses and the interfaces)
//! and how it passes it on. The result is passed on as the JSON value it came as, so nothing
//! ipq-cni does not understand is lost; only `cniVersion` and the per-address `version` field
//! (present in 0.4.0, gone since 1.0.0) follow the config's version.

use std::net::IpAddr;

use ipq_api::echo::Echo;
use serde_json::Value;

use super::error::{code, CniError};

/// One entry of `interfaces`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    /// The namespace path for an interface inside a container; none for host-side ones.
    pub sandbox: Option<String>,
    /// Its MAC, as the plugin that made it reported it.
    pub mac: Option<String>,
}

/// What ipq-cni needs of a result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrevResult {
    /// Every address of `ips`, in order, without duplicates.
    pub addresses: Vec<IpAddr>,
    pub interfaces: Vec<Interface>,
}

fn decode_error(what: impl std::fmt::Display) -> CniError {
    CniError::new(code::DECODING_FAILURE, format!("prevResult: {what}"))
}

/// `10.1.0.5/24`, `fd00::5/64` (or a bare address) → the address.
fn parse_address(s: &str) -> Option<IpAddr> {
    let addr = match s.split_once('/') {
        Some((addr, prefix)) => {
            prefix.parse::<u8>().ok()?;
            addr
        }
        None => s,
    };
    addr.parse().ok()
}

impl PrevResult {
    pub fn parse(value: &Value) -> Result<PrevResult, CniError> {
        let list = |key: &str| -> Result<&[Value], CniError> {
            match value.get(key) {
                None | Some(Value::Null) => Ok(&[]),
                Some(Value::Array(items)) => Ok(items),
                Some(other) => Err(decode_error(format!(
                    "{key} must be a list, not {}",
                    Echo(&other.to_string())
                ))),
            }
        };
        let mut addresses = Vec::new();
        for ip in list("ips")? {
            let text = ip.get("address").and_then(Value::as_str).ok_or_else(|| {
                decode_error(format!(
                    "ips entry {} has no address string",
                    Echo(&ip.to_string())
                ))
            })?;
            let addr = parse_address(text).ok_or_else(|| {
                decode_error(format!(
                    "ips entry address {:?} is not an IP/prefix",
                    Echo(text).to_string()
                ))
            })?;
            if !addresses.contains(&addr) {
                addresses.push(addr);
            }
        }
        let interfaces = list("interfaces")?
            .iter()
            .map(|iface| {
                let name = iface
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| {
                        decode_error(format!(
                            "interfaces entry {} has no name string",
                            Echo(&iface.to_string())
                        ))
                    })?;
                let sandbox = match iface.get("sandbox") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(s)) => (!s.is_empty()).then(|| s.clone()),
                    Some(other) => {
                        return Err(decode_error(format!(
                            "interface {:?} has sandbox {}, not a string",
                            Echo(name).to_string(),
                            Echo(&other.to_string())
                        )))
                    }
                };
                let mac = iface.get("mac").and_then(Value::as_str).map(str::to_owned);
                Ok(Interface {
                    name: name.to_owned(),
                    sandbox,
                    mac,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(PrevResult {
            addresses,
            interfaces,
        })
    }
}

/// `prev` as the result of a plugin run with config version `cni_version`.
pub fn pass_on(prev: &Value, cni_version: &str) -> Value {
    let mut out = prev.clone();
    let Value::Object(map) = &mut out else {
        return out;
    };
    map.insert("cniVersion".into(), Value::String(cni_version.to_owned()));
    let legacy = cni_version.starts_with("0.");
    if let Some(Value::Array(ips)) = map.get_mut("ips") {
        for ip in ips.iter_mut().filter_map(Value::as_object_mut) {
            if !legacy {
                ip.remove("version");
                continue;
            }
            if ip.contains_key("version") {
                continue;
            }
            let family = ip
                .get("address")
                .and_then(Value::as_str)
                .and_then(parse_address)
                .map(|a| if a.is_ipv4() { "4" } else { "6" });
            if let Some(family) = family {
                ip.insert("version".into(), Value::String(family.into()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What the Debian bridge plugin prints for spec 0.4.0, dual-stack.
    fn bridge_v040() -> Value {
        json!({
            "cniVersion": "0.4.0",
            "interfaces": [
                {"name": "cni0", "mac": "36:1c:0b:0c:49:3a"},
                {"name": "veth1f2e3d4c", "mac": "4e:01:02:03:04:05"},
                {"name": "eth0", "mac": "0a:58:0a:58:00:05", "sandbox": "/var/run/netns/blue"}
            ],
            "ips": [
                {"version": "4", "interface": 2, "address": "10.88.0.5/24", "gateway": "10.88.0.1"},
                {"version": "6", "interface": 2, "address": "fd88::5/64", "gateway": "fd88::1"}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    /// What the ptp plugin prints for spec 1.0.0.
    fn ptp_v100() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "veth0a1b2c3d", "mac": "4e:01:02:03:04:05"},
                {"name": "eth0", "mac": "0a:58:0a:58:00:05", "sandbox": "/var/run/netns/blue"}
            ],
            "ips": [
                {"interface": 1, "address": "10.89.0.7/24", "gateway": "10.89.0.1"},
                {"interface": 1, "address": "fd89::7/64", "gateway": "fd89::1"}
            ],
            "dns": {}
        })
    }

    #[test]
    fn reads_addresses_and_interfaces_of_both_versions() {
        let bridge = PrevResult::parse(&bridge_v040()).unwrap();
        assert_eq!(
            bridge.addresses,
            [
                "10.88.0.5".parse::<IpAddr>().unwrap(),
                "fd88::5".parse().unwrap()
            ]
        );
        assert_eq!(bridge.interfaces.len(), 3);
        assert_eq!(
            bridge.interfaces[2].sandbox.as_deref(),
            Some("/var/run/netns/blue")
        );
        let ptp = PrevResult::parse(&ptp_v100()).unwrap();
        assert_eq!(
            ptp.addresses,
            [
                "10.89.0.7".parse::<IpAddr>().unwrap(),
                "fd89::7".parse().unwrap()
            ]
        );
        assert_eq!(ptp.interfaces[0].sandbox, None);
    }

    #[test]
    fn tolerates_absent_lists_and_duplicates() {
        assert_eq!(
            PrevResult::parse(&json!({"cniVersion": "1.0.0"})).unwrap(),
            PrevResult::default()
        );
        let dup = json!({"ips": [{"address": "10.0.0.1/32"}, {"address": "10.0.0.1/24"}, {"address": "10.0.0.2"}],
                         "interfaces": [{"name": "a", "sandbox": ""}]});
        let parsed = PrevResult::parse(&dup).unwrap();
        assert_eq!(parsed.addresses.len(), 2);
        assert_eq!(
            parsed.interfaces[0].sandbox, None,
            "an empty sandbox is the host"
        );
    }

    #[test]
    fn malformed_results_are_decoding_failures() {
        for bad in [
            json!({"ips": {}}),
            json!({"ips": [{"address": 5}]}),
            json!({"ips": [{"gateway": "10.0.0.1"}]}),
            json!({"ips": [{"address": "10.0.0.300/24"}]}),
            json!({"ips": [{"address": "10.0.0.3/abc"}]}),
            json!({"interfaces": "eth0"}),
            json!({"interfaces": [{"mac": "x"}]}),
            json!({"interfaces": [{"name": "a", "sandbox": 3}]}),
        ] {
            let err = PrevResult::parse(&bad).expect_err(&bad.to_string());
            assert_eq!(err.code, code::DECODING_FAILURE, "{bad}: {err}");
        }
    }

    #[test]
    fn passes_the_result_on_unchanged_in_its_own_version() {
        for prev in [bridge_v040(), ptp_v100()] {
            let version = prev["cniVersion"].as_str().unwrap().to_owned();
            assert_eq!(pass_on(&prev, &version), prev);
        }
    }

    #[test]
    fn converts_the_address_version_field_between_specs() {
        let up = pass_on(&bridge_v040(), "1.0.0");
        assert_eq!(up["cniVersion"], "1.0.0");
        assert!(up["ips"]
            .as_array()
            .unwrap()
            .iter()
            .all(|ip| ip.get("version").is_none()));
        assert_eq!(
            up["routes"],
            bridge_v040()["routes"],
            "the rest is untouched"
        );
        let down = pass_on(&ptp_v100(), "0.4.0");
        assert_eq!(down["ips"][0]["version"], "4");
        assert_eq!(down["ips"][1]["version"], "6");
        assert_eq!(pass_on(&down, "1.0.0"), ptp_v100());
    }
}
