//! Real traffic through the lab with the real agent: a fenced pod is cut off both ways while
//! its neighbour works, in enforce mode; observe mode passes everything and counts what enforce
//! mode would have dropped; and a lab leaves nothing behind.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf};

use ipq_tests::{
    lab::{self, Agent, Lab, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6, POD_B_V4, POD_B_V6},
    netns::NetNs,
};

const UDP_COUNT: usize = 20;
const PING_COUNT: u32 = 5;

const AGENT_ARGS: &[&str] = &["--workload", "vethp*", "--uplink", "up0"];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Enforce,
    Observe,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Udp,
    Ping,
}

/// One burst of traffic and what it must do.
struct Flow<'a> {
    what: String,
    kind: Kind,
    from: &'a NetNs,
    to: &'a NetNs,
    dst: IpAddr,
    /// Packets the datapath judges to the fenced pod's disadvantage, by hook: what enforce
    /// mode drops and observe mode counts.
    fenced: &'static [(&'static str, u32)],
}

/// Every flow, both address families: pod a (fenced) and pod b (active), each way, UDP and
/// ICMP echo.
fn flows(lab: &Lab) -> Vec<Flow<'_>> {
    let mut flows = Vec::new();
    let families: [(&str, IpAddr, IpAddr, IpAddr); 2] = [
        ("v4", POD_A_V4.into(), POD_B_V4.into(), PEER_V4.into()),
        ("v6", POD_A_V6.into(), POD_B_V6.into(), PEER_V6.into()),
    ];
    for (family, a, b, peer) in families {
        for (kind, name) in [(Kind::Udp, "udp"), (Kind::Ping, "ping")] {
            let mut flow = |what: &str, from, to, dst, fenced| {
                flows.push(Flow {
                    what: format!("{name} {family} {what}"),
                    kind,
                    from,
                    to,
                    dst,
                    fenced,
                })
            };
            // What pod a sends is judged at TC ingress of vethpa, what it receives at TC egress.
            flow(
                "pod a -> peer",
                &lab.pod_a,
                &lab.peer,
                peer,
                &[("tc_ingress", 1)],
            );
            flow(
                "peer -> pod a",
                &lab.peer,
                &lab.pod_a,
                a,
                &[("tc_egress", 1)],
            );
            flow("pod b -> peer", &lab.pod_b, &lab.peer, peer, &[]);
            flow("peer -> pod b", &lab.peer, &lab.pod_b, b, &[]);
        }
    }
    flows
}

/// Sends one flow and checks deliveries and the exact counter changes for `mode`.
fn check_flow(agent: &Agent, flow: &Flow, mode: Mode) {
    let before = agent.scrape().expect("scrape before");
    let (sent, delivered) = match flow.kind {
        Kind::Udp => (
            UDP_COUNT as u32,
            lab::udp_burst(flow.from, flow.to, flow.dst, UDP_COUNT) as u32,
        ),
        Kind::Ping => (PING_COUNT, lab::ping(flow.from, flow.dst, PING_COUNT)),
    };
    let after = agent.scrape().expect("scrape after");

    let fenced = !flow.fenced.is_empty();
    let expect_delivered = if fenced && mode == Mode::Enforce {
        0
    } else {
        sent
    };
    assert_eq!(
        delivered, expect_delivered,
        "{}: {sent} sent, {delivered} delivered in {mode:?} mode",
        flow.what
    );

    let mut judged: BTreeMap<String, f64> = flow
        .fenced
        .iter()
        .map(|(hook, per)| (format!("hook={hook},reason=fenced"), f64::from(per * sent)))
        .collect();
    // Once requests pass (observe mode), the replies cross the fenced pod's interface the other
    // way and are judged too: an echo reply to pod a at egress, from pod a at ingress.
    if let (Kind::Ping, Mode::Observe, [(hook, _)]) = (flow.kind, mode, flow.fenced) {
        let other = if *hook == "tc_ingress" {
            "tc_egress"
        } else {
            "tc_ingress"
        };
        judged.insert(format!("hook={other},reason=fenced"), f64::from(sent));
    }
    let (acting, idle) = match mode {
        Mode::Enforce => ("ipq_dropped_packets_total", "ipq_observed_packets_total"),
        Mode::Observe => ("ipq_observed_packets_total", "ipq_dropped_packets_total"),
    };
    // Neighbour resolution (ARP or NDP) between pod a and the node may also run while the flow
    // does, more likely on a loaded machine: pod a's requests and replies carry its fenced
    // address (judged at tc_ingress), the node's to it target that address (tc_egress). Those,
    // and only those, may add to what the flow's own packets count: at most 2 per judged hook.
    let changes = after.changes_since(&before, acting);
    let within_probes = changes.len() == judged.len()
        && changes.iter().all(|(key, got)| {
            let want = judged.get(key).copied().unwrap_or(f64::NAN);
            *got >= want && *got <= want + 2.0
        });
    assert!(
        within_probes,
        "{}: changes of {acting} in {mode:?} mode: {changes:?}, want {judged:?} (each judged \
         hook may carry up to 2 neighbour packets more)",
        flow.what
    );
    assert_eq!(
        after.changes_since(&before, idle),
        BTreeMap::new(),
        "{}: {idle} must not move in {mode:?} mode",
        flow.what
    );
}

