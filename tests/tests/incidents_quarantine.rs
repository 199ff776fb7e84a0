//! Incidents of the quarantine replayed with real traffic (DESIGN §2, issue 3):
//!
//! - (c) stale inbound traffic for a gone pod: dropped at the uplink, counted, and holding the
//!   quarantine until `quiet_period` has passed without any (never ending before `cooldown`);
//! - (f) graceful termination: a draining pod nobody else claims keeps its connectivity until
//!   it is gone, then its addresses are quarantined;
//! - (g) an agent SIGKILLed mid-quarantine and restarted: the quarantine holds throughout and
//!   ends at its original deadline (the AWS VPC CNI restart bug must not exist here).
//!
//! (c) and (g) run again with the agent in a time namespace whose monotonic and boottime
//! clocks are 100000 s ahead (`unshare --time`, issue 36): the programs' stamps
//! (`bpf_ktime_get_*`) are not namespaced, and the agent must read the kernel's clock as they
//! do, or stale traffic looks 100000 s old and journal deadlines long past.
//!
//! Times are measured from just before the test acts, so a lower bound ("not released before
//! t") can only be met early by an agent that really releases early; upper bounds carry slack
//! for a loaded machine.
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    time::{Duration, Instant},
};

use ipq_tests::lab::{
    ifindex, map_entry as entry, ping, udp_burst, udp_burst_with, wait_for_entry, Agent, Lab,
    MapEntry, UdpSender, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6,
};

const N: usize = 20;
const PING_COUNT: u32 = 5;
const SETTLE: Duration = Duration::from_secs(5);

/// The agent run in a time namespace whose monotonic and boottime clocks are 100000 s ahead
/// of the kernel's (the machine's own clocks untouched).
const TIME_NAMESPACE: [&str; 6] = [
    "unshare",
    "--time",
    "--monotonic",
    "100000",
    "--boottime",
    "100000",
];

/// How late a release may be observed after it is due, on a loaded machine.
const SLACK: Duration = Duration::from_millis(1500);
/// How much earlier than the userspace clock the kernel's coarse clock may stamp a packet.
const COARSE: Duration = Duration::from_millis(50);

fn pod_a() -> [IpAddr; 2] {
    [POD_A_V4.into(), POD_A_V6.into()]
}

fn agent_args<'a>(cooldown: &'a str, quiet: &'a str) -> Vec<&'a str> {
    vec![
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--cooldown",
        cooldown,
        "--quiet-period",
        quiet,
        "--max-cooldown",
        "20s",
    ]
}

/// Waits for the start-up claims of pod a; returns vethpa's ifindex.
fn wait_pod_a_claimed(lab: &Lab) -> u32 {
    let vethpa = ifindex(&lab.node, "vethpa").expect("vethpa");
    for addr in pod_a() {
        wait_for_entry(lab, addr, &entry("active", vethpa, 0), SETTLE);
    }
    vethpa
}

/// Deletes vethpa (pod a is gone) and waits until both its addresses are quarantined.
/// Returns the instant just before the deletion.
fn delete_pod_a(lab: &Lab) -> Instant {
    let t0 = Instant::now();
    lab.node
        .ip(&["link", "del", "vethpa"])
        .expect("deleting vethpa");
    for addr in pod_a() {
        wait_for_entry(lab, addr, &entry("quarantined", 0, 0), SETTLE);
    }
    t0
}

/// What the pinned map said at one moment.
struct Observation {
    /// When the read finished: a state seen is no older than this.
    at: Instant,
    entries: BTreeMap<IpAddr, MapEntry>,
}

impl Observation {
    fn take(lab: &Lab) -> Observation {
        let entries = lab.maps().entries().expect("datapath show");
        Observation {
            at: Instant::now(),
            entries,
        }
    }

    fn quarantined(&self, addr: IpAddr) -> bool {
        self.entries
            .get(&addr)
            .is_some_and(|e| e.state == "quarantined")
    }
}

