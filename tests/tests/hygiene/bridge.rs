//! A bridge node (`cni0`) whose pods do not announce themselves, as the ptp and bridge plugins
//! leave them, and how a namespace resolves an address.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipq_tests::{
    lab::{poll, Agent, Lab},
    netns::NetNs,
};

use crate::support::{address, ip};

pub(crate) const BR_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
pub(crate) const BR_V6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 1);
pub(crate) const SHARED_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 5);
pub(crate) const SHARED_V6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 5);
pub(crate) const THIRD_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 7);
pub(crate) const THIRD_V6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 7);
pub(crate) const BR_A_MAC: &str = "02:88:00:00:0a:02";
pub(crate) const BR_B_MAC: &str = "02:88:00:00:0b:02";
pub(crate) const BR_T_MAC: &str = "02:88:00:00:0c:02";

/// Puts `pod` on bridge `cni0` through port `port`, its `eth1` at `mac`, not announcing
/// itself (as the ptp and bridge plugins leave a pod: no gratuitous ARP, no unsolicited NA).
pub(crate) fn bridge_pod(
    node: &NetNs,
    pod: &NetNs,
    port: &str,
    mac: &str,
    addrs: Option<(Ipv4Addr, Ipv6Addr)>,
) -> anyhow::Result<()> {
    ip(
        node,
        &format!(
            "link add {port} type veth peer name eth1 address {mac} netns {}",
            pod.name()
        ),
    )?;
    ip(node, &format!("link set {port} master cni0 up"))?;
    for key in [
        "net.ipv4.conf.all.arp_notify",
        "net.ipv4.conf.default.arp_notify",
        "net.ipv6.conf.all.ndisc_notify",
        "net.ipv6.conf.default.ndisc_notify",
    ] {
        pod.sysctl(key, "0")?;
    }
    if let Some((v4, v6)) = addrs {
        ip(pod, &format!("addr add {v4}/24 dev eth1"))?;
        ip(pod, &format!("addr add {v6}/64 dev eth1 nodad"))?;
    }
    ip(pod, "link set eth1 up")?;
    Ok(())
}

/// `ping -c 1 -W 1` from `ns`; whether a reply came.
pub(crate) fn pings(ns: &NetNs, dst: IpAddr) -> bool {
    ns.command("ping")
        .args(["-n", "-q", "-c", "1", "-W", "1", &dst.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The MAC `ns` resolves `addr` to, if any.
pub(crate) fn neighbour_mac(ns: &NetNs, addr: IpAddr) -> anyhow::Result<Option<String>> {
    let out = ip(ns, &format!("neigh show {addr}"))?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_owned))
}

/// The bridge `cni0` in `node`, the pods' gateway at `BR_V4` and `BR_V6`.
pub(crate) fn add_bridge(node: &NetNs) -> anyhow::Result<()> {
    ip(node, "link add cni0 type bridge")?;
    ip(node, &format!("addr add {BR_V4}/24 dev cni0"))?;
    ip(node, &format!("addr add {BR_V6}/64 dev cni0 nodad"))?;
    ip(node, "link set cni0 up")?;
    Ok(())
}

/// The addresses pod A held on the bridge, and pod B takes.
pub(crate) const SHARED: [IpAddr; 2] = [IpAddr::V4(SHARED_V4), IpAddr::V6(SHARED_V6)];

/// The bridge scenario up to the reuse: pods A, B and `third` on `cni0`, the agent watching
/// their ports; the node and the third pod have resolved the shared addresses to A's MAC (and
/// are past the neighbour lock time, within which Linux ignores overriding updates); then A is
/// gone, its addresses are quarantined, and B has them configured but has claimed nothing and
/// announced nothing.
pub(crate) fn a_gone_b_configured<'l>(lab: &'l Lab, third: &NetNs) -> anyhow::Result<Agent<'l>> {
    let node = &lab.node;
    add_bridge(node)?;
    bridge_pod(
        node,
        &lab.pod_a,
        "vethba",
        BR_A_MAC,
        Some((SHARED_V4, SHARED_V6)),
    )?;
    bridge_pod(node, &lab.pod_b, "vethbb", BR_B_MAC, None)?;
    bridge_pod(node, third, "vethbt", BR_T_MAC, Some((THIRD_V4, THIRD_V6)))?;
    let agent = lab.start_agent(&["--workload", "vethb*"])?;
    // The node learns A through its neighbour entries (that is how the agent sees A hold
    // them); the third pod learns A's MAC.
    for addr in SHARED {
        anyhow::ensure!(pings(node, addr), "node -> A {addr}");
        anyhow::ensure!(pings(third, addr), "third pod -> A {addr}");
        anyhow::ensure!(
            neighbour_mac(third, addr)?.as_deref() == Some(BR_A_MAC),
            "the third pod resolved {addr} to A"
        );
    }
    // The agent must hold A as the addresses' holder before A goes, or there is no
    // quarantine to start.
    for addr in SHARED {
        poll(
            &format!("{addr} held by vethba"),
            Duration::from_secs(10),
            || {
                Ok(address(lab, addr)?
                    .filter(|v| v["state"] == "active" && v["holder"]["ifname"] == "vethba")
                    .map(|_| ()))
            },
        )?;
    }

    ip(node, "link del vethba")?;
    for addr in SHARED {
        poll(
            &format!("{addr} quarantined"),
            Duration::from_secs(10),
            || {
                Ok(address(lab, addr)?
                    .filter(|v| v["state"] == "quarantined")
                    .map(|_| ()))
            },
        )?;
    }
    ip(&lab.pod_b, &format!("addr add {SHARED_V4}/24 dev eth1"))?;
    ip(
        &lab.pod_b,
        &format!("addr add {SHARED_V6}/64 dev eth1 nodad"),
    )?;
    Ok(agent)
}
