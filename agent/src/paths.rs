//! Every filesystem path the agent uses at run time, in one place.

use std::path::{Path, PathBuf};

use ipq_common::counters::Hook;

pub const DEFAULT_CONFIG: &str = "/etc/ipq/agent.toml";
pub const DEFAULT_BPFFS_DIR: &str = "/sys/fs/bpf/ipq";
pub const DEFAULT_STATE_DIR: &str = ipq_api::DEFAULT_STATE_DIR;
pub const DEFAULT_API_SOCKET: &str = ipq_api::DEFAULT_SOCKET;
pub const BPFFS_MOUNT: &str = "/sys/fs/bpf";

/// Where a hook is attached; part of a link's pin name. Its derived name (`tcx-ingress`,
/// `tcx-egress`, `xdp`) is the pins' layout, which restarts and upgrades rely on, so it never
/// changes (`vocabulary_tests`); what users read names the attachment a hook actually has
/// instead ([`AttachPoint::name_under_filter`], `Mechanism::hook_name`).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::AsRefStr,
    strum::Display,
    strum::EnumString,
)]
#[strum(serialize_all = "kebab-case")]
#[derive(strum::VariantArray)]
pub enum AttachPoint {
    TcxIngress,
    TcxEgress,
    Xdp,
}

impl AttachPoint {
    /// The hook's name where ipq's program hangs on it by a netlink (clsact) filter:
    /// `tc-ingress`, `tc-egress` (`xdp` has no filter form; it keeps its name).
    pub const fn name_under_filter(self) -> &'static str {
        match self {
            Self::TcxIngress => "tc-ingress",
            Self::TcxEgress => "tc-egress",
            Self::Xdp => "xdp",
        }
    }

    /// The hook a program attached here runs at: the `hook` label of its metrics.
    pub const fn hook(self) -> Hook {
        match self {
            Self::TcxIngress => Hook::TcIngress,
            Self::TcxEgress => Hook::TcEgress,
            Self::Xdp => Hook::Xdp,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        s.parse().ok()
    }
}

/// Layout of ipq's pins under `bpffs_dir`:
///
/// ```text
/// <bpffs_dir>/maps/IPQ_ADDRS ...   the maps, pinned by name
/// <bpffs_dir>/progs/ipq_tc_ingress ... the programs, for the attach workers
/// <bpffs_dir>/links/if7-tcx-ingress the links, one per interface and attach point (TCX, XDP;
///                                   netlink filters have no pin, they live on the device)
/// ```
#[derive(Clone, Debug)]
pub struct PinLayout {
    root: PathBuf,
}

impl PinLayout {
    pub fn new(bpffs_dir: impl Into<PathBuf>) -> Self {
        Self {
            root: bpffs_dir.into(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }

    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// The loaded programs, pinned so attach workers open their own handles on them.
    pub fn programs_dir(&self) -> PathBuf {
        self.root.join("progs")
    }

    pub fn program(&self, name: &str) -> PathBuf {
        self.programs_dir().join(name)
    }

    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }

    pub fn link(&self, ifindex: u32, point: AttachPoint) -> PathBuf {
        self.links_dir().join(format!("if{ifindex}-{}", point))
    }

    /// The interface and attach point a link pin stands for, from its file name.
    pub fn parse_link_name(name: &str) -> Option<(u32, AttachPoint)> {
        let rest = name.strip_prefix("if")?;
        let (ifindex, point) = rest.split_once('-')?;
        Some((ifindex.parse().ok()?, AttachPoint::parse(point)?))
    }
}

#[cfg(test)]
mod tests {
    use strum::VariantArray as _;

    use super::*;

    #[test]
    fn link_names_round_trip() {
        let layout = PinLayout::new("/sys/fs/bpf/ipq");
        for &point in AttachPoint::VARIANTS {
            let path = layout.link(42, point);
            let name = path.file_name().unwrap().to_str().unwrap();
            assert_eq!(PinLayout::parse_link_name(name), Some((42, point)));
        }
        assert_eq!(PinLayout::parse_link_name("ifx-xdp"), None);
        assert_eq!(PinLayout::parse_link_name("if3-tc"), None);
        assert_eq!(PinLayout::parse_link_name("IPQ_ADDRS"), None);
    }
}
