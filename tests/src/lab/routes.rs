//! The lab's plumbing beyond its start: more veths, pod addresses and host routes, policy
//! routes for senders bound to one interface.

use std::{
    io::Write as _,
    net::IpAddr,
    process::{Child, Stdio},
};

use anyhow::{bail, Context as _};

use crate::netns::NetNs;

use super::*;

/// `/32` or `/128`.
fn host_prefix(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The interface index of `name` inside `ns`.
pub fn ifindex(ns: &NetNs, name: &str) -> anyhow::Result<u32> {
    let c_name = std::ffi::CString::new(name)?;
    // SAFETY: a valid C string.
    let index = ns.run(|| unsafe { libc::if_nametoindex(c_name.as_ptr()) });
    if index == 0 {
        bail!("no interface {name} in netns {}", ns.name());
    }
    Ok(index)
}

/// The node's links and routes as a test changes them beyond the lab's start
/// ([`Lab::routes`]).
pub struct NodeRoutes<'l> {
    node: &'l NetNs,
}

impl Lab {
    /// The node's links and routes, to change.
    pub fn routes(&self) -> NodeRoutes<'_> {
        NodeRoutes { node: &self.node }
    }
}

impl NodeRoutes<'_> {
    /// Starts `ip -batch` in the node making `n` veth pairs `{host}{i}` / `{peer}{i}`, host
    /// sides up: as fast as the kernel makes them. Returns the running `ip`, for the caller to
    /// act during the burst and then wait for it.
    pub fn spawn_veth_batch(&self, host: &str, peer: &str, n: usize) -> anyhow::Result<Child> {
        let mut batch = String::new();
        for i in 0..n {
            batch.push_str(&format!(
                "link add {host}{i} type veth peer name {peer}{i}\nlink set {host}{i} up\n"
            ));
        }
        let mut ip = self
            .node
            .command("ip")
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .context("spawning ip -batch")?;
        ip.stdin
            .take()
            .context("ip -batch's stdin")?
            .write_all(batch.as_bytes())
            .context("writing the veth batch")?;
        Ok(ip)
    }

    /// Gives `pod` one more address on its `eth0` (as an IPAM handing it out would), with the
    /// node's PERMANENT neighbour entry for it on `host_if` (`pod_mac`), but no route: routes
    /// are what the agent watches, so tests add them separately with
    /// [`add_host_route`](Self::add_host_route).
    pub fn add_pod_address(
        &self,
        pod: &NetNs,
        host_if: &str,
        pod_mac: &str,
        addr: IpAddr,
    ) -> anyhow::Result<()> {
        let prefix = host_prefix(addr);
        match addr {
            IpAddr::V4(_) => ip!(pod, "addr add {prefix} dev eth0")?,
            IpAddr::V6(_) => ip!(pod, "addr add {prefix} dev eth0 nodad")?,
        };
        ip!(
            self.node,
            "neigh replace {addr} lladdr {pod_mac} dev {host_if} nud permanent"
        )?;
        Ok(())
    }

    /// `ip route add <addr>/32|128 dev <host_if> [metric m]` in the node: a per-pod host route
    /// in the main table, which the agent reads as a claim.
    pub fn add_host_route(
        &self,
        host_if: &str,
        addr: IpAddr,
        metric: Option<u32>,
    ) -> anyhow::Result<()> {
        let prefix = host_prefix(addr);
        match metric {
            Some(m) => ip!(self.node, "route add {prefix} dev {host_if} metric {m}")?,
            None => ip!(self.node, "route add {prefix} dev {host_if}")?,
        };
        Ok(())
    }

    /// `ip route del <addr>/32|128 dev <host_if>` in the node: the pod's route withdrawn.
    pub fn del_host_route(&self, host_if: &str, addr: IpAddr) -> anyhow::Result<()> {
        let prefix = host_prefix(addr);
        ip!(self.node, "route del {prefix} dev {host_if}")?;
        Ok(())
    }

    /// Makes `addrs` reachable through `dev` for node sockets bound to `dev` (SO_BINDTODEVICE),
    /// whatever the main table says: a rule `oif <dev> lookup <table>` and host routes in
    /// `table`. The agent reads only the main table, so this claims nothing; it lets a test
    /// reach a pod whose route was withdrawn or given to another pod.
    pub fn route_by_oif(&self, dev: &str, table: u32, addrs: &[IpAddr]) -> anyhow::Result<()> {
        ip!(
            self.node,
            "-4 rule add oif {dev} lookup {table} priority {table}"
        )?;
        ip!(
            self.node,
            "-6 rule add oif {dev} lookup {table} priority {table}"
        )?;
        for addr in addrs {
            let prefix = host_prefix(*addr);
            ip!(self.node, "route add {prefix} dev {dev} table {table}")?;
        }
        Ok(())
    }

    /// Makes everything the node forwards or sends to `addrs` go through `dev` (a rule
    /// `to <addr> lookup <table>` ahead of the main table, and host routes in `table`): the
    /// pod keeps two-way connectivity while its main-table route, the one the agent watches,
    /// is withdrawn.
    pub fn route_to_via_table(
        &self,
        dev: &str,
        table: u32,
        addrs: &[IpAddr],
    ) -> anyhow::Result<()> {
        for addr in addrs {
            let prefix = host_prefix(*addr);
            let family = if addr.is_ipv4() { "-4" } else { "-6" };
            ip!(
                self.node,
                "{family} rule add to {prefix} lookup {table} priority {table}"
            )?;
            ip!(self.node, "route add {prefix} dev {dev} table {table}")?;
        }
        Ok(())
    }
}
