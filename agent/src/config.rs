//! The agent's configuration: `agent.toml`, every key with a default, flags overriding keys.
//!
//! A bad configuration is refused at start with the key, the value and why. The file is read as
//! a TOML table and each key converted by hand, so that every error can name its key and value
//! the way an operator wrote them, and an unknown key (a typo) is an error rather than a silent
//! default.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use ipq_api::echo::{echo_lines, Echo};
pub use ipq_api::EarlyReusePolicy;
pub use ipq_common::config::Mode;
use thiserror::Error;
use toml::{Table, Value};

use crate::paths;

mod namespaces;
pub use namespaces::NamespaceScope;

/// How the TC programs are attached to workload interfaces (`tc_attach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcAttach {
    /// A netlink cls_bpf filter at once; where the kernel has TCX (probed at start), a TCX
    /// link replaces it in the background.
    Auto,
    /// TCX links only; an attach fails where the kernel lacks TCX.
    Tcx,
    /// A clsact qdisc and a direct-action cls_bpf filter over netlink, even where TCX exists.
    Netlink,
}

/// Which programs report other processes' bpf() calls (`bpf_watcher`): what finds a link
/// detached, a program put ahead of ipq's or a map written by another tool within
/// milliseconds instead of at the next periodic verification.
///
/// The default is [`Trampolines`](Self::Trampolines): a node agent must not tax the system
/// calls of the workloads beside it (the raw tracepoint measured +35 to +95 ns per call, up to
/// +45 % on a `getppid()`), so the fallback that does is the operator's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BpfWatcher {
    /// The trampolines on the kernel's bpf() path; where the kernel refuses them, the raw
    /// tracepoint on `sys_enter` (x86-64), which every system call of the node pays for.
    Auto,
    /// The trampolines only: where the kernel refuses them, no watcher (the periodic
    /// verification alone), and no other system call pays anything.
    Trampolines,
    /// No watcher: the periodic verification alone.
    Off,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interfaces {
    /// Globs of workload interface names (host side of pod veths, bridge ports).
    pub workload: Globs,
    /// Names of uplinks.
    pub uplink: Vec<String>,
}

/// Interface-name globs, compiled once: they are matched on every netlink event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Globs(Vec<glob::Pattern>);

impl Globs {
    /// Compiles `globs`; the first that is not a glob is the error.
    pub fn parse<S: AsRef<str>>(globs: &[S]) -> Result<Globs, (String, glob::PatternError)> {
        globs
            .iter()
            .map(|g| glob::Pattern::new(g.as_ref()).map_err(|e| (g.as_ref().to_owned(), e)))
            .collect::<Result<_, _>>()
            .map(Globs)
    }

    /// The first glob that matches `name`.
    pub fn matching(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|p| p.matches(name))
            .map(glob::Pattern::as_str)
    }

    /// The globs as written.
    pub fn as_strs(&self) -> Vec<&str> {
        self.0.iter().map(glob::Pattern::as_str).collect()
    }
}

/// Reuse hygiene (`[hygiene]`): what the node forgets about an address's old holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HygieneConfig {
    /// Delete the address's conntrack and neighbour entries when its holder is gone and when
    /// it gets a new holder.
    pub flush: bool,
    /// Flush a new holder's conntrack entries with the kernel's filtered flush where the
    /// start-up probe proves the kernel honours the filter (else, or when false, by a dump).
    pub filtered_flush: bool,
    /// Announce a new holder (gratuitous ARP, unsolicited NA) on its bridge.
    pub announce: bool,
    /// At most this many addresses announced per second (bursts of as many).
    pub announce_per_second: u32,
    /// Announce on the uplinks too (a shared L2 fabric).
    pub announce_on_uplinks: bool,
}

impl Default for HygieneConfig {
    fn default() -> Self {
        Self {
            flush: true,
            filtered_flush: true,
            announce: true,
            announce_per_second: 50,
            announce_on_uplinks: false,
        }
    }
}

/// Publishing this node's quarantine as a `NodeQuarantine` object (`[kubernetes]`,
/// docs/kubernetes.md). With no node name (neither `node_name` nor the `NODE_NAME` variable
/// the DaemonSet sets from the downward API) nothing is published and nothing is attempted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// The node's name; `None`: the `NODE_NAME` environment variable at start.
    pub node_name: Option<String>,
    /// A kubeconfig file to reach the API server with; `None`: the pod's service account
    /// (in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// Project each listed address into whereabouts' OverlappingRangeIPReservations
    /// (`crate::publish::whereabouts`); off by default.
    pub whereabouts: bool,
    /// whereabouts' namespace; `None`: `kube-system`, where its manifests install it.
    pub whereabouts_namespace: Option<String>,
    /// The whereabouts IPAM config's `network_name` (empty: the unnamed network).
    pub whereabouts_network_name: String,
    /// Write Kubernetes Events on the pods involved in conflicts, fences and held quarantines
    /// (`crate::pod_events`); on by default, wherever a node name is known.
    pub pod_events: bool,
    /// Between two writes of one pod's Event of one reason at least: every occurrence
    /// meanwhile is counted into the Event's series.
    pub pod_events_interval: Duration,
}

