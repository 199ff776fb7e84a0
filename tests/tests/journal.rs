//! A corrupt journal is reported, kept aside, and never trusted: the agent rebuilds its
//! registry from the pinned maps (what the datapath still enforces) and a netlink dump, and a
//! quarantine in force survives.

use std::{fs, net::IpAddr, time::Duration};

use ipq_tests::lab::{udp_burst, Lab, POD_A_V4, POD_B_V4};

const ARGS: [&str; 10] = [
    "--workload",
    "vethp*",
    "--uplink",
    "up0",
    "--cooldown",
    "60s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "120s",
];

#[test]
fn a_corrupt_journal_is_set_aside_and_the_quarantine_rebuilt_from_the_maps() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let pod_a = IpAddr::V4(POD_A_V4);
    let pod_b = IpAddr::V4(POD_B_V4);
    let mut agent = lab.start_agent(&ARGS)?;
    let timeout = Duration::from_secs(10);
    lab.wait_entry(pod_a, timeout, "claimed", |e| {
        e.is_some_and(|e| e.state == "active")
    })?;
    lab.wait_entry(pod_b, timeout, "claimed", |e| {
        e.is_some_and(|e| e.state == "active")
    })?;
    lab.node.ip(&["link", "del", "vethpa"])?;
    lab.wait_entry(pod_a, timeout, "quarantined", |e| {
        e.is_some_and(|e| e.state == "quarantined")
    })?;
    agent.terminate()?;
    drop(agent);

    // Flip one byte of the journal's body: the checksum no longer matches.
    let journal = lab.work_dir().join("state/registry.journal");
    let mut bytes = fs::read(&journal)?;
    let at = bytes.len() - 3;
    bytes[at] ^= 0x01;
    fs::write(&journal, &bytes)?;

    let agent = lab.start_agent(&ARGS)?;
    let log = agent.log();
    assert!(
        log.contains("is corrupt") && log.contains("checksum mismatch"),
        "the corruption must be reported:\n{log}"
    );
    let kept: Vec<_> = fs::read_dir(lab.work_dir().join("state"))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert_eq!(
        kept.len(),
        1,
        "the corrupt journal is kept aside as evidence"
    );
    assert_eq!(fs::read(kept[0].path())?, bytes);

    // Rebuilt: the quarantine from the maps, pod b from its route; the datapath still drops
    // stale traffic for pod a's address and passes pod b's.
    let entries = lab.datapath_entries()?;
    assert_eq!(
        entries.get(&pod_a).map(|e| e.state.as_str()),
        Some("quarantined")
    );
    assert_eq!(
        entries.get(&pod_b).map(|e| e.state.as_str()),
        Some("active")
    );
    assert_eq!(
        agent.metric("ipq_addresses", &[("state", "quarantined")])?,
        2.0,
        "pod a, v4 and v6"
    );
    assert_eq!(
        agent.metric("ipq_addresses", &[("state", "active")])?,
        2.0,
        "pod b, v4 and v6"
    );
    assert_eq!(udp_burst(&lab.peer, &lab.pod_a, pod_a, 10), 0);
    assert_eq!(udp_burst(&lab.peer, &lab.pod_b, pod_b, 10), 10);
    // And the rebuilt registry is journaled again, readable this time.
    let log_after = agent.log();
    assert!(
        !log_after.contains("recovering the registry failed"),
        "{log_after}"
    );
    Ok(())
}
