//! Every top-level configuration key, in one table: its name in `agent.toml`, its command-line
//! flag, its help, and how its value is converted and stored. The TOML reader, the command-line
//! overrides, the `ipq-agent` flags and the "known keys" of an error all come from here.
//! Keys of a table are named with their table (`hygiene.flush` is `flush` under `[hygiene]`).
//! (`[interfaces]` is a table of lists with flags of their own, `--workload` and `--uplink`.)

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
}

type Setter = fn(&mut Config, &Parser<'_>, &str, &Value) -> Result<(), ConfigError>;

/// One top-level key.
pub struct Key {
    /// As written in `agent.toml`.
    pub name: &'static str,
    /// The `ipq-agent` flag that overrides it.
    pub flag: &'static str,
    /// One line for `--help`.
    pub help: &'static str,
    pub kind: Kind,
    set: Setter,
}

impl Key {
    /// `raw`, given on the command line, as the TOML value it stands for.
    pub fn value_of(&self, raw: &str) -> Value {
        match self.kind {
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

/// The known top-level keys, for an error about an unknown one.
pub fn known_keys() -> String {
    let mut names: Vec<&str> = KEYS
        .iter()
        .map(|k| k.name)
        .filter(|n| !n.contains('.'))
        .collect();
    names.push("[interfaces]");
    names.push("[hygiene]");
    names.join(", ")
}

pub const KEYS: &[Key] = &[
    Key {
        name: "mode",
        flag: "mode",
        help: "enforce | observe",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.mode = p.mode(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "on_early_reuse",
        flag: "on-early-reuse",
        help: "fence-old | refuse-new | observe",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.on_early_reuse = p.policy(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "cooldown",
        flag: "cooldown",
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
        help: "Group (name or gid) allowed on the API socket besides root",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.api_group = Some(p.group(k, v)?);
            Ok(())
        },
    },
    Key {
        name: "metrics_addr",
        flag: "metrics-addr",
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
        help: "wait | release-quietest: ipq-ipam's ADD when the delegate's range is exhausted \
               while ipq holds quarantined addresses of it",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.ipam_on_exhausted = p.on_exhausted(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "hygiene.flush",
        flag: "hygiene-flush",
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
        help: "true | false: also announce new holders on the uplinks",
        kind: Kind::Boolean,
        set: |c, p, k, v| {
            c.hygiene.announce_on_uplinks = p.boolean(k, v)?;
            Ok(())
        },
    },
    Key {
        name: "tc_attach",
        flag: "tc-attach",
        help: "auto | tcx | netlink: how TC programs attach (auto: the netlink filter at once, \
               then a TCX link where the kernel has it)",
        kind: Kind::Text,
        set: |c, p, k, v| {
            c.tc_attach = p.tc_attach(k, v)?;
            Ok(())
        },
    },
];