fn assert_attached(agent: &Agent) {
    for (hook, n) in [("tc_ingress", 2.0), ("tc_egress", 2.0), ("xdp", 1.0)] {
        assert_eq!(
            agent
                .metric("ipq_datapath_interfaces", &[("hook", hook)])
                .unwrap(),
            n,
            "interfaces with {hook} attached"
        );
    }
}

fn run_all_flows(mode: Mode) {
    let lab = Lab::new().expect("building the lab");
    let mut args = AGENT_ARGS.to_vec();
    if mode == Mode::Observe {
        args.extend(["--mode", "observe"]);
    }
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    assert_attached(&agent);
    // Counted once per hook: while an interface moves from its netlink filter to its TCX link,
    // both run the program for a moment, and a packet they pass (observe) is judged twice.
    ipq_tests::attach::wait_tc_upgrades(&agent);
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    for flow in flows(&lab) {
        check_flow(&agent, &flow, mode);
    }
}

#[test]
fn enforce_drops_fenced_pod_both_ways_and_counts_every_packet() {
    run_all_flows(Mode::Enforce);
}

#[test]
fn observe_passes_everything_and_counts_what_enforce_would_drop() {
    run_all_flows(Mode::Observe);
}

/// What a lab leaves behind once dropped: the names and paths it used, and the agent's pid.
struct Footprint {
    netns: Vec<String>,
    paths: Vec<PathBuf>,
    agent_pid: u32,
}

/// Builds a lab with a running, enforcing agent (so there are pins and attachments to clean).
fn busy_lab_footprint(lab: &Lab, agent: &Agent) -> Footprint {
    lab.maps().fence_pod_a().expect("fencing pod a");
    assert_eq!(lab::udp_burst(&lab.pod_a, &lab.peer, PEER_V4.into(), 3), 0);
    let footprint = Footprint {
        netns: lab.netns_names(),
        paths: vec![lab.bpffs.path().to_owned(), lab.work_dir().to_owned()],
        agent_pid: agent.pid(),
    };
    for path in &footprint.paths {
        assert!(
            path.exists(),
            "{} exists while the lab runs",
            path.display()
        );
    }
    footprint
}

fn assert_nothing_left(footprint: &Footprint) {
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for name in &footprint.netns {
        assert!(
            !listed.split_whitespace().any(|n| n == name),
            "netns {name} is left over:\n{listed}"
        );
    }
    for path in &footprint.paths {
        assert!(!path.exists(), "{} is left over", path.display());
    }
    // SAFETY: signal 0 only checks whether the process exists.
    let alive = unsafe { libc::kill(footprint.agent_pid as i32, 0) } == 0;
    assert!(!alive, "ipq-agent {} still runs", footprint.agent_pid);
}

#[test]
fn lab_leaves_nothing_behind_when_dropped_or_unwound() {
    // Dropped normally.
    let footprint = {
        let lab = Lab::new().expect("building the lab");
        let agent = lab.start_agent(AGENT_ARGS).expect("starting ipq-agent");
        busy_lab_footprint(&lab, &agent)
    };
    assert_nothing_left(&footprint);

    // Dropped while a test panics: the guards must clean up on unwind too.
    let mut footprint = None;
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let lab = Lab::new().expect("building the lab");
        let agent = lab.start_agent(AGENT_ARGS).expect("starting ipq-agent");
        footprint = Some(busy_lab_footprint(&lab, &agent));
        panic!("deliberate panic: checking clean-up on unwind");
    }));
    assert!(unwound.is_err(), "the closure panics");
    assert_nothing_left(&footprint.expect("the lab was built"));
}
