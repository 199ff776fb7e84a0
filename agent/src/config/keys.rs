//! Every top-level configuration key, in one table: its name in `agent.toml`, its command-line
//! flag, its help, and how its value is converted and stored. The TOML reader, the command-line
//! overrides, the `ipq-agent` flags and the "known keys" of an error all come from here.
//! Keys of a table are named with their table (`hygiene.flush` is `flush` under `[hygiene]`);
//! the tables themselves (`[interfaces]`, `[hygiene]`) are the prefixes of those names.

use toml::Value;

use super::{Config, ConfigError, Parser};

/// How a command-line value is read before it is converted like the TOML value would be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A TOML string.
    Text,
    /// A TOML integer (a command-line value that is not a number stays text, and is refused
    /// naming the flag).
    Integer,
    /// A TOML boolean (`true` or `false` on the command line; anything else stays text, and is
    /// refused naming the flag).
    Boolean,
    /// A TOML array of strings: the flag is repeatable, each occurrence one element, and the
    /// flags together replace the file's list.
    List,
}

type Setter = fn(&mut Config, &Parser<'_>, &str, &Value) -> Result<(), ConfigError>;

/// One top-level key.
pub struct Key {
    /// As written in `agent.toml`.
    pub name: &'static str,
    /// The `ipq-agent` flag that overrides it.
    pub flag: &'static str,
    /// A shorter flag that also does (`--workload` for `--interfaces-workload`).
    pub alias: Option<&'static str>,
    /// One line for `--help`.
    pub help: &'static str,
    pub kind: Kind,
    set: Setter,
}

impl Key {
    /// The values given to the flag, in order, as the TOML value they stand for: the last one,
    /// or all of them for a list.
    pub fn value_of_all(&self, raws: &[&str]) -> Value {
        match (self.kind, raws.last()) {
            (Kind::List, _) => Value::Array(
                raws.iter()
                    .map(|raw| Value::String((*raw).to_owned()))
                    .collect(),
            ),
            (_, Some(raw)) => self.value_of(raw),
            (_, None) => Value::String(String::new()),
        }
    }

    /// `raw`, given on the command line, as the TOML value it stands for.
    pub fn value_of(&self, raw: &str) -> Value {
        match self.kind {
            Kind::List => Value::Array(vec![Value::String(raw.to_owned())]),
            Kind::Integer => raw
                .parse::<i64>()
                .map_or_else(|_| Value::String(raw.to_owned()), Value::Integer),
            Kind::Text => Value::String(raw.to_owned()),
            Kind::Boolean => raw
                .parse::<bool>()
                .map_or_else(|_| Value::String(raw.to_owned()), Value::Boolean),
        }
    }

    pub(super) fn set(
        &self,
        config: &mut Config,
        p: &Parser<'_>,
        shown: &str,
        value: &Value,
    ) -> Result<(), ConfigError> {
        (self.set)(config, p, shown, value)
    }
}

/// The key named `name` (as in `agent.toml`).
pub fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// The keys of table `table` (`hygiene`), as written inside it, for an error about an unknown one.
pub fn known_keys_of(table: &str) -> String {
    let prefix = format!("{table}.");
    KEYS.iter()
        .filter_map(|k| k.name.strip_prefix(&prefix))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The tables (`interfaces`, `hygiene`): the prefixes of the keys named with one, in the
/// order of the key table.
pub fn tables() -> Vec<&'static str> {
    let mut tables: Vec<&'static str> = Vec::new();
    for table in KEYS
        .iter()
        .filter_map(|k| k.name.split_once('.').map(|(t, _)| t))
    {
        if !tables.contains(&table) {
            tables.push(table);
        }
    }
    tables
}

/// The known top-level keys and tables, for an error about an unknown one.
pub fn known_keys() -> String {
    let tables = tables().into_iter().map(|t| format!("[{t}]"));
    KEYS.iter()
        .map(|k| k.name)
        .filter(|n| !n.contains('.'))
        .map(str::to_owned)
        .chain(tables)
        .collect::<Vec<_>>()
        .join(", ")
}

pub const KEYS: &[Key] = &[
    Key {
        name: "interfaces.workload",
        flag: "interfaces-workload",
        alias: Some("workload"),
        help: "Workload interface glob (repeatable): the host side of pod interfaces",
        kind: Kind::List,
        set: |c, p, k, v| {
            c.interfaces.workload = p.globs(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "interfaces.uplink",
        flag: "interfaces-uplink",
        alias: Some("uplink"),
        help: "Uplink interface name (repeatable): where stale traffic arrives",
        kind: Kind::List,
        set: |c, p, k, v| {
            c.interfaces.uplink = p.ifnames(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "mode",
        flag: "mode",
        alias: None,
        help: "enforce | observe",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.mode = p.choice(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "on_early_reuse",
        flag: "on-early-reuse",
        alias: None,
        help: "fence-old | refuse-new | observe",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.on_early_reuse = p.choice(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "cooldown",
        flag: "cooldown",
        alias: None,
        help: "Quarantine after a holder is gone, e.g. 30s",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.cooldown = p.duration(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "quiet_period",
        flag: "quiet-period",
        alias: None,
        help: "Stale-traffic silence that ends a quarantine early, e.g. 10s",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.quiet_period = p.duration(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "max_cooldown",
        flag: "max-cooldown",
        alias: None,
        help: "Longest quarantine, however much stale traffic arrives, e.g. 5m",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.max_cooldown = p.duration(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "capacity",
        flag: "capacity",
        alias: None,
        help: "Addresses the registry and the datapath map hold",
        kind: Kind::Integer,
        set: |c, p, k, v| {
            c.capacity = p.capacity(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "bpffs_dir",
        flag: "bpffs-dir",
        alias: None,
        help: "Where the datapath's maps and links are pinned",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.bpffs_dir = p.abs_path(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "state_dir",
        flag: "state-dir",
        alias: None,
        help: "Where the journal and the CNI spool live",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.state_dir = p.abs_path(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "api_socket",
        flag: "api-socket",
        alias: None,
        help: "The API's unix socket",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.api_socket = p.abs_path(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "api_group",
        flag: "api-group",
        alias: None,
        help: "Group (name or gid) whose members may read the API (status, addresses, \
               conflicts, events)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.api_group = Some(p.group(k, v)?);
            Ok(())
        },
    },
    Key {
        name: "api_admin_group",
        flag: "api-admin-group",
        alias: None,
        help: "Group (name or gid) whose members may also change things through the API \
               (claims, drains, releases, GC, datapath writes; not the IPAM routes)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.api_admin_group = Some(p.group(k, v)?);
            Ok(())
        },
    },
    Key {
        name: "api_peer_procfs",
        flag: "api-peer-procfs",
        alias: None,
        help: "The procfs a root peer's capabilities are read from (default /proc; a procfs \
               of the node's PID namespace when the agent's own /proc shows only its own)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.api_peer_procfs = Some(p.abs_path(k, v)?);
            Ok(())
        },
    },
    Key {
        name: "metrics_addr",
        flag: "metrics-addr",
        alias: None,
        help: "Address and port of /metrics, /healthz and /readyz",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.metrics_addr = p.socket_addr(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "verify_interval",
        flag: "verify-interval",
        alias: None,
        help: "How often ipq's pins and links are checked against the kernel and repaired, \
               e.g. 5s",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.verify_interval = p.duration(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "ipam_on_exhausted",
        flag: "ipam-on-exhausted",
        alias: None,
        help: "wait | release-quietest: ipq-ipam's ADD when the delegate's range is exhausted \
               while ipq holds quarantined addresses of it",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.ipam_on_exhausted = p.choice(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "ipam_cni_bin_dirs",
        flag: "ipam-cni-bin-dirs",
        alias: None,
        help: "A CNI bin directory the agent may run ipq-ipam's delegate DELs from, as root \
               (repeatable; default /opt/cni/bin): a release whose CNI_PATH names none is refused",
        kind: Kind::List,
        set: |c, p, k, v| {
            c.ipam_cni_bin_dirs = p.abs_paths(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "observe_namespaces",
        flag: "observe-namespaces",
        alias: None,
        help: "A namespace whose pods' addresses are only observed: what would be dropped is \
               counted and let through (repeatable; the rest enforced; not with \
               enforce_namespaces)",
        kind: Kind::List,
        set: |c, p, k, v| {
            if matches!(c.namespaces, super::NamespaceScope::EnforceOnly(_)) {
                return Err(p.invalid(k, v, "cannot be set with enforce_namespaces"));
            }
            let names = p.namespaces(k, v)?;
            c.namespaces = if names.is_empty() {
                super::NamespaceScope::Everywhere
            } else {
                super::NamespaceScope::Observe(names)
            };
            Ok(())
        },
    },
    Key {
        name: "enforce_namespaces",
        flag: "enforce-namespaces",
        alias: None,
        help: "A namespace whose pods' addresses are enforced while every other known \
               namespace is only observed (repeatable; not with observe_namespaces)",
        kind: Kind::List,
        set: |c, p, k, v| {
            if matches!(c.namespaces, super::NamespaceScope::Observe(_)) {
                return Err(p.invalid(k, v, "cannot be set with observe_namespaces"));
            }
            let names = p.namespaces(k, v)?;
            if !names.is_empty() {
                c.namespaces = super::NamespaceScope::EnforceOnly(names);
            }
            Ok(())
        },
    },
    Key {
        name: "hygiene.flush",
        flag: "hygiene-flush",
        alias: None,
        help: "true | false: delete a reused address's conntrack and neighbour entries",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.hygiene.flush = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "hygiene.filtered_flush",
        flag: "hygiene-filtered-flush",
        alias: None,
        help: "true | false: a claim's conntrack flush by the kernel's filtered flush where the \
               start-up probe proves it (false: always a dump)",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.hygiene.filtered_flush = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "hygiene.announce",
        flag: "hygiene-announce",
        alias: None,
        help: "true | false: announce a new holder (gratuitous ARP, unsolicited NA)",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.hygiene.announce = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "hygiene.announce_per_second",
        flag: "hygiene-announce-per-second",
        alias: None,
        help: "How many new holders are announced per second at most",
        kind: Kind::Integer,
        set: |c, p, k, v| {
            c.hygiene.announce_per_second = p.rate(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "hygiene.announce_on_uplinks",
        flag: "hygiene-announce-on-uplinks",
        alias: None,
        help: "true | false: also announce new holders on the uplinks",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.hygiene.announce_on_uplinks = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "kubernetes.node_name",
        flag: "kubernetes-node-name",
        alias: None,
        help: "This node's name in Kubernetes, which its NodeQuarantine is named after \
               (default: the NODE_NAME environment variable; neither: nothing is published)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            let name = p.string(k, v)?;
            if name.is_empty() {
                return Err(p.invalid(k, v, "must not be empty"));
            }
            c.kubernetes.node_name = Some(name.to_owned());
            Ok(())
        },
    },
    Key {
        name: "kubernetes.kubeconfig",
        flag: "kubernetes-kubeconfig",
        alias: None,
        help: "A kubeconfig file the NodeQuarantine is published with (default: the pod's \
               service account)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.kubernetes.kubeconfig = Some(p.abs_path(k, v)?);
            Ok(())
        },
    },
    Key {
        name: "kubernetes.whereabouts",
        flag: "kubernetes-whereabouts",
        alias: None,
        help: "true | false: keep whereabouts from handing out a quarantined address (an \
               OverlappingRangeIPReservation per listed address; needs the NodeQuarantine)",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.kubernetes.whereabouts = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "kubernetes.whereabouts_namespace",
        flag: "kubernetes-whereabouts-namespace",
        alias: None,
        help: "The namespace whereabouts keeps its reservations in (default: kube-system)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            let namespace = p.string(k, v)?;
            if namespace.is_empty() {
                return Err(p.invalid(k, v, "must not be empty"));
            }
            c.kubernetes.whereabouts_namespace = Some(namespace.to_owned());
            Ok(())
        },
    },
    Key {
        name: "kubernetes.whereabouts_network_name",
        flag: "kubernetes-whereabouts-network-name",
        alias: None,
        help: "The network_name of the whereabouts IPAM config (default: empty, the unnamed \
               network), which whereabouts prefixes its reservations' names with",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.kubernetes.whereabouts_network_name = p.string(k, v)?.to_owned();
            Ok(())
        },
    },
    Key {
        name: "kubernetes.pod_events",
        flag: "kubernetes-pod-events",
        alias: None,
        help: "true | false: write Kubernetes Events on the pods involved in a conflict, a \
               fence or a held quarantine (default: true; needs the node name)",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.kubernetes.pod_events = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "kubernetes.pod_events_interval",
        flag: "kubernetes-pod-events-interval",
        alias: None,
        help: "Between two writes of one pod's Event of one reason at least, 1s to 1h (default \
               1m); occurrences meanwhile are counted into its series",
        kind: Kind::Text,
        set: |c, p, k, v| {
            let interval = p.duration(k, v)?;
            if interval < std::time::Duration::from_secs(1)
                || interval > std::time::Duration::from_secs(3600)
            {
                return Err(p.invalid(k, v, "must be between 1s and 1h"));
            }
            c.kubernetes.pod_events_interval = interval;
            Ok(())
        },
    },
    Key {
        name: "tc_attach",
        flag: "tc-attach",
        alias: None,
        help: "auto | tcx | netlink: how TC programs attach (auto: the netlink filter at once, \
               then a TCX link where the kernel has it)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.tc_attach = p.choice(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "bpf_watcher",
        flag: "bpf-watcher",
        alias: None,
        help: "trampolines | auto | off: what reports another tool's bpf() calls on ipq's \
               links and maps at once (trampolines, the default: the kernel's bpf() path only, \
               where the kernel takes them, else the periodic verification alone; auto: the \
               trampolines, else the raw tracepoint, which every system call of the node pays \
               for; off: the periodic verification alone)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.bpf_watcher = p.choice(k, v)?;
            Ok(())
        },
    },
];
