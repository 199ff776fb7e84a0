//! The `CNI_*` environment variables of one invocation, checked as the spec requires per
//! command. Every failure is code 4 and names the variable.

use std::ffi::OsString;

use ipq_api::PodRef;

use super::error::{code, CniError};

/// The CNI commands.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
    strum::EnumString,
)]
#[strum(serialize_all = "UPPERCASE")]
pub enum Command {
    Add,
    Del,
    Check,
    Gc,
    Status,
    Version,
}

impl Command {
    fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }

    /// ADD, CHECK and DEL act on one attachment (container id + interface name).
    const fn names_attachment(self) -> bool {
        matches!(self, Self::Add | Self::Check | Self::Del)
    }
}

/// What the runtime said about one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    /// The attachment's container (ADD, CHECK, DEL).
    pub container_id: Option<String>,
    /// The container's network namespace (required for ADD and CHECK; DEL may come without).
    pub netns: Option<String>,
    /// The interface inside the container (ADD, CHECK, DEL).
    pub ifname: Option<String>,
    /// `K8S_POD_NAMESPACE` / `K8S_POD_NAME` / `K8S_POD_UID` from `CNI_ARGS`, when both the
    /// namespace and the name are there.
    pub pod: Option<PodRef>,
    /// Where delegated plugins live; ipq-cni delegates nothing but the spec requires it.
    pub path: Option<String>,
}

fn invalid(var: &str, why: impl std::fmt::Display) -> CniError {
    CniError::new(code::INVALID_ENVIRONMENT, format!("{var} {why}"))
}

impl Env {
    /// Reads the variables through `var` (the process environment, or a map in tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<OsString>) -> Result<Env, CniError> {
        let text = |name: &str| -> Result<Option<String>, CniError> {
            match var(name) {
                None => Ok(None),
                Some(value) => value
                    .into_string()
                    .map(|s| (!s.is_empty()).then_some(s))
                    .map_err(|_| invalid(name, "is not valid UTF-8")),
            }
        };
        let command = match text("CNI_COMMAND")? {
            None => return Err(invalid("CNI_COMMAND", "is missing")),
            Some(s) => Command::parse(&s).ok_or_else(|| {
                invalid(
                    "CNI_COMMAND",
                    format!("is {s:?}, not one of ADD, DEL, CHECK, GC, STATUS, VERSION"),
                )
            })?,
        };
        let required = |name: &str, needed: bool| -> Result<Option<String>, CniError> {
            let value = text(name)?;
            if needed && value.is_none() {
                return Err(invalid(
                    name,
                    format!("is missing (required for {})", command),
                ));
            }
            Ok(value)
        };
        let attachment = command.names_attachment();
        let container_id = required("CNI_CONTAINERID", attachment)?;
        if let Some(id) = &container_id {
            validate_container_id(id)?;
        }
        let netns = required(
            "CNI_NETNS",
            matches!(command, Command::Add | Command::Check),
        )?;
        let ifname = required("CNI_IFNAME", attachment)?;
        if let Some(name) = &ifname {
            validate_ifname(name)?;
        }
        let path = required("CNI_PATH", attachment || matches!(command, Command::Gc))?;
        let pod = match text("CNI_ARGS")? {
            Some(args) if command != Command::Version => pod_from_args(&args)?,
            _ => None,
        };
        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            pod,
            path,
        })
    }

    /// Reads the process environment.
    pub fn from_process() -> Result<Env, CniError> {
        Self::from_lookup(|name| std::env::var_os(name))
    }
}

/// As the reference `skel`: a letter or digit, then letters, digits, `_`, `.` or `-`.
fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
        return Err(invalid(
            "CNI_CONTAINERID",
            format!("is {id:?}: must start with a letter or digit and hold only letters, digits, '_', '.' and '-'"),
        ));
    }
    Ok(())
}

/// A Linux interface name: at most 15 bytes, not `.` or `..`, no `/`, `:` or whitespace.
fn validate_ifname(name: &str) -> Result<(), CniError> {
    // Empty is reported as missing before this.
    if !name.is_empty() && !crate::ifname::valid_ifname(name) {
        return Err(invalid(
            "CNI_IFNAME",
            format!(
                "is {:?}: not a valid interface name (at most 15 bytes, no '/', ':' or spaces)",
                ipq_api::echo::Echo(name).to_string()
            ),
        ));
    }
    Ok(())
}

