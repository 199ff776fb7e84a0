//! A release ipq-ipam hands to the agent instead of running the delegate's DEL: everything the
//! agent needs to run that DEL later, as a runtime would have.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::cni_names;

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
    /// `CNI_NETNS`, if the runtime still had one (a DEL may come without). Kept for the
    /// record; the delegate's DEL runs without it ([`HeldRelease::del_env`]).
    pub netns: Option<String>,
    /// The allocation's addresses, from `prevResult`; empty when the runtime sent none (the
    /// agent then goes by its own record of the container's claims).
    pub addresses: Vec<IpAddr>,
    /// When ipq-ipam's DEL handed the release over (ms since the epoch); 0 in a release of an
    /// older ipq-ipam, which is taken as held when the agent started. A release the registry
    /// cannot vouch for (its journal was lost) waits `max_cooldown` from here.
    #[serde(default)]
    pub held_at_unix_ms: u64,
    /// The boot and its CLOCK_BOOTTIME at the hand-over, stamped by the agent: within that
    /// boot the releaser's waits count from here, never from the wall clock (which steps).
    /// Absent in a release of an older agent, or written by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_at_boot: Option<BootStamp>,
}

/// A moment as the kernel counts it within one boot: CLOCK_BOOTTIME (which counts across
/// suspend and never steps) and the boot it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootStamp {
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// CLOCK_BOOTTIME in nanoseconds.
    pub boottime_ns: u64,
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
        let names = [
            (
                "containerId",
                cni_names::check_container_id(&self.container_id),
            ),
            ("ifname", cni_names::check_ifname(&self.ifname)),
            (
                "network",
                self.network
                    .as_deref()
                    .map_or(Ok(()), cni_names::check_network_name),
            ),
        ];
        for (field, checked) in names {
            checked.map_err(|reason| InvalidRelease { field, reason })?;
        }
        if !is_plugin_name(&self.delegate_type) {
            return Err(InvalidRelease {
                field: "delegateType",
                reason: "not a plugin's file name (1 to 64 of letters, digits, '-', '_', '.', \
                         starting with a letter or digit): the agent runs it as root",
            });
        }
        if self.cni_path_dirs().any(|dir| !dir.is_absolute()) {
            return Err(InvalidRelease {
                field: "cniPath",
                reason: "holds a directory that is not an absolute path",
            });
        }
        if !self.delegate_conf.is_object() {
            return Err(InvalidRelease {
                field: "delegateConf",
                reason: "not an object (the delegate's network config)",
            });
        }
        // What ipq-ipam hands over is the network config with `ipam` replaced by the
        // delegate's section: any other plugin named here (the network's `bridge`, say) would
        // run a DEL that is not an IPAM's, against the container's interfaces.
        if self.delegate_conf["ipam"]["type"].as_str() != Some(self.delegate_type.as_str()) {
            return Err(InvalidRelease {
                field: "delegateType",
                reason: "is not the IPAM plugin of delegateConf (its ipam.type): the agent only \
                         runs the DEL of the IPAM plugin that made the allocation",
            });
        }
        // The network's own plugin named as its IPAM too: no allocation is made that way, and
        // its DEL would run itself as its IPAM, again and again.
        if self.delegate_conf["type"].as_str() == Some(self.delegate_type.as_str()) {
            return Err(InvalidRelease {
                field: "delegateType",
                reason: "is delegateConf's own plugin (its type), not an IPAM plugin it delegates \
                         to",
            });
        }
        Ok(())
    }

    /// The `cniPath` directories in order; an empty entry (`a::b`) names none.
    pub fn cni_path_dirs(&self) -> impl Iterator<Item = std::path::PathBuf> + '_ {
        std::env::split_paths(&self.cni_path).filter(|dir| !dir.as_os_str().is_empty())
    }

    /// The environment the delegate's DEL runs with. Never `CNI_NETNS`: by the time the
    /// quarantine is over the pod's netns is long gone (a runtime may send a DEL without one,
    /// so every plugin handles that), an IPAM plugin's DEL frees by container id and ifname,
    /// and a plugin that is not an IPAM (the network's bridge, named by a forged release)
    /// handed a live pod's netns would tear down that pod's interfaces as root.
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
        env
    }
}