/// Default of `kubernetes.pod_events_interval`.
pub const DEFAULT_POD_EVENTS_INTERVAL: Duration = Duration::from_secs(60);

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            node_name: None,
            kubeconfig: None,
            whereabouts: false,
            whereabouts_namespace: None,
            whereabouts_network_name: String::new(),
            pod_events: true,
            pod_events_interval: DEFAULT_POD_EVENTS_INTERVAL,
        }
    }
}

/// Upper bound of `hygiene.announce_per_second`.
pub const MAX_ANNOUNCE_PER_SECOND: u32 = 10_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    pub on_early_reuse: EarlyReusePolicy,
    pub cooldown: Duration,
    pub quiet_period: Duration,
    pub max_cooldown: Duration,
    pub capacity: u32,
    pub bpffs_dir: PathBuf,
    pub state_dir: PathBuf,
    pub api_socket: PathBuf,
    /// A group (name or numeric gid) whose members may read the API (status, addresses,
    /// conflicts, events).
    pub api_group: Option<String>,
    /// A group whose members may also change things through the API (claims, drains,
    /// releases, GC, break-glass datapath writes); the IPAM routes stay root's.
    pub api_admin_group: Option<String>,
    /// The procfs a uid-0 peer's process is read from (its capabilities and user namespace):
    /// `/proc` unless the agent's own `/proc` shows only its PID namespace.
    pub api_peer_procfs: Option<PathBuf>,
    pub metrics_addr: SocketAddr,
    pub interfaces: Interfaces,
    pub tc_attach: TcAttach,
    pub bpf_watcher: BpfWatcher,
    /// How often the datapath is verified against what ipq believes (pins, links), off the
    /// owner loop.
    pub verify_interval: Duration,
    /// What ipq-ipam's ADD gets when the delegate's range is exhausted while ipq holds
    /// quarantined addresses of it.
    pub ipam_on_exhausted: ipq_api::OnExhausted,
    /// The CNI bin directories the agent runs ipq-ipam's delegates from (as root): a held
    /// release whose `cniPath` names none of them is refused.
    pub ipam_cni_bin_dirs: Vec<PathBuf>,
    pub hygiene: HygieneConfig,
    pub kubernetes: KubernetesConfig,
    /// Which pods' addresses are only observed (`observe_namespaces`, `enforce_namespaces`).
    pub namespaces: NamespaceScope,
}

/// Largest registry the datapath map is created with (16 Mi entries, ~1 GiB of kernel memory).
pub const MAX_CAPACITY: u32 = 1 << 24;

impl Default for Config {
    fn default() -> Self {
        Self {
            mode: Mode::Enforce,
            on_early_reuse: EarlyReusePolicy::FenceOld,
            cooldown: Duration::from_secs(30),
            quiet_period: Duration::from_secs(10),
            max_cooldown: Duration::from_secs(300),
            capacity: ipq_common::names::DEFAULT_ADDR_CAPACITY,
            bpffs_dir: paths::DEFAULT_BPFFS_DIR.into(),
            state_dir: paths::DEFAULT_STATE_DIR.into(),
            api_socket: paths::DEFAULT_API_SOCKET.into(),
            api_group: None,
            api_admin_group: None,
            api_peer_procfs: None,
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], 9740)),
            interfaces: Interfaces {
                // The host side of pod veths as the common CNIs name it: the reference plugins
                // (ptp, bridge), Calico, Cilium and the AWS VPC CNI.
                workload: Globs::parse(&["veth*", "cali*", "lxc*", "eni*"])
                    .expect("the built-in workload globs are globs"),
                uplink: Vec::new(),
            },
            tc_attach: TcAttach::Auto,
            bpf_watcher: BpfWatcher::Trampolines,
            verify_interval: Duration::from_secs(5),
            ipam_on_exhausted: ipq_api::OnExhausted::Wait,
            // Where the reference plugins go on Kubernetes nodes; a distribution's own plugin
            // dir (Debian's /usr/lib/cni) is trusted only when the operator says so.
            ipam_cni_bin_dirs: vec![PathBuf::from("/opt/cni/bin")],
            hygiene: HygieneConfig::default(),
            kubernetes: KubernetesConfig::default(),
            namespaces: NamespaceScope::Everywhere,
        }
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {source_name}: not valid TOML: {}", echo_lines(message))]
    Syntax {
        source_name: String,
        message: String,
    },
    #[error(
        "config {source_name}: unknown key `{}` (known keys: {known})",
        Echo(key)
    )]
    UnknownKey {
        source_name: String,
        key: String,
        known: String,
    },
    #[error("config {source_name}: `{}` = {}: {reason}", Echo(key), Echo(value))]
    Invalid {
        source_name: String,
        key: String,
        value: String,
        reason: String,
    },
}