/// `CNI_ARGS` is `KEY=VALUE;KEY=VALUE`. Only the pod's identity matters to ipq; other keys
/// (`IgnoreUnknown`, `IP`, `K8S_POD_INFRA_CONTAINER_ID`...) are for other plugins.
fn pod_from_args(args: &str) -> Result<Option<PodRef>, CniError> {
    let (mut namespace, mut name, mut uid) = (None, None, None);
    for pair in args.split(';').filter(|p| !p.is_empty()) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(invalid(
                "CNI_ARGS",
                format!("has {pair:?}, not KEY=VALUE (pairs are separated by ';')"),
            ));
        };
        let value = (!value.is_empty()).then(|| value.to_owned());
        match key {
            "K8S_POD_NAMESPACE" => namespace = value,
            "K8S_POD_NAME" => name = value,
            "K8S_POD_UID" => uid = value,
            _ => {}
        }
    }
    Ok(match (namespace, name) {
        (Some(namespace), Some(name)) => Some(PodRef {
            namespace,
            name,
            uid,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        Env::from_lookup(|name| map.get(name).cloned())
    }

    /// A command is spelled as the spec's `CNI_COMMAND` has it, and read back from it.
    #[test]
    fn commands_are_spelled_as_the_spec_has_them() {
        use Command::*;
        for (command, spelled) in [
            (Add, "ADD"),
            (Del, "DEL"),
            (Check, "CHECK"),
            (Gc, "GC"),
            (Status, "STATUS"),
            (Version, "VERSION"),
        ] {
            assert_eq!(<&str>::from(command), spelled);
            assert_eq!(command.as_ref(), spelled);
            assert_eq!(command.to_string(), spelled);
            assert_eq!(Command::parse(spelled), Some(command));
        }
        assert_eq!(Command::parse("add"), None);
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c0ffee"),
        ("CNI_NETNS", "/var/run/netns/blue"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/usr/lib/cni"),
    ];

    fn without(
        vars: &[(&'static str, &'static str)],
        name: &str,
    ) -> Vec<(&'static str, &'static str)> {
        vars.iter().copied().filter(|(k, _)| *k != name).collect()
    }

    fn with(
        vars: &[(&'static str, &'static str)],
        name: &'static str,
        value: &'static str,
    ) -> Vec<(&'static str, &'static str)> {
        let mut out = without(vars, name);
        out.push((name, value));
        out
    }

    fn assert_env_error(result: Result<Env, CniError>, var: &str) {
        let err = result.expect_err("must fail");
        assert_eq!(err.code, code::INVALID_ENVIRONMENT, "{err}");
        assert!(err.msg.contains(var), "{var} not named in {err}");
    }

    #[test]
    fn a_full_add_parses() {
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;K8S_POD_UID=u-1;K8S_POD_INFRA_CONTAINER_ID=c0ffee";
        let parsed = env(&with(ADD, "CNI_ARGS", args)).unwrap();
        assert_eq!(parsed.command, Command::Add);
        assert_eq!(parsed.container_id.as_deref(), Some("c0ffee"));
        assert_eq!(parsed.netns.as_deref(), Some("/var/run/netns/blue"));
        assert_eq!(parsed.ifname.as_deref(), Some("eth0"));
        assert_eq!(
            parsed.pod,
            Some(PodRef {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: Some("u-1".into())
            })
        );
    }

    #[test]
    fn a_pod_needs_namespace_and_name() {
        let parsed = env(&with(ADD, "CNI_ARGS", "K8S_POD_NAME=web-0;IP=10.0.0.5")).unwrap();
        assert_eq!(parsed.pod, None);
        assert_env_error(env(&with(ADD, "CNI_ARGS", "K8S_POD_NAME")), "CNI_ARGS");
    }

    #[test]
    fn the_command_is_required_and_known() {
        assert_env_error(env(&without(ADD, "CNI_COMMAND")), "CNI_COMMAND");
        assert_env_error(env(&with(ADD, "CNI_COMMAND", "ADDD")), "CNI_COMMAND");
        assert_env_error(env(&with(ADD, "CNI_COMMAND", "")), "CNI_COMMAND");
    }

    #[test]
    fn each_command_requires_its_variables() {
        for command in ["ADD", "CHECK", "DEL"] {
            let vars = with(ADD, "CNI_COMMAND", command);
            for var in ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"] {
                assert_env_error(env(&without(&vars, var)), var);
            }
        }
        for command in ["ADD", "CHECK"] {
            let vars = with(ADD, "CNI_COMMAND", command);
            assert_env_error(env(&without(&vars, "CNI_NETNS")), "CNI_NETNS");
        }
        // A DEL may come after the namespace is gone.
        let del = without(&with(ADD, "CNI_COMMAND", "DEL"), "CNI_NETNS");
        assert_eq!(env(&del).unwrap().netns, None);
        // GC names no attachment; STATUS and VERSION need nothing but the command.
        let gc = [("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")];
        assert_eq!(env(&gc).unwrap().command, Command::Gc);
        assert_env_error(env(&[("CNI_COMMAND", "GC")]), "CNI_PATH");
        assert_eq!(
            env(&[("CNI_COMMAND", "STATUS")]).unwrap().command,
            Command::Status
        );
        assert_eq!(
            env(&[("CNI_COMMAND", "VERSION")]).unwrap().command,
            Command::Version
        );
    }

    #[test]
    fn malformed_identifiers_are_refused() {
        for bad in ["-abc", "a b", "a/b", "ü"] {
            assert_env_error(env(&with(ADD, "CNI_CONTAINERID", bad)), "CNI_CONTAINERID");
        }
        for bad in ["a-name-much-too-long", ".", "..", "eth/0", "eth:0", "eth 0"] {
            assert_env_error(env(&with(ADD, "CNI_IFNAME", bad)), "CNI_IFNAME");
        }
    }

    #[test]
    fn non_utf8_values_are_refused() {
        use std::os::unix::ffi::OsStringExt as _;
        let result = Env::from_lookup(|name| match name {
            "CNI_COMMAND" => Some(OsString::from("DEL")),
            "CNI_CONTAINERID" => Some(OsString::from_vec(vec![0x61, 0xff])),
            _ => Some(OsString::from("x")),
        });
        assert_env_error(result, "CNI_CONTAINERID");
    }
}
