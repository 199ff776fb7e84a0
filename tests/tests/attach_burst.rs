//! Attaching runs off the agent's owner loop: a burst of 100 new workload veths (each a TCX
//! link create and its RCU wait) must not hold up CNI ADDs arriving meanwhile, every pod's
//! protection state is visible while it is attached, and every veth ends up protected.
//!
//! No timing is asserted beyond ipq-cni's own `timeoutMs` (the default, 2 s): an ADD that
//! waited behind the attaches would fail with it.
//!
//! Needs root, bpffs, the Debian CNI plugins and `target/debug/`; `cargo xtask test`
//! provides them.

use std::{thread, time::Duration};

use ipq_tests::{
    api,
    cni::{addresses, host_interface, Attachment, Chain},
    lab::{poll, Lab},
    netns::NetNs,
};
use serde_json::{json, Value};

const BURST: usize = 100;

fn status(socket: &std::path::Path) -> anyhow::Result<Value> {
    api::request(socket, "GET", "/v1/status", None)?.json()
}

#[test]
fn cni_adds_during_a_burst_of_new_veths_succeed_and_every_veth_gets_protected() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&["--workload", "veth*"])
        .expect("starting ipq-agent");
    let socket = agent.api_socket();
    let ptp = json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "dataDir": lab.work_dir().join("cni-data"),
            "ranges": [[{"subnet": "10.93.0.0/24"}], [{"subnet": "fd93::/64"}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    });
    let ipq = json!({
        "type": "ipq-cni",
        "socket": socket,
        "stateDir": lab.work_dir().join("state"),
        "onUnavailable": "fail",
    });
    let chain = Chain::new(
        &lab.node,
        format!("ipq-burst-{}", std::process::id()),
        "1.0.0",
        vec![ptp, ipq],
    )
    .expect("a ptp chain");

    // 100 veths in one `ip -batch`, as fast as the kernel makes them.
    let mut ip = lab
        .routes()
        .spawn_veth_batch("vethq", "ipqq", BURST)
        .expect("adding the veths");
    // The burst has reached the agent once it knows some of the new veths.
    poll("the burst under way", Duration::from_secs(20), || {
        let known = status(&socket)?["interfaces"].as_array().map_or(0, |list| {
            list.iter()
                .filter(|i| i["name"].as_str().is_some_and(|n| n.starts_with("vethq")))
                .count()
        });
        Ok((known > 0).then_some(()))
    })
    .expect("the agent sees the burst");

    let mut pods = Vec::new();
    for n in 0..3 {
        let ns = NetNs::new(&format!("cb{n}")).expect("a container namespace");
        let attachment = Attachment::new(format!("burst{n}{}", std::process::id()), &ns);
        let result = chain
            .add(&attachment)
            .unwrap_or_else(|e| panic!("ADD {n} during the burst: {e}\n{}", agent.log()));
        let host_if = host_interface(&result, None).expect("the host interface");
        let addrs = addresses(&result).expect("the addresses");
        pods.push((ns, host_if, addrs));
        thread::sleep(Duration::from_millis(20));
    }
    let done = ip.wait().expect("ip -batch");
    assert!(done.success(), "ip -batch failed: {done}");

    // Each pod's address says whether its interface is protected; all end up protected.
    for (_, host_if, addrs) in &pods {
        for addr in addrs {
            let view = poll("the pod protected", Duration::from_secs(30), || {
                let view =
                    api::request(&socket, "GET", &format!("/v1/addresses/{addr}"), None)?.json()?;
                let protection = view["protection"].as_str().unwrap_or("").to_owned();
                assert!(
                    ["attaching", "protected"].contains(&protection.as_str()),
                    "{addr} on {host_if}: {view}"
                );
                Ok((protection == "protected").then_some(view))
            })
            .expect("pod protected");
            assert_eq!(view["holder"]["ifname"], host_if.as_str(), "{view}");
        }
    }
    let status = poll("every veth protected", Duration::from_secs(60), || {
        let status = status(&socket)?;
        Ok((status["unprotected"] == 0 && status["ready"] == true).then_some(status))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let protected = status["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter(|i| i["protection"] == "protected")
        .count();
    // The burst, the three pods and the lab's two pods.
    assert_eq!(protected, BURST + 3 + 2, "{status}");
}
