//! A delegate that is neither host-local nor static: Debian's `dhcp` plugin, its daemon, and a
//! real DHCP server (dnsmasq) on the bridge in the lab's node namespace.
//!
//! What holding means there: ipq-ipam keeps the dhcp plugin's DEL from running, so the daemon
//! keeps pod A's lease and the server does not give A's address to the next pod (B gets the
//! other one). When A's quarantine is over the agent runs the dhcp DEL, which succeeds and ends
//! the daemon's lease. (Not asserted: whether the server has A's address back at once; the
//! daemon's DHCPRELEASE would have to leave through A's interface, which is gone by then, so
//! the server may keep it until the lease expires: late, never early.)
//!
//! It also caught that with dhcp the address is on the wire before the ADD returns (the
//! server's ARP entry on the bridge makes the agent see it on the new pod's veth): ipq-ipam took
//! that for another holder and parked every lease until the server ran out.

use std::{
    net::IpAddr,
    path::Path,
    process::{Child, Stdio},
    time::Duration,
};

use anyhow::{ensure, Context as _};
use ipq::registry::StateName;
use ipq_tests::{
    cni::{ipq_ipam, AgentApi, Chain},
    lab::poll,
    netns::NetNs,
};
use serde_json::json;

use super::{add, held_releases, ipq_cni, state_dir, Lab, QUARANTINE, RELEASE_WITHIN};

const BRIDGE: &str = "cnidhcp0";

/// A process killed when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(ns: &NetNs, program: &str, args: &[&str], log: &Path) -> anyhow::Result<Killed> {
    let log = std::fs::File::create(log)?;
    let child = ns
        .command(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {program} (cargo xtask setup installs it)"))?;
    Ok(Killed(child))
}

/// The bridge with the server's address, dnsmasq serving two leases on it, the CNI dhcp daemon.
fn dhcp_server(lab: &Lab) -> anyhow::Result<(Killed, Killed)> {
    lab.node.ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    lab.node
        .ip(&["addr", "add", "10.98.0.1/24", "dev", BRIDGE])?;
    lab.node.ip(&["link", "set", BRIDGE, "up"])?;
    let work = lab.work_dir();
    let leases = format!("--dhcp-leasefile={}", work.join("dnsmasq.leases").display());
    let pid = format!("--pid-file={}", work.join("dnsmasq.pid").display());
    let dnsmasq = spawn(
        &lab.node,
        "dnsmasq",
        &[
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--port=0",
            "--interface",
            BRIDGE,
            "--bind-interfaces",
            "--dhcp-range=10.98.0.10,10.98.0.11,255.255.255.0,2m",
            "--dhcp-authoritative",
            "--log-facility=-",
            "--log-dhcp",
            // Its lease file lives in the lab's work dir, which only root may write.
            "--user=root",
            &leases,
            &pid,
        ],
        &work.join("dnsmasq.log"),
    )?;
    let socket = work.join("dhcp.sock");
    let daemon = spawn(
        &lab.node,
        "/usr/lib/cni/dhcp",
        &[
            "daemon",
            "-socketpath",
            &socket.to_string_lossy(),
            "-timeout",
            "10s",
            "-resendmax",
            "4s",
        ],
        &work.join("dhcp-daemon.log"),
    )?;
    poll(
        "the dhcp daemon accepting on its socket",
        Duration::from_secs(10),
        || Ok(ipq_tests::wait::unix_socket_accepts(&socket).then_some(())),
    )?;
    Ok((dnsmasq, daemon))
}

#[test]
fn dhcp_as_the_delegate_keeps_the_lease_until_the_quarantine_is_over() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let (_dnsmasq, _daemon) = dhcp_server(&lab)?;
    let dhcp = json!({
        "type": "dhcp",
        "daemonSocketPath": lab.work_dir().join("dhcp.sock"),
    });
    let bridge = json!({
        "type": "bridge", "bridge": BRIDGE, "isGateway": false, "ipMasq": false,
        "ipam": ipq_ipam(dhcp, &lab.work_dir().join("ipq.sock"), &state_dir(&lab)),
    });
    let name = format!("ipam-dhcp-{}", std::process::id());
    let chain = Chain::new(&lab.node, name, "1.0.0", vec![bridge, ipq_cni(&lab)])?;
    let agent = lab.start_agent(&QUARANTINE)?;
    let api = AgentApi::new(&lab)?;
    let logs = || {
        ["dnsmasq.log", "dhcp-daemon.log"]
            .map(|f| std::fs::read_to_string(lab.work_dir().join(f)).unwrap_or_default())
            .join("\n")
    };
    let a = add(&chain, "da").with_context(|| format!("A's lease; logs:\n{}", logs()))?;
    let range: [IpAddr; 2] = ["10.98.0.10".parse()?, "10.98.0.11".parse()?];
    ensure!(range.contains(&a.v4), "A's lease from dnsmasq: {}", a.v4);
    api.wait_state(a.v4, StateName::Active)?;
    chain.del(&a.attachment, Some(&a.result))?;
    let releases = held_releases(&lab)?;
    ensure!(
        releases.len() == 1 && releases[0].delegate_type == "dhcp",
        "the dhcp DEL is held: {releases:?}"
    );
    api.wait_state(a.v4, StateName::Quarantined)?;

    let b = add(&chain, "db").with_context(|| format!("B's lease; logs:\n{}", logs()))?;
    ensure!(
        b.v4 != a.v4 && range.contains(&b.v4),
        "B gets the other lease, not A's held {}: {}",
        a.v4,
        b.v4
    );

    // After the quarantine the agent runs the dhcp DEL, once, successfully.
    poll("the dhcp release", RELEASE_WITHIN, || {
        Ok(held_releases(&lab)?.is_empty().then_some(()))
    })?;
    let network = chain.name.as_str();
    let released = agent.metric(
        "ipq_ipam_releases_total",
        &[("network", network), ("outcome", "released")],
    )?;
    let failed = agent
        .metric(
            "ipq_ipam_releases_total",
            &[("network", network), ("outcome", "failed")],
        )
        .unwrap_or(0.0);
    ensure!(
        released == 1.0 && failed == 0.0,
        "released {released}, failed {failed}"
    );
    ensure!(
        api.get(a.v4)?.is_none(),
        "neither the registry nor the IPAM holds {} any more",
        a.v4
    );
    Ok(())
}
