//! What is attached to an interface, read from the kernel the way another tool would: ipq's
//! cls_bpf filters (at `TC_FILTER_PRIORITY`/`TC_FILTER_HANDLE`), every other filter, the TCX
//! programs and ipq's link pins.

use std::path::Path;

use aya::programs::{SchedClassifier, TcAttachType};
use ipq::datapath::attach::tc_filter::{self, Direction, Filter};

use crate::{lab, netns::NetNs};

/// Every filter on `ifname`'s hook (chain heads, handle 0, left out).
pub fn filters(ns: &NetNs, ifname: &str, dir: Direction) -> Vec<Filter> {
    let ifindex = lab::ifindex(ns, ifname).unwrap_or_else(|e| panic!("{ifname}: {e:#}"));
    ns.run(|| tc_filter::list(ifindex, dir))
        .unwrap_or_else(|e| panic!("listing {ifname} {dir:?} filters: {e}"))
        .into_iter()
        .filter(|f| f.handle != 0)
        .collect()
}

/// ipq's filters on `ifname`'s hook.
pub fn ipq_filters(ns: &NetNs, ifname: &str, dir: Direction) -> usize {
    filters(ns, ifname, dir)
        .iter()
        .filter(|f| f.is_ipq())
        .count()
}

/// Names of the TCX programs on `ifname`'s hook.
pub fn tcx_programs(ns: &NetNs, ifname: &str, dir: Direction) -> Vec<String> {
    let attach = match dir {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    };
    let (_, progs) = ns
        .run(|| SchedClassifier::query_tcx(ifname, attach))
        .unwrap_or_else(|e| panic!("query_tcx {ifname} {dir:?}: {e}"));
    progs
        .iter()
        .map(|p| p.name_as_str().unwrap_or("?").to_owned())
        .collect()
}

/// ipq's TC attachments on `ifname`'s hook, however made: (netlink filters, TCX programs).
pub fn ipq_tc_attachments(ns: &NetNs, ifname: &str, dir: Direction) -> (usize, usize) {
    let tcx = tcx_programs(ns, ifname, dir)
        .iter()
        .filter(|n| n.starts_with("ipq_tc"))
        .count();
    (ipq_filters(ns, ifname, dir), tcx)
}

/// Names of the link pins under `bpffs_dir/links`.
pub fn link_pins(bpffs_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(bpffs_dir.join("links"))
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}
