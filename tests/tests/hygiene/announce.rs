//! Announcing the new holder, seen from the wire: on the uplinks only when configured
//! (`announce_on_uplinks`), with the MAC the bridge learned when the claim names none, and no
//! more often than `announce_per_second`. The witness is an AF_PACKET capture in the receiving
//! peer's namespace (and its neighbour table), not the agent's counters alone.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use ipq_tests::{
    lab::{poll, send_frames, Lab, POD_A_V4, POD_A_V6, POD_B_LLADDR},
    netns::NetNs,
};
use serde_json::{json, Value};

use crate::{
    bridge::{a_gone_b_configured, neighbour_mac, BR_A_MAC, BR_B_MAC, SHARED, SHARED_V4},
    capture::{Announcement, Capture},
    support::{claim, claim_as},
};

/// How long after a claim's answer a capture waits for frames that are not coming. The claim is
/// answered once its announcements went out, so this only covers the wire.
const SETTLE: Duration = Duration::from_millis(500);

/// Announcing on the uplinks needs a config key (no flag), and the uplink named.
fn uplink_config(extra: &str) -> String {
    format!("[hygiene]\nannounce_on_uplinks = true\n{extra}")
}

/// The uplink peer's view of a claim of pod A's addresses by pod B (an early reuse): what
/// arrived at the peer, and the agent's `ipq_announcements_total` after it.
fn uplink_scenario(config: Option<&str>) -> anyhow::Result<(Vec<Announcement>, f64, String)> {
    let lab = Lab::new()?;
    let agent = match config {
        Some(config) => lab.start_agent_configured(config, &["--uplink", "up0"])?,
        None => lab.start_agent(&["--uplink", "up0"])?,
    };
    let capture = Capture::open(&lab.peer, "eth0")?;
    let addrs: [IpAddr; 2] = [POD_A_V4.into(), POD_A_V6.into()];
    let (answer, _) = claim(&lab, &addrs, "vethpb", POD_B_LLADDR)?;
    for view in answer["addresses"].as_array().context("addresses")? {
        let flush = &view["last_flush"];
        anyhow::ensure!(flush["errors"].is_null(), "{flush}");
    }
    let seen = capture.announcements(SETTLE)?;
    let counted = agent.metric("ipq_announcements_total", &[])?;
    Ok((seen, counted, agent.log()))
}

#[test]
fn with_announce_on_uplinks_the_uplink_peer_receives_the_new_holders_mac() -> anyhow::Result<()> {
    let (seen, counted, log) = uplink_scenario(Some(&uplink_config("")))?;
    for addr in [IpAddr::from(POD_A_V4), IpAddr::from(POD_A_V6)] {
        let want = Announcement {
            addr,
            mac: POD_B_LLADDR.to_owned(),
        };
        assert!(
            seen.contains(&want),
            "the peer on the uplink must receive {want:?} (a gratuitous ARP for v4, an \
             unsolicited NA for v6); it saw {seen:?}; log:\n{log}"
        );
    }
    assert!(
        seen.iter().all(|a| a.mac == POD_B_LLADDR),
        "only the new holder's MAC is announced: {seen:?}"
    );
    assert_eq!(
        counted, 2.0,
        "one announcement per address on the one uplink"
    );
    Ok(())
}

#[test]
fn by_default_nothing_is_announced_on_the_uplinks() -> anyhow::Result<()> {
    let (seen, counted, _) = uplink_scenario(None)?;
    let ours: Vec<_> = seen
        .iter()
        .filter(|a| a.addr == IpAddr::from(POD_A_V4) || a.addr == IpAddr::from(POD_A_V6))
        .collect();
    assert!(
        ours.is_empty(),
        "announce_on_uplinks is off by default: {ours:?}"
    );
    assert_eq!(counted, 0.0);
    Ok(())
}

