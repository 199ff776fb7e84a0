//! What the netlink-mode tests need beside [`crate::attachments`]: every filter of a hook,
//! other tools' included (to show they are left alone), ipq's attachment count per hook, and
//! ipq's link pins.

use std::{path::Path, time::Duration};

use aya::programs::TcAttachType;
use ipq::datapath::attach::tc_filter::{self, Direction, Filter};

use crate::{
    attachments::{self, Attachment},
    lab::{self, Agent},
    netns::NetNs,
};

/// Every filter on `ifname`'s hook (chain heads, handle 0, left out).
pub fn filters(ns: &NetNs, ifname: &str, dir: Direction) -> Vec<Filter> {
    let ifindex = lab::ifindex(ns, ifname).unwrap_or_else(|e| panic!("{ifname}: {e:#}"));
    ns.run(|| tc_filter::list(ifindex, dir))
        .unwrap_or_else(|e| panic!("listing {ifname} {dir:?} filters: {e}"))
        .into_iter()
        .filter(|f| f.handle != 0)
        .collect()
}

/// ipq's TC attachments on `ifname`'s hook, however made: (netlink filters, TCX programs).
/// Counted from what `tc` and the bpf syscall report ([`crate::attachments`]), not through
/// the agent's own netlink code, so the agent cannot vouch for itself.
pub fn ipq_tc_attachments(ns: &NetNs, ifname: &str, dir: Direction) -> (usize, usize) {
    let attach = match dir {
        Direction::Ingress => TcAttachType::Ingress,
        Direction::Egress => TcAttachType::Egress,
    };
    let found = attachments::tc(ns, ifname, attach)
        .unwrap_or_else(|e| panic!("{ifname} {dir:?} attachments: {e:#}"));
    let count = |tcx: bool| {
        found
            .iter()
            .filter(|a| a.is_ipq() && matches!(a, Attachment::Tcx { .. }) == tcx)
            .count()
    };
    (count(false), count(true))
}

/// Waits until `agent` has moved every netlink-protected interface to TCX
/// (`ipq_datapath_tc_upgrades_pending` is 0; at once in the explicit modes and without TCX).
pub fn wait_tc_upgrades(agent: &Agent) {
    lab::poll("every TCX upgrade done", Duration::from_secs(120), || {
        Ok((agent.metric("ipq_datapath_tc_upgrades_pending", &[])? == 0.0).then_some(()))
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e:#}
{}",
            agent.log()
        )
    });
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
