//! A corrupt journal is reported, kept aside, and never trusted: the agent rebuilds its
//! registry from the pinned maps (what the datapath still enforces) and a netlink dump, and a
//! quarantine in force survives.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use ipq_tests::{
    api::request,
    lab::{udp_burst, Lab, POD_A_V4, POD_B_V4},
};
use serde_json::json;

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

/// Concurrent API clients in the burst below.
const CLIENTS: u8 = 16;
/// Answered claims to wait for before the SIGKILL.
const ANSWERED_BEFORE_KILL: usize = 400;

/// Injected: SIGKILL while 16 clients keep claiming through the API (group commit: one
/// journal write for many requests). / Holds: every claim answered 200 is in the registry of
/// the next agent, with the container id only the journal knows (the maps do not hold it).
#[test]
fn every_answered_claim_survives_a_sigkill_in_the_middle_of_a_burst() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let args = ["--workload", "vethp*", "--uplink", "up0"];
    let mut agent = lab.start_agent(&args)?;
    let socket = lab.work_dir().join("ipq.sock");
    let answered: Arc<Mutex<Vec<(IpAddr, String)>>> = Arc::default();
    let refused = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (socket, answered, refused) = (socket.clone(), answered.clone(), refused.clone());
            let pid = agent.pid() as i32;
            thread::spawn(move || {
                for n in 1..=250u8 {
                    let addr = IpAddr::V4(Ipv4Addr::new(10, 99, client, n));
                    let container = format!("burst-{client}-{n}");
                    let body = json!({
                        "addresses": [addr],
                        "holder": { "interface": "vethpa", "container_id": container },
                    });
                    match request(&socket, "POST", "/v1/claims", Some(&body.to_string())) {
                        Ok(answer) if answer.status == 200 => {
                            let mut answered = answered.lock().unwrap();
                            answered.push((addr, container));
                            // Right after an answer: whatever it changed must be on disk by now.
                            if answered.len() == ANSWERED_BEFORE_KILL {
                                // SAFETY: signals the agent, our own child, not yet reaped.
                                unsafe { libc::kill(pid, libc::SIGKILL) };
                            }
                        }
                        // Anything else before the kill is a failure of its own.
                        Ok(answer) => {
                            eprintln!("{addr}: answered {} {}", answer.status, answer.body);
                            refused.store(true, Ordering::SeqCst);
                            return;
                        }
                        // The agent is gone: the burst is over.
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    for client in clients {
        client.join().expect("client thread");
    }
    agent.kill9();
    assert!(
        !refused.load(Ordering::SeqCst),
        "a claim was refused while the agent ran"
    );
    let answered = answered.lock().unwrap().clone();
    let total = usize::from(CLIENTS) * 250;
    assert!(
        answered.len() < total,
        "the kill came after the burst ({} of {total} answered): nothing was in flight",
        answered.len()
    );

    let agent = lab.start_agent(&args)?;
    let log = agent.log();
    assert!(!log.contains("is corrupt"), "{log}");
    for (addr, container) in &answered {
        let answer = request(&socket, "GET", &format!("/v1/addresses/{addr}"), None)?;
        assert_eq!(
            answer.status, 200,
            "{addr} was answered before the kill but is gone: {}",
            answer.body
        );
        let view = answer.json()?;
        assert_eq!(view["state"], "active", "{addr}: {view}");
        assert_eq!(
            view["holder"]["container_id"],
            container.as_str(),
            "{addr}: {view}"
        );
    }
    Ok(())
}
