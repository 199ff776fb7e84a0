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
    time::{Duration, SystemTime},
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
    lab.maps().wait_entry(pod_a, timeout, "claimed", |e| {
        e.is_some_and(|e| e.state == "active")
    })?;
    lab.maps().wait_entry(pod_b, timeout, "claimed", |e| {
        e.is_some_and(|e| e.state == "active")
    })?;
    lab.node.ip(&["link", "del", "vethpa"])?;
    lab.maps().wait_entry(pod_a, timeout, "quarantined", |e| {
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
    // Reported where an operator looks: `ipq status`'s recovery, with the file kept aside.
    let recovery = recovery_of(&agent)?;
    assert_eq!(recovery["from"], "pinned_maps", "{recovery}");
    assert!(
        problems(&recovery).iter().any(|p| p.contains("is corrupt")
            && p.contains("checksum mismatch")
            && p.contains(".corrupt-")),
        "the corruption must be reported: {recovery}"
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
    let entries = lab.maps().entries()?;
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
    // And the rebuilt registry took no second failure.
    assert!(
        !problems(&recovery)
            .iter()
            .any(|p| p.contains("recovering the registry failed")),
        "{recovery}"
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
    let recovery = recovery_of(&agent)?;
    assert_eq!(recovery["from"], "journal", "{recovery}");
    assert!(
        problems(&recovery)
            .iter()
            .all(|p| !p.contains("is corrupt")),
        "{recovery}"
    );
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

/// A journal in the header-only form a newer ipq writes (format version 3 here, synthetic):
/// the contract's `format` and `version`, then lines this agent cannot read.
fn future_journal() -> Vec<u8> {
    let mut bytes = Vec::new();
    for json in [
        r#"{"format":"ipq-journal","version":3,"layout":"columnar"}"#,
        r#"{"columns":["addr","holder"],"rows":[["10.1.2.3","c0ffee"]]}"#,
    ] {
        let sum = json.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, b| {
            (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        bytes.extend_from_slice(format!("{sum:016x} {json}\n").as_bytes());
    }
    bytes
}

/// Injected: a rollback, i.e. an agent that finds the journal a newer ipq wrote. / Holds: the
/// file is left byte for byte for the newer agent's return and nothing is called corrupt; the
/// quarantine keeps its deadline and its fence (the pinned maps); what the rolled-back agent
/// answers is durable (its own journal beside the newer one), holder identity included.
#[test]
fn a_rolled_back_agent_leaves_a_newer_journal_untouched_and_journals_beside_it(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let pod_a = IpAddr::V4(POD_A_V4);
    let pod_b = IpAddr::V4(POD_B_V4);
    let socket = lab.work_dir().join("ipq.sock");
    let mut agent = lab.start_agent(&ARGS)?;
    let timeout = Duration::from_secs(10);
    for pod in [pod_a, pod_b] {
        lab.maps().wait_entry(pod, timeout, "claimed", |e| {
            e.is_some_and(|e| e.state == "active")
        })?;
    }
    lab.node.ip(&["link", "del", "vethpa"])?;
    lab.maps().wait_entry(pod_a, timeout, "quarantined", |e| {
        e.is_some_and(|e| e.state == "quarantined")
    })?;
    let view = |addr: IpAddr| -> anyhow::Result<serde_json::Value> {
        request(&socket, "GET", &format!("/v1/addresses/{addr}"), None)?.json()
    };
    // The deadline as the API renders it (wall-clock, from the monotonic deadline at the time
    // of the request: two renderings differ by the rounding and by the agent being scheduled
    // out between its reads of the two clocks, a few ms on a loaded machine; a deadline that
    // restarted would move by seconds).
    let until = |addr: IpAddr| -> anyhow::Result<SystemTime> {
        let view = view(addr)?;
        let text = view["until"]
            .as_str()
            .ok_or_else(|| anyhow::anyhow!("no until: {view}"))?;
        Ok(humantime::parse_rfc3339(text)?)
    };
    let deadline = until(pod_a)?;
    let keeps_its_deadline = |addr: IpAddr| -> anyhow::Result<()> {
        let now = until(addr)?;
        let drift = now
            .duration_since(deadline)
            .unwrap_or_else(|e| e.duration());
        anyhow::ensure!(
            drift <= Duration::from_millis(50),
            "the quarantine's deadline moved by {drift:?}"
        );
        Ok(())
    };
    agent.terminate()?;
    drop(agent);

    let journal = lab.work_dir().join("state/registry.journal");
    let future = future_journal();
    fs::write(&journal, &future)?;

    let mut agent = lab.start_agent(&ARGS)?;
    let recovery = recovery_of(&agent)?;
    let said = problems(&recovery);
    assert!(
        said.iter().any(
            |p| p.contains("was written by a newer ipq (format version 3")
                && p.contains("registry.journal.v2")
        ),
        "the rollback must say what it found and where it journals: {recovery}"
    );
    assert!(said.iter().all(|p| !p.contains("is corrupt")), "{recovery}");
    assert_eq!(view(pod_a)?["state"], "quarantined");
    keeps_its_deadline(pod_a)?;
    assert_eq!(udp_burst(&lab.peer, &lab.pod_a, pod_a, 10), 0);
    assert_eq!(udp_burst(&lab.peer, &lab.pod_b, pod_b, 10), 10);

    // A claim answered by the rolled-back agent is durable: the next start knows its holder,
    // which only a journal holds.
    let claimed = IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1));
    let body = json!({
        "addresses": [claimed],
        "holder": { "interface": "vethpb", "container_id": "after-the-rollback" },
    });
    let answer = request(&socket, "POST", "/v1/claims", Some(&body.to_string()))?;
    assert_eq!(answer.status, 200, "{}", answer.body);
    agent.terminate()?;
    drop(agent);
    let _agent = lab.start_agent(&ARGS)?;
    assert_eq!(
        view(claimed)?["holder"]["container_id"],
        "after-the-rollback"
    );
    keeps_its_deadline(pod_a)?;

    assert_eq!(fs::read(&journal)?, future, "left for the newer agent");
    let set_aside = fs::read_dir(lab.work_dir().join("state"))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .count();
    assert_eq!(set_aside, 0);
    Ok(())
}

/// The agent's account of its start-up recovery, from `GET /v1/status`.
fn recovery_of(agent: &ipq_tests::lab::Agent<'_>) -> anyhow::Result<serde_json::Value> {
    let status: serde_json::Value =
        request(&agent.api_socket(), "GET", "/v1/status", None)?.json()?;
    Ok(status["recovery"].clone())
}

/// The problems recovery found, as text.
fn problems(recovery: &serde_json::Value) -> Vec<String> {
    recovery["problems"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}