#[test]
fn a_claim_without_a_mac_is_announced_with_the_mac_the_bridge_learned() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    let third = NetNs::new("pt")?;
    let agent = a_gone_b_configured(&lab, &third)?;
    let shared = SHARED;
    // Pod B sends one frame that names no address (a local experimental ethertype), so the
    // bridge learns its MAC behind vethbb and nobody learns anything about the shared ones.
    let mut hello = vec![0xff; 6];
    hello.extend_from_slice(&ipq_tests::lab::mac_bytes(BR_B_MAC));
    hello.extend_from_slice(&[0x88, 0xb5]);
    hello.extend_from_slice(&[0; 46]);
    send_frames(&lab.pod_b, "eth1", &[hello])?;
    poll(
        "the bridge learns B's MAC behind vethbb",
        Duration::from_secs(2),
        || {
            let fdb = node
                .command("bridge")
                .args(["fdb", "show", "dev", "vethbb"])
                .output()?;
            Ok(String::from_utf8_lossy(&fdb.stdout)
                .contains(BR_B_MAC)
                .then_some(()))
        },
    )?;
    assert_eq!(
        neighbour_mac(&third, SHARED_V4.into())?.as_deref(),
        Some(BR_A_MAC),
        "before the claim the third pod still resolves to A"
    );

    let capture = Capture::open(&third, "eth1")?;
    let holder = json!({"interface": "vethbb", "container_id": "c-new"});
    let (answer, _) = claim_as(&lab, &shared, holder)?;
    for view in answer["addresses"].as_array().context("addresses")? {
        let flush = &view["last_flush"];
        assert!(flush["errors"].is_null(), "{flush}; log:\n{}", agent.log());
        assert_eq!(
            flush["announcements"], 1,
            "one other port on the bridge: {flush}"
        );
    }
    let seen = capture.announcements(SETTLE)?;
    for addr in shared {
        let want = Announcement {
            addr,
            mac: BR_B_MAC.to_owned(),
        };
        assert!(seen.contains(&want), "{want:?} not in {seen:?}");
        let mac = poll(
            &format!("the third pod's entry for {addr} shows B's learned MAC"),
            Duration::from_secs(1),
            || Ok(neighbour_mac(&third, addr)?.filter(|m| m == BR_B_MAC)),
        )?;
        assert_eq!(mac, BR_B_MAC);
    }
    Ok(())
}

/// `n` addresses no one holds, from 10.77.0.`from` on.
fn fresh_addresses(from: u8, n: u8) -> Vec<IpAddr> {
    (from..from + n)
        .map(|i| IpAddr::V4(Ipv4Addr::new(10, 77, 0, i)))
        .collect()
}

#[test]
fn announcements_keep_to_announce_per_second() -> anyhow::Result<()> {
    const RATE: u32 = 3;
    const ADDRESSES: u8 = 20;
    let lab = Lab::new()?;
    let config = uplink_config(&format!("announce_per_second = {RATE}\n"));
    let agent = lab.start_agent_configured(&config, &["--uplink", "up0"])?;
    let capture = Capture::open(&lab.peer, "eth0")?;
    let mut total = 0.0;
    let mut total_limited = 0.0;
    // Two rounds, more than a second apart: the limit is a rate, not a cap.
    for (round, from) in [100u8, 150].into_iter().enumerate() {
        if round > 0 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        let addrs = fresh_addresses(from, ADDRESSES);
        let started = Instant::now();
        let (answer, _) = claim(&lab, &addrs, "vethpb", POD_B_LLADDR)?;
        let window = started.elapsed();
        let counted = agent.metric("ipq_announcements_total", &[])? - total;
        total += counted;
        let limited = agent.metric("ipq_announcements_rate_limited_total", &[])? - total_limited;
        total_limited += limited;
        // The bucket holds a second's worth and refills at the rate: within `window`, at most
        // RATE * (1 + window) go out, and a full bucket lets at least RATE through.
        let bound = (f64::from(RATE) * (1.0 + window.as_secs_f64())).ceil();
        assert!(
            (f64::from(RATE)..=bound).contains(&counted),
            "round {round}: {counted} announcements counted for {ADDRESSES} addresses claimed \
             within {window:?}; the limit allows {RATE} to {bound}"
        );
        let reported: u64 = answer["addresses"]
            .as_array()
            .context("addresses")?
            .iter()
            .map(|v: &Value| v["last_flush"]["announcements"].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(reported as f64, counted, "the answer and the counter agree");
        // Every address not announced says why, and is counted: one uplink, so each address
        // is either announced once or rate-limited.
        let skipped: Vec<&str> = answer["addresses"]
            .as_array()
            .context("addresses")?
            .iter()
            .filter_map(|v: &Value| v["last_flush"]["announce_skipped"].as_str())
            .collect();
        assert_eq!(skipped.len() as f64, limited, "reported {skipped:?}");
        assert_eq!(counted + limited, f64::from(ADDRESSES));
        assert!(
            skipped
                .iter()
                .all(|why| *why == format!("rate-limited (announce_per_second = {RATE})")),
            "{skipped:?}"
        );
        let seen: Vec<_> = capture
            .announcements(SETTLE)?
            .into_iter()
            .filter(|a| addrs.contains(&a.addr))
            .collect();
        assert_eq!(
            seen.len() as f64,
            counted,
            "round {round}: what reached the peer is what was counted: {seen:?}"
        );
    }
    Ok(())
}