/// Values given on the command line; each overrides the key of the same name (a name of
/// [`keys::KEYS`]).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// (key name, value) in the order given; a list key's flag may appear more than once.
    pub values: Vec<(&'static str, String)>,
}

impl Config {
    /// Loads `path`, or the defaults when no path is given and the default file does not exist,
    /// then applies `overrides` and validates the result.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Self, ConfigError> {
        let (text, source_name) = match path {
            Some(path) => (read(path)?, path.display().to_string()),
            None => {
                let default = Path::new(paths::DEFAULT_CONFIG);
                if default.exists() {
                    (read(default)?, default.display().to_string())
                } else {
                    (String::new(), "(built-in defaults)".to_owned())
                }
            }
        };
        let mut config = Self::from_toml(&text, &source_name)?;
        config.apply(overrides)?;
        config.validate("command line and config")?;
        Ok(config)
    }

    /// Parses and validates one TOML document.
    pub fn from_toml(text: &str, source_name: &str) -> Result<Self, ConfigError> {
        let table: Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax {
                source_name: source_name.to_owned(),
                message: e.to_string(),
            })?;
        let mut config = Self::default();
        let p = Parser { source_name };
        for (key, value) in &table {
            match key.as_str() {
                table if keys::tables().contains(&table) => {
                    let Value::Table(entries) = value else {
                        return Err(p.invalid(key, value, &format!("must be a table: [{table}]")));
                    };
                    for (sub, value) in entries {
                        let key = format!("{table}.{sub}");
                        match keys::key(&key) {
                            Some(known) => known.set(&mut config, &p, &key, value)?,
                            None => return Err(p.unknown(&key, keys::known_keys_of(table))),
                        }
                    }
                }
                // A quoted "hygiene.flush" at the top level is not `flush` under [hygiene].
                name => match keys::key(name).filter(|_| !name.contains('.')) {
                    Some(known) => known.set(&mut config, &p, key, value)?,
                    None => return Err(p.unknown(key, keys::known_keys())),
                },
            }
        }
        config.validate(source_name)?;
        Ok(config)
    }

    fn apply(&mut self, overrides: &Overrides) -> Result<(), ConfigError> {
        let p = Parser {
            source_name: "command line",
        };
        // Each key once, with every value given to its flag (a list's flag repeats).
        let mut names: Vec<&str> = Vec::new();
        for (name, _) in &overrides.values {
            if !names.contains(name) {
                names.push(name);
            }
        }
        for name in names {
            let Some(key) = keys::key(name) else {
                return Err(p.unknown(name, keys::known_keys()));
            };
            let raws: Vec<&str> = overrides
                .values
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, raw)| raw.as_str())
                .collect();
            let shown = format!("--{}", key.flag);
            key.set(self, &p, &shown, &key.value_of_all(&raws))?;
        }
        Ok(())
    }

    /// Checks that keys which are valid one by one are also valid together.
    fn validate(&self, source_name: &str) -> Result<(), ConfigError> {
        let invalid = |key: &str, value: String, reason: String| ConfigError::Invalid {
            source_name: source_name.to_owned(),
            key: key.to_owned(),
            value,
            reason,
        };
        let human = |d: Duration| format!("\"{}\"", humantime::format_duration(d));
        if self.max_cooldown < self.cooldown {
            return Err(invalid(
                "max_cooldown",
                human(self.max_cooldown),
                format!(
                    "must be at least cooldown ({})",
                    humantime::format_duration(self.cooldown)
                ),
            ));
        }
        if self.quiet_period > self.max_cooldown {
            return Err(invalid(
                "quiet_period",
                human(self.quiet_period),
                format!(
                    "must not exceed max_cooldown ({}): the quarantine could never end quietly",
                    humantime::format_duration(self.max_cooldown)
                ),
            ));
        }
        for uplink in &self.interfaces.uplink {
            if let Some(glob) = self.workload_glob_matching(uplink) {
                return Err(invalid(
                    "interfaces.uplink",
                    format!("\"{uplink}\""),
                    format!("also matches workload glob \"{glob}\": an interface has one role"),
                ));
            }
        }
        Ok(())
    }

    /// The first workload glob that matches `ifname`.
    pub fn workload_glob_matching(&self, ifname: &str) -> Option<&str> {
        self.interfaces.workload.matching(ifname)
    }

    pub fn is_uplink(&self, ifname: &str) -> bool {
        self.interfaces.uplink.iter().any(|u| u == ifname)
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })
}

pub mod keys;
mod parse;

use parse::Parser;
#[cfg(test)]
mod tests;
