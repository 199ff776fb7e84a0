//! Which host-side interface holds the container's addresses: of the result's `interfaces`
//! without a `sandbox`, the one that is not a bridge (the bridge plugin lists its bridge and
//! the pod's veth; ptp lists the veth alone).
//!
//! Bridges are recognised through rtnetlink in the current network namespace, not through
//! `/sys/class/net`: sysfs shows the namespace of whoever mounted it, which is not the
//! runtime's when it enters a node namespace with `setns` alone.

mod link_kind;

use ipq_api::echo::Echo;

use self::link_kind::link_kind;
pub use self::link_kind::LinkKind;
use crate::{
    error::{code, CniError},
    ifname::valid_ifname,
    result::PrevResult,
};

/// The host-side interface among `candidates` (name and kind), or why there is none.
pub fn choose(candidates: &[(String, LinkKind)]) -> Result<String, CniError> {
    let ports: Vec<&str> = candidates
        .iter()
        .filter(|(_, kind)| *kind != LinkKind::Bridge)
        .map(|(name, _)| name.as_str())
        .collect();
    match ports[..] {
        [one] => Ok(one.to_owned()),
        [] => Err(CniError::new(
            code::NO_HOST_INTERFACE,
            format!(
                "prevResult names no host-side interface other than bridges ({}): ipq-cni must \
                 follow a plugin that creates the container's host-side interface, such as \
                 bridge or ptp",
                if candidates.is_empty() {
                    "it lists none without a sandbox".to_owned()
                } else {
                    candidates
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        )),
        _ => Err(CniError::new(
            code::NO_HOST_INTERFACE,
            format!(
                "prevResult names {} host-side interfaces that are not bridges ({}): ipq-cni \
                 cannot tell which one holds the container's addresses",
                ports.len(),
                ports.join(", ")
            ),
        )),
    }
}

/// The host-side interfaces of `prev` (those without a sandbox), each a name the kernel could
/// hold: anything else is refused before it reaches netlink, naming its field.
pub fn host_side_names(prev: &PrevResult) -> Result<Vec<&str>, CniError> {
    let mut names = Vec::new();
    for (i, iface) in prev.interfaces.iter().enumerate() {
        if iface.sandbox.is_some() {
            continue;
        }
        if !valid_ifname(&iface.name) {
            return Err(CniError::new(
                code::INVALID_NETWORK_CONFIG,
                format!(
                    "prevResult.interfaces[{i}].name {:?} ({} bytes): not an interface name \
                     (1 to 15 bytes, no '/', ':' or spaces)",
                    Echo(&iface.name).to_string(),
                    iface.name.len()
                ),
            ));
        }
        names.push(iface.name.as_str());
    }
    Ok(names)
}

/// The host-side interface of `prev`, looked up in the current network namespace.
pub fn host_interface(prev: &PrevResult) -> Result<String, CniError> {
    let names = host_side_names(prev)?;
    let mut candidates = Vec::with_capacity(names.len());
    for name in names {
        candidates.push((name.to_owned(), link_kind(name)?));
    }
    choose(&candidates)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::Interface;

    fn c(list: &[(&str, LinkKind)]) -> Vec<(String, LinkKind)> {
        list.iter().map(|(n, k)| (n.to_string(), *k)).collect()
    }

    #[test]
    fn the_one_port_beside_a_bridge() {
        let bridge = c(&[("cni0", LinkKind::Bridge), ("veth1", LinkKind::Other)]);
        assert_eq!(choose(&bridge).unwrap(), "veth1");
        assert_eq!(choose(&c(&[("veth2", LinkKind::Other)])).unwrap(), "veth2");
        // A veth already gone is still the one named; the agent reports it unknown.
        assert_eq!(
            choose(&c(&[("veth3", LinkKind::Missing)])).unwrap(),
            "veth3"
        );
    }

    #[test]
    fn none_or_several_is_an_error_naming_them() {
        for (list, needle) in [
            (c(&[]), "lists none"),
            (c(&[("cni0", LinkKind::Bridge)]), "cni0"),
            (
                c(&[("veth1", LinkKind::Other), ("veth2", LinkKind::Missing)]),
                "veth1, veth2",
            ),
        ] {
            let err = choose(&list).unwrap_err();
            assert_eq!(err.code, code::NO_HOST_INTERFACE);
            assert!(err.msg.contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn host_side_names_the_kernel_cannot_hold_are_refused_naming_the_field() {
        let prev = |name: String| PrevResult {
            addresses: Vec::new(),
            interfaces: vec![
                Interface {
                    name: "eth0".into(),
                    sandbox: Some("/run/netns/x".into()),
                    mac: None,
                },
                Interface {
                    name,
                    sandbox: None,
                    mac: None,
                },
            ],
        };
        assert_eq!(
            host_side_names(&prev("veth0123456789a".into())).unwrap(),
            ["veth0123456789a"]
        );
        for name in ["veth0123456789ab".to_owned(), "v".repeat(100_000)] {
            let err = host_side_names(&prev(name.clone())).unwrap_err();
            assert_eq!(err.code, code::INVALID_NETWORK_CONFIG);
            assert!(err.msg.contains("prevResult.interfaces[1].name"), "{err}");
            assert!(
                err.msg.contains(&format!("({} bytes)", name.len())),
                "{err}"
            );
            assert!(err.msg.len() < 300, "{err}");
        }
    }
}