/// Observes the map every 50 ms until `until`, or until every address of `addrs` has left it.
fn observe_until(lab: &Lab, addrs: &[IpAddr], until: Instant, into: &mut Vec<Observation>) {
    loop {
        let observation = Observation::take(lab);
        let all_gone = addrs.iter().all(|a| !observation.entries.contains_key(a));
        into.push(observation);
        if all_gone || Instant::now() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Checks that `addr` was quarantined in every observation before `not_before`, and left the
/// map for good no later than `by`. Returns when it was first seen released.
fn assert_released_between(
    observations: &[Observation],
    addr: IpAddr,
    t0: Instant,
    not_before: Instant,
    by: Instant,
) -> Instant {
    let rel = |t: Instant| t.saturating_duration_since(t0);
    let first_free = observations
        .iter()
        .position(|o| !o.entries.contains_key(&addr))
        .unwrap_or_else(|| {
            panic!(
                "{addr} was never released (still quarantined at t0+{:?}; due by t0+{:?})",
                rel(observations.last().unwrap().at),
                rel(by)
            )
        });
    for o in &observations[..first_free] {
        assert!(
            o.quarantined(addr),
            "{addr} at t0+{:?}: {:?}, not quarantined",
            rel(o.at),
            o.entries.get(&addr)
        );
    }
    let released = observations[first_free].at;
    eprintln!(
        "{addr}: released at t0+{:?} (window t0+{:?} .. t0+{:?})",
        rel(released),
        rel(not_before),
        rel(by)
    );
    assert!(
        released >= not_before,
        "{addr} released too early: gone at t0+{:?}, must hold until t0+{:?}",
        rel(released),
        rel(not_before)
    );
    assert!(
        released <= by,
        "{addr} released too late: still there until t0+{:?}, due by t0+{:?}",
        rel(released),
        rel(by)
    );
    for o in &observations[first_free..] {
        assert!(
            !o.entries.contains_key(&addr),
            "{addr} came back at t0+{:?}: {:?}",
            rel(o.at),
            o.entries.get(&addr)
        );
    }
    released
}

/// Sends one UDP datagram to `dst` every `every` for `length`, from inside `ns`. Returns how
/// many were sent and the instant just before the last one was sent.
fn stream(
    lab_ns: &ipq_tests::netns::NetNs,
    dst: IpAddr,
    every: Duration,
    length: Duration,
) -> (usize, Instant) {
    lab_ns.run(|| {
        let any: IpAddr = match dst {
            IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        let socket = UdpSocket::bind((any, 0)).expect("binding the stale sender");
        let end = Instant::now() + length;
        let mut sent = 0;
        let mut last = Instant::now();
        while Instant::now() < end {
            last = Instant::now();
            socket
                .send_to(b"stale", (dst, 9))
                .unwrap_or_else(|e| panic!("sending stale traffic to {dst}: {e}"));
            sent += 1;
            std::thread::sleep(every);
        }
        (sent, last)
    })
}

fn histogram(agent: &Agent, name: &str) -> (f64, f64) {
    let scrape = agent.scrape().expect("scrape");
    (
        scrape.get(&format!("{name}_count"), &[]).unwrap_or(0.0),
        scrape.get(&format!("{name}_sum"), &[]).unwrap_or(0.0),
    )
}

/// (c) Pod a is gone; the peer keeps sending to 10.77.0.2 for 5 s. Every packet is dropped
/// at the uplink (xdp, stale_traffic) and counted; 10.77.0.2 stays quarantined past its 2 s
/// cool-down while the packets come, and is released 2 s (`quiet_period`) after the last one.
/// fd77::2, which gets no stale traffic, is released at its cool-down, not before.
#[test]
fn stale_inbound_is_dropped_at_the_uplink_and_holds_the_quarantine_until_quiet() {
    stale_inbound_holds_the_quarantine_until_quiet(&[]);
}

/// (c) with the agent in a time namespace 100000 s ahead: measured before, the agent took the
/// programs' stamps of the stale traffic for 100000 s old and ended the quarantine at its
/// cool-down, ignoring the traffic.
#[test]
fn in_a_time_namespace_stale_inbound_still_holds_the_quarantine_until_quiet() {
    stale_inbound_holds_the_quarantine_until_quiet(&TIME_NAMESPACE);
}

fn stale_inbound_holds_the_quarantine_until_quiet(wrapper: &[&str]) {
    let cooldown = Duration::from_secs(2);
    let quiet = Duration::from_secs(2);
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent_wrapped(wrapper, &agent_args("2s", "2s"))
        .expect("starting ipq-agent");
    wait_pod_a_claimed(&lab);
    let (stale, silent) = (IpAddr::from(POD_A_V4), IpAddr::from(POD_A_V6));
    let before = agent.scrape().expect("scrape");
    let (durations_before, _) = histogram(&agent, "ipq_quarantine_duration_seconds");

    let t0 = delete_pod_a(&lab);
    let mut observations = Vec::new();
    let (sent, last_sent) = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            stream(
                &lab.peer,
                stale,
                Duration::from_millis(20),
                Duration::from_secs(5),
            )
        });
        while !sender.is_finished() {
            observations.push(Observation::take(&lab));
            std::thread::sleep(Duration::from_millis(50));
        }
        sender.join().expect("the stale sender")
    });
    observe_until(
        &lab,
        &[stale, silent],
        last_sent + quiet + SLACK + SLACK,
        &mut observations,
    );

    assert!(
        observations
            .iter()
            .any(|o| o.at > t0 + Duration::from_secs(4) && o.quarantined(stale)),
        "{stale} must be seen quarantined after t0+4s, well past its cool-down"
    );
    assert_released_between(
        &observations,
        stale,
        t0,
        last_sent + quiet - COARSE,
        last_sent + quiet + SLACK,
    );
    assert_released_between(
        &observations,
        silent,
        t0,
        t0 + cooldown,
        t0 + cooldown + SLACK,
    );

    let after = agent.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        BTreeMap::from([("hook=xdp,reason=stale_traffic".to_owned(), sent as f64)]),
        "every stale packet ({sent} sent) dropped at the uplink, nothing else"
    );
    assert!(
        after
            .get("ipq_stale_traffic_age_seconds_count", &[])
            .unwrap_or(0.0)
            > 0.0,
        "stale traffic ages are recorded"
    );
    let (durations, _) = histogram(&agent, "ipq_quarantine_duration_seconds");
    assert_eq!(
        durations - durations_before,
        2.0,
        "two quarantines ended (ipq_quarantine_duration_seconds_count)"
    );
    assert_eq!(
        after
            .get("ipq_addresses", &[("state", "quarantined")])
            .unwrap(),
        0.0,
        "nothing left quarantined"
    );
}

