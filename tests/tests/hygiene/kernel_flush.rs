//! A claim's conntrack flush takes exactly the claimed addresses' entries, whichever way the
//! agent flushes (the kernel's filtered flush where its probe proved it, else the dump): entries
//! are put in with `conntrack -I` (the claimed address in each of the four tuple places, in the
//! default zone and in zone 7, beside entries of other addresses and of the node's own), and
//! `conntrack -L` is the witness of what is left.

use std::{
    net::{IpAddr, UdpSocket},
    time::Duration,
};

use anyhow::{ensure, Context as _};
use ipq_tests::{
    lab::{
        poll, Agent, Lab, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6, POD_B_LLADDR, UPLINK_V4, UPLINK_V6,
    },
    netns::NetNs,
};
use serde_json::Value;

use crate::{
    service::add_service,
    support::{claim, run},
};

/// A non-default conntrack zone.
const ZONE: &str = "7";

/// One entry as `conntrack -I` takes it: UDP, original and reply tuples, zone.
struct Entry {
    orig: (IpAddr, u16, IpAddr, u16),
    reply: (IpAddr, u16, IpAddr, u16),
    zone: &'static str,
}

impl Entry {
    fn insert(&self, node: &NetNs) -> anyhow::Result<()> {
        let (s, sp, d, dp) = self.orig;
        let (rs, rsp, rd, rdp) = self.reply;
        let args = [
            "-I",
            "-p",
            "udp",
            "-s",
            &s.to_string(),
            "-d",
            &d.to_string(),
            "--sport",
            &sp.to_string(),
            "--dport",
            &dp.to_string(),
            "-r",
            &rs.to_string(),
            "-q",
            &rd.to_string(),
            "--reply-port-src",
            &rsp.to_string(),
            "--reply-port-dst",
            &rdp.to_string(),
            "--timeout",
            "300",
            "--zone",
            self.zone,
        ];
        run(node, "conntrack", &args)?;
        Ok(())
    }

    /// Is it still in the table (`conntrack -L`, matched on its original ports and zone)?
    fn listed(&self, listing: &str) -> bool {
        let (s, sp, d, dp) = self.orig;
        let zone = match self.zone {
            "0" => String::new(),
            z => format!("zone={z}"),
        };
        listing.lines().any(|l| {
            l.contains(&format!("src={s} dst={d} sport={sp} dport={dp} "))
                && (zone.is_empty() && !l.contains("zone=")
                    || !zone.is_empty() && l.contains(&zone))
        })
    }
}

/// The entries for one family: `target` in each place (two in zone 7), and others that must
/// stay: a peer's, the node's own (`node`), each in both zones.
fn entries(target: IpAddr, peer: IpAddr, node: IpAddr, vip: IpAddr) -> (Vec<Entry>, Vec<Entry>) {
    let e = |orig, reply, zone| Entry { orig, reply, zone };
    let carrying = vec![
        // SNAT from the target: original source only.
        e((target, 3001, peer, 4001), (peer, 4001, node, 50001), "0"),
        // DNAT to the target (a Service backend): reply source only.
        e((peer, 3002, vip, 4002), (target, 4002, peer, 3002), ZONE),
        // SNAT to the target: reply destination only.
        e((peer, 3003, node, 4003), (node, 4003, target, 50003), "0"),
        // DNAT away from the target: original destination only.
        e((peer, 3004, target, 4004), (node, 4004, peer, 3004), ZONE),
    ];
    let others = vec![
        e((node, 3005, peer, 4005), (peer, 4005, node, 3005), "0"),
        e((node, 3006, peer, 4006), (peer, 4006, node, 3006), ZONE),
        e((peer, 3007, vip, 4007), (node, 4007, peer, 3007), ZONE),
        e((peer, 3008, node, 4008), (node, 4008, peer, 3008), "0"),
    ];
    (carrying, others)
}