/// Whether `name` is a plugin's bare file name: the agent runs `<trusted dir>/<name>` as root,
/// so nothing in it may leave the directory (`/`, `..`) or need quoting. Every plugin name in
/// use (host-local, static, dhcp, calico-ipam, whereabouts...) fits.
pub fn is_plugin_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release() -> HeldRelease {
        HeldRelease {
            network: Some("net".into()),
            cni_version: "1.0.0".into(),
            delegate_type: "host-local".into(),
            delegate_conf: serde_json::json!({"ipam": {"type": "host-local"}}),
            container_id: "c0ffee".into(),
            ifname: "eth0".into(),
            cni_args: None,
            cni_path: "/opt/cni/bin:/usr/lib/cni".into(),
            netns: None,
            addresses: Vec::new(),
            held_at_unix_ms: 0,
            held_at_boot: None,
        }
    }

    #[test]
    fn plugin_names_are_bare_file_names() {
        for good in [
            "host-local",
            "static",
            "dhcp",
            "calico-ipam",
            "azure_vnet.v2",
            "0x",
        ] {
            assert!(is_plugin_name(good), "{good}");
        }
        let long = "a".repeat(65);
        for bad in [
            "",
            ".",
            "..",
            "../bin/sh",
            "/bin/sh",
            "a/b",
            ".hidden",
            "-x",
            "a b",
            "a;b",
            "a\0",
            "h\u{e9}",
            &long,
        ] {
            assert!(!is_plugin_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_release_naming_a_path_as_its_delegate_is_refused() {
        assert!(release().validate().is_ok());
        for bad in ["../../bin/sh", "/bin/sh", "sub/host-local", "..", ""] {
            let err = HeldRelease {
                delegate_type: bad.into(),
                ..release()
            }
            .validate()
            .expect_err(bad);
            assert_eq!(err.field, "delegateType", "{bad:?}: {err}");
        }
    }

    /// The values an API caller could hand over to be stored and retried forever, or to
    /// become metric labels: each a 400 naming its field.
    #[test]
    fn hostile_names_are_refused_naming_the_field() {
        let huge_network = format!("net\n{}", "x\n".repeat(5 * 1024));
        let cases: [(&str, HeldRelease); 8] = [
            (
                "containerId",
                HeldRelease {
                    container_id: "c\0ffee".into(),
                    ..release()
                },
            ),
            (
                "containerId",
                HeldRelease {
                    container_id: "../../../../etc/passwd".into(),
                    ..release()
                },
            ),
            (
                "ifname",
                HeldRelease {
                    ifname: "eth0\0".into(),
                    ..release()
                },
            ),
            (
                "ifname",
                HeldRelease {
                    ifname: "../../x".into(),
                    ..release()
                },
            ),
            (
                "ifname",
                HeldRelease {
                    ifname: "..".into(),
                    ..release()
                },
            ),
            (
                "network",
                HeldRelease {
                    network: Some(huge_network),
                    ..release()
                },
            ),
            (
                "delegateType",
                HeldRelease {
                    delegate_type: "bridge".into(),
                    ..release()
                },
            ),
            (
                "delegateType",
                HeldRelease {
                    delegate_type: "bridge".into(),
                    delegate_conf: serde_json::json!({"type": "bridge", "ipam": {"type": "bridge"}}),
                    ..release()
                },
            ),
        ];
        for (field, bad) in cases {
            let err = bad.validate().expect_err(field);
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn the_delegate_del_never_gets_a_netns() {
        let held = HeldRelease {
            netns: Some("/var/run/netns/live-pod".into()),
            cni_args: Some("IgnoreUnknown=1".into()),
            ..release()
        };
        let env = held.del_env();
        assert!(env.iter().all(|(k, _)| *k != "CNI_NETNS"), "{env:?}");
        assert!(env.contains(&("CNI_CONTAINERID", "c0ffee")), "{env:?}");
        assert!(env.contains(&("CNI_ARGS", "IgnoreUnknown=1")), "{env:?}");
    }

    #[test]
    fn a_relative_cni_path_directory_is_refused() {
        for bad in ["bin", "/opt/cni/bin:.", "/opt/cni/bin:../x"] {
            let err = HeldRelease {
                cni_path: bad.into(),
                ..release()
            }
            .validate()
            .expect_err(bad);
            assert_eq!(err.field, "cniPath", "{bad:?}: {err}");
        }
        let dirs: Vec<_> = HeldRelease {
            cni_path: "/a::/b/".into(),
            ..release()
        }
        .cni_path_dirs()
        .collect();
        assert_eq!(
            dirs,
            [std::path::Path::new("/a"), std::path::Path::new("/b/")]
        );
    }
}

#[cfg(test)]
mod upgrade_tests {
    use super::HeldRelease;

    /// A release file as the first ipq-ipam wrote it (before `heldAtUnixMs`), and one from a
    /// newer ipq-ipam with a field this one does not know (a rollback): both are read, so a
    /// pending release survives an upgrade and a rollback of the agent.
    #[test]
    fn release_files_of_older_and_newer_versions_are_read() {
        let older = r#"{"network":"pods","cniVersion":"1.0.0","delegateType":"host-local",
            "delegateConf":{"type":"host-local"},"containerId":"c1","ifname":"eth0",
            "cniArgs":null,"cniPath":"/opt/cni/bin","netns":null,"addresses":["10.1.0.5"]}"#;
        let release: HeldRelease = serde_json::from_str(older).expect("an older release");
        assert_eq!(
            release.held_at_unix_ms, 0,
            "taken as held at the agent's start"
        );
        assert_eq!(
            release.addresses,
            ["10.1.0.5".parse::<std::net::IpAddr>().unwrap()]
        );

        let mut newer: serde_json::Value = serde_json::to_value(&release).unwrap();
        newer["heldAtUnixMs"] = 1_700_000_000_000u64.into();
        newer["someFutureField"] = serde_json::json!({"x": 1});
        let release: HeldRelease = serde_json::from_value(newer).expect("a newer release");
        assert_eq!(release.held_at_unix_ms, 1_700_000_000_000);
    }
}