/// (f) Pod a's routes are withdrawn (it terminates) and nobody claims its addresses: it keeps
/// its connectivity both ways (UDP each way, ping with replies; the node reaches it through a
/// policy route outside the main table) with nothing dropped or reported, until its interface
/// is deleted; then its addresses are quarantined.
#[test]
fn graceful_termination_keeps_a_draining_pod_connected_until_it_is_gone() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent(&["--workload", "vethp*", "--uplink", "up0"])
        .expect("starting ipq-agent");
    let vethpa = wait_pod_a_claimed(&lab);
    lab.routes()
        .route_to_via_table("vethpa", 101, &pod_a())
        .expect("policy routes to pod a");
    for addr in pod_a() {
        lab.routes()
            .del_host_route("vethpa", addr)
            .expect("withdrawing pod a's route");
        wait_for_entry(&lab, addr, &entry("draining", vethpa, 0), SETTLE);
    }

    let before = agent.scrape().expect("scrape");
    for (addr, peer) in [
        (IpAddr::from(POD_A_V4), IpAddr::from(PEER_V4)),
        (POD_A_V6.into(), PEER_V6.into()),
    ] {
        let out = udp_burst_with(
            &lab.pod_a,
            UdpSender {
                bind: Some(addr),
                device: None,
            },
            &lab.peer,
            peer,
            N,
        );
        assert_eq!(out, N, "draining pod a -> {peer}: {out} of {N} delivered");
        let inbound = udp_burst(&lab.peer, &lab.pod_a, addr, N);
        assert_eq!(
            inbound, N,
            "{peer} -> draining pod a at {addr}: {inbound} of {N} delivered"
        );
        let replies = ping(&lab.pod_a, peer, PING_COUNT);
        assert_eq!(
            replies, PING_COUNT,
            "draining pod a pings {peer}: {replies} of {PING_COUNT} replies"
        );
    }
    let after = agent.scrape().expect("scrape");
    for family in [
        "ipq_dropped_packets_total",
        "ipq_observed_packets_total",
        "ipq_conflicts_total",
    ] {
        assert_eq!(
            after.changes_since(&before, family),
            BTreeMap::new(),
            "{family} must not move while pod a drains alone"
        );
    }
    for addr in pod_a() {
        wait_for_entry(&lab, addr, &entry("draining", vethpa, 0), SETTLE);
    }

    lab.node
        .ip(&["link", "del", "vethpa"])
        .expect("deleting vethpa");
    for addr in pod_a() {
        wait_for_entry(&lab, addr, &entry("quarantined", 0, 0), SETTLE);
    }
    let scrape = agent.scrape().expect("scrape");
    for (state, want) in [("quarantined", 2.0), ("draining", 0.0)] {
        assert_eq!(
            scrape.get("ipq_addresses", &[("state", state)]).unwrap(),
            want,
            "ipq_addresses{{state={state}}} once pod a is gone"
        );
    }
}

