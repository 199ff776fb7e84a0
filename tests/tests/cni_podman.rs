//! A real runtime (issue #4): podman 4.3 with the CNI network backend and runc, busybox
//! containers from a local rootfs, the reference `bridge` + `host-local` plugins and, chained
//! after them, `ipq-cni` talking to the real `ipq-agent`.
//!
//! Everything runs in the lab's node namespace and in a private mount namespace with private
//! storage, config and IPAM data (see `ipq_tests::podman`): the machine's own network, container
//! storage and config are never touched.
//!
//! Needs root, bpffs, the workspace binaries (`cargo build -p ipq --bins`) and the Debian
//! packages podman, runc, containernetworking-plugins, busybox-static; `cargo xtask test`
//! provides them all.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::Duration,
};

use anyhow::{ensure, Context as _};
use ipq_tests::{
    lab::{poll, Lab},
    podman::{BridgeNetwork, Podman},
};

const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);

fn network(chained: Vec<String>) -> BridgeNetwork {
    BridgeNetwork {
        name: "ipqtest".to_owned(),
        bridge: "ipqbr0".to_owned(),
        subnet: "10.99.0.0/24".to_owned(),
        gateway: GATEWAY.into(),
        chained,
    }
}

/// The runtime itself, before ipq is involved: a container on the bridge gets an address from
/// host-local, reaches its gateway, and leaves nothing behind when removed.
#[test]
fn podman_runs_a_busybox_container_on_the_cni_bridge() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let podman = Podman::new(&lab.node, network(Vec::new()), &[])?;
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 7).into();
    let a = podman.run("a", Some(addr), "while :; do sleep 1; done")?;
    let veth = podman.host_veth(&a)?;
    let link = lab.node.ip(&["-o", "link", "show", &veth])?;
    ensure!(
        link.contains("master ipqbr0"),
        "{veth} is a port of ipqbr0: {link}"
    );
    ensure!(
        podman.ipam_reservation(addr).is_file(),
        "host-local reserved {addr} in the test's dataDir"
    );
    let inside = lab_output(a.net_command("ip").args(["-o", "addr", "show", "eth0"]))?;
    ensure!(
        inside.contains(&format!("{addr}/24")),
        "the container has {addr}: {inside}"
    );
    ensure!(
        a.ping(GATEWAY.into(), 3)? == 3,
        "the container reaches its gateway"
    );

    podman.podman(&["rm", "--force", "--time", "0", "a"])?;
    poll("the host veth gone", Duration::from_secs(5), || {
        Ok(lab
            .node
            .ip(&["-o", "link", "show", &veth])
            .is_err()
            .then_some(()))
    })?;
    ensure!(
        !podman.ipam_reservation(addr).exists(),
        "CNI DEL released {addr} in host-local"
    );
    Ok(())
}

fn lab_output(cmd: &mut std::process::Command) -> anyhow::Result<String> {
    ipq_tests::netns::output_of(cmd).context("in the container's network namespace")
}

/// A's script: a graceful shutdown that takes its time, as a pod's preStop / drain would.
/// The files it touches in its rootfs tell the test where it is.
const SLOW_TO_STOP: &str =
    "trap 'touch /terminating; sleep 120; exit 0' TERM; touch /started; while :; do sleep 1; done";

/// Starts `name` with `addr`, then `podman stop`s it in the background: on return the container
/// has received SIGTERM and is still running (podman: `stopping`).
fn start_terminating(
    podman: &mut Podman<'_>,
    name: &str,
    addr: IpAddr,
) -> anyhow::Result<ipq_tests::podman::Container> {
    let container = podman.run(name, Some(addr), SLOW_TO_STOP)?;
    let rootfs = podman.dir().join("rootfs").join(name);
    poll("A's shell running", Duration::from_secs(10), || {
        Ok(rootfs.join("started").exists().then_some(()))
    })?;
    podman.spawn(&["stop", "--time", "150", name])?;
    poll("A's SIGTERM trap running", Duration::from_secs(10), || {
        Ok(rootfs.join("terminating").exists().then_some(()))
    })?;
    let status = podman.status(name)?;
    ensure!(
        status == "stopping",
        "{name} is terminating, podman says {status}"
    );
    Ok(container)
}

/// The incident itself, without ipq: the IPAM frees a terminating container's address early
/// and podman gives it to a new container while the old one still uses it.
#[test]
fn without_ipq_a_terminating_containers_address_is_handed_out_again() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let mut podman = Podman::new(&lab.node, network(Vec::new()), &[])?;
    let addr: IpAddr = Ipv4Addr::new(10, 99, 0, 9).into();
    let a = start_terminating(&mut podman, "a", addr)?;
    std::fs::remove_file(podman.ipam_reservation(addr)).context("freeing A's address")?;
    let b = podman.run("b", Some(addr), "while :; do sleep 1; done")?;
    let status = podman.status("a")?;
    ensure!(
        status == "stopping",
        "A still terminating, podman says {status}"
    );
    ensure!(a.ping(GATEWAY.into(), 3)? >= 1, "A still sends from {addr}");
    ensure!(b.ping(GATEWAY.into(), 3)? >= 1, "B sends from {addr} too");
    Ok(())
}