/// How the agent says it flushes a claim's entries of `family` ("IPv4"/"IPv6"): "kernel" or
/// "dump", as `GET /v1/status` reports it (`conntrack_claim_flush`).
pub(crate) fn claim_flush_method(agent: &Agent, family: &str) -> anyhow::Result<&'static str> {
    let key = family.to_lowercase();
    // The worker decides once its probe is done, which may come just after the agent is ready.
    poll(
        &format!("the agent's conntrack flush method for {family}"),
        Duration::from_secs(5),
        || {
            let status: Value =
                ipq_tests::api::request(&agent.api_socket(), "GET", "/v1/status", None)?.json()?;
            Ok(match status["conntrack_claim_flush"][&key].as_str() {
                Some("kernel") => Some("kernel"),
                Some(dump) if dump.starts_with("dump") => Some("dump"),
                _ => None,
            })
        },
    )
    .with_context(|| format!("agent log:\n{}", agent.log()))
}

/// What the claim of pod A's addresses (by pod B) left, per family.
pub(crate) struct Outcome {
    /// The claim's flush of each address (its `last_flush`), v4 then v6.
    pub flushes: Vec<Value>,
}

/// Puts the entries in, has B claim A's addresses, and checks with `conntrack -L` that exactly
/// the claimed addresses' entries went, v4 and v6, in both zones.
pub(crate) fn claim_takes_only_the_claimed_entries(
    lab: &Lab,
    agent: &Agent,
) -> anyhow::Result<Outcome> {
    let families = [
        entries(
            POD_A_V4.into(),
            PEER_V4.into(),
            UPLINK_V4.into(),
            "10.96.0.7".parse()?,
        ),
        entries(
            POD_A_V6.into(),
            PEER_V6.into(),
            UPLINK_V6.into(),
            "fd96::7".parse()?,
        ),
    ];
    for (carrying, others) in &families {
        for entry in carrying.iter().chain(others) {
            entry.insert(&lab.node)?;
        }
    }
    let listing = |family| run(&lab.node, "conntrack", &["-L", "-f", family]);
    for ((carrying, others), family) in families.iter().zip(["ipv4", "ipv6"]) {
        let before = listing(family)?;
        ensure!(
            carrying.iter().chain(others).all(|e| e.listed(&before)),
            "every entry is in before the claim:\n{before}"
        );
    }
    let addrs: [IpAddr; 2] = [POD_A_V4.into(), POD_A_V6.into()];
    for addr in addrs {
        lab.routes()
            .add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
    }
    let (answer, _) = claim(lab, &addrs, "vethpb", POD_B_LLADDR)?;
    for ((carrying, others), family) in families.iter().zip(["ipv4", "ipv6"]) {
        let after = listing(family)?;
        for entry in carrying {
            ensure!(
                !entry.listed(&after),
                "{family}: an entry carrying the claimed address survived the claim ({:?} zone \
                 {}):\n{after}\nagent log:\n{}",
                entry.orig,
                entry.zone,
                agent.log()
            );
        }
        for entry in others {
            ensure!(
                entry.listed(&after),
                "{family}: the claim's flush took an entry of another address ({:?} zone {}):\n\
                 {after}\nagent log:\n{}",
                entry.orig,
                entry.zone,
                agent.log()
            );
        }
    }
    let flushes = answer["addresses"]
        .as_array()
        .map(|views| views.iter().map(|v| v["last_flush"].clone()).collect())
        .unwrap_or_default();
    Ok(Outcome { flushes })
}

/// Opens `n` UDP flows from the peer to pod A's v4 address (one per destination port) through
/// the node, whose conntrack is on (the Service's rules); returns the node's entry count once
/// it tracks them all (the datagrams cross the node after `send_to` returns).
pub(crate) fn open_flows_to_pod_a(lab: &Lab, n: u16) -> anyhow::Result<u32> {
    add_service(&lab.node)?;
    lab.peer.run(|| -> anyhow::Result<()> {
        let socket = UdpSocket::bind((PEER_V4, 0))?;
        for port in 1..=n {
            socket.send_to(b"flow", (POD_A_V4, port))?;
        }
        Ok(())
    })?;
    poll(
        &format!("the node tracking the {n} flows"),
        Duration::from_secs(10),
        || Ok(Some(entry_count(&lab.node)?).filter(|count| *count >= u32::from(n))),
    )
}

/// The node's conntrack entries (`conntrack -C`).
pub(crate) fn entry_count(node: &NetNs) -> anyhow::Result<u32> {
    Ok(run(node, "conntrack", &["-C"])?.trim().parse()?)
}