/// (g) The agent is SIGKILLed 1 s into a 10 s cool-down and restarted 2 s later. Stale traffic
/// is dropped throughout (while no agent runs too), the addresses stay quarantined past the
/// restart, and they are released at the original deadline (t0+10s), not 10 s after the
/// restart (t0+13s). The cool-down leaves room for a slow restart on a loaded machine: the
/// last stale packet plus the quiet period must still end before it.
#[test]
fn restart_mid_quarantine_keeps_the_quarantine_and_its_original_deadline() {
    restart_mid_quarantine_keeps_the_original_deadline(&[]);
}

/// (g) with the restarted agent in a time namespace 100000 s ahead: measured before, it took
/// the journal's deadlines (the kernel's clock) for long past and ended the quarantines at
/// once.
#[test]
fn restarted_in_a_time_namespace_the_quarantine_keeps_its_original_deadline() {
    restart_mid_quarantine_keeps_the_original_deadline(&TIME_NAMESPACE);
}

/// (g), the second agent run through `wrapper`.
fn restart_mid_quarantine_keeps_the_original_deadline(wrapper: &[&str]) {
    let cooldown = Duration::from_secs(10);
    let lab = Lab::new().expect("building the lab");
    let args = agent_args("10s", "1s");
    let mut first = lab.start_agent(&args).expect("starting ipq-agent");
    wait_pod_a_claimed(&lab);

    let t0 = delete_pod_a(&lab);
    let before = first.scrape().expect("scrape");
    let sleep_until = |t: Instant| std::thread::sleep(t.saturating_duration_since(Instant::now()));
    sleep_until(t0 + Duration::from_secs(1));
    first.kill9();

    sleep_until(t0 + Duration::from_secs(2));
    for addr in pod_a() {
        let got = udp_burst(&lab.peer, &lab.pod_a, addr, N);
        assert_eq!(got, 0, "{addr} while no agent runs: {got} of {N} delivered");
    }

    sleep_until(t0 + Duration::from_secs(3));
    let second = lab
        .start_agent_wrapped(wrapper, &args)
        .expect("restarting ipq-agent");
    let restarted = Instant::now();
    for addr in pod_a() {
        wait_for_entry(&lab, addr, &entry("quarantined", 0, 0), SETTLE);
        let got = udp_burst(&lab.peer, &lab.pod_a, addr, N);
        assert_eq!(got, 0, "{addr} after the restart: {got} of {N} delivered");
    }
    let after = second.scrape().expect("scrape");
    assert_eq!(
        after.changes_since(&before, "ipq_dropped_packets_total"),
        BTreeMap::from([("hook=xdp,reason=stale_traffic".to_owned(), (4 * N) as f64)]),
        "stale packets dropped at the uplink, during the gap and after the restart"
    );
    let last_stale = Instant::now();
    assert!(
        last_stale + Duration::from_secs(1) < t0 + cooldown,
        "the test's own timing: the last stale packet (t0+{:?}) plus quiet_period must end \
         before the cool-down for the deadline to be the original one",
        last_stale - t0
    );

    let mut observations = Vec::new();
    observe_until(
        &lab,
        &pod_a(),
        t0 + cooldown + Duration::from_secs(5),
        &mut observations,
    );
    assert!(
        observations
            .iter()
            .any(|o| o.at > t0 + cooldown - Duration::from_millis(1500)
                && pod_a().iter().all(|a| o.quarantined(*a))),
        "both addresses must be seen quarantined in the cool-down's last 1.5 s"
    );
    for addr in pod_a() {
        assert_released_between(
            &observations,
            addr,
            t0,
            t0 + cooldown,
            t0 + cooldown + SLACK,
        );
    }
    // The restarted agent measures each quarantine from its original start.
    let (count, sum) = histogram(&second, "ipq_quarantine_duration_seconds");
    assert_eq!(count, 2.0, "quarantines ended under the restarted agent");
    let restart_based = 2.0 * (restarted - t0 + cooldown).as_secs_f64();
    assert!(
        sum >= 2.0 * cooldown.as_secs_f64() - 0.1 && sum < restart_based - 1.0,
        "total quarantine time {sum:.2}s: each must count from pod a's deletion (~{}s), \
         not from the restart (~{:.1}s)",
        cooldown.as_secs(),
        restart_based / 2.0
    );
}
