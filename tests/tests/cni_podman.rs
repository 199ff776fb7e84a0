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
