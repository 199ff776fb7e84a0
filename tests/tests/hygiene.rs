//! Reuse hygiene on a real kernel: a reused address starts clean. Conntrack entries of the old
//! holder are flushed (a Service's UDP stream must not follow its entry to the next holder),
//! the node's neighbour entries are deleted and the new holder is announced on its bridge, and
//! what belongs to the node itself, or to holders only observed, is never touched.
//!
//! The misdelivery is first shown to be real without ipq; `conntrack -L` (conntrack-tools) is
//! the independent witness of what ipq flushed.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _};
use ipq_tests::{
    api,
    lab::{poll, Agent, Lab, POD_A_V4, POD_A_V6, POD_B_LLADDR},
    netns::NetNs,
};
use serde_json::{json, Value};

const POD_C_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 4);
const POD_C_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 4);
const VIP_V4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, 0, 0x10);
/// One port per family, so that the v4 and v6 listeners of one pod never share a port.
const PORT_V4: u16 = 5300;
const PORT_V6: u16 = 5306;

/// A short quarantine, so that "after the cool-down" comes within the test.
const SHORT_QUARANTINE: [&str; 6] = [
    "--cooldown",
    "1s",
    "--quiet-period",
    "1s",
    "--max-cooldown",
    "3s",
];

/// `ip` in `ns`, split on whitespace.
fn ip(ns: &NetNs, args: &str) -> anyhow::Result<String> {
    ns.ip(&args.split_whitespace().collect::<Vec<_>>())
}

/// Runs `program args` in `ns`; fails with its output unless it succeeds.
fn run(ns: &NetNs, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = ns
        .command(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program} (cargo xtask setup installs it)"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?} in {}: {}\n{}",
        ns.name(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A client pod wired as the lab's pods are (ptp style), but resolving its gateway itself.
fn wire_client(node: &NetNs, pod: &NetNs) -> anyhow::Result<()> {
    ip(
        node,
        &format!(
            "link add vethpc type veth peer name eth0 netns {}",
            pod.name()
        ),
    )?;
    ip(node, "addr add 10.77.0.1/32 dev vethpc")?;
    ip(node, "addr add fe80::1/64 dev vethpc nodad")?;
    ip(node, "link set vethpc up")?;
    ip(pod, &format!("addr add {POD_C_V4}/32 dev eth0"))?;
    ip(pod, &format!("addr add {POD_C_V6}/128 dev eth0 nodad"))?;
    ip(pod, "link set eth0 up")?;
    ip(pod, "route add 10.77.0.1 dev eth0 scope link")?;
    ip(pod, "route add default via 10.77.0.1 dev eth0")?;
    ip(pod, "-6 route add default via fe80::1 dev eth0")?;
    ip(node, &format!("route add {POD_C_V4}/32 dev vethpc"))?;
    ip(node, &format!("-6 route add {POD_C_V6}/128 dev vethpc"))?;
    Ok(())
}

/// The Service: VIP:port over UDP, DNATed to pod A, as kube-proxy's nftables mode does it.
fn add_service(node: &NetNs) -> anyhow::Result<()> {
    run(node, "nft", &["add", "table", "inet", "ipqsvc"])?;
    run(
        node,
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "ipqsvc",
            "pre",
            "{ type nat hook prerouting priority -100; }",
        ],
    )?;
    // kube-proxy's own `ct state` rules keep conntrack on in the node whatever the Service's
    // endpoints; without one, removing the last DNAT rule would switch conntrack off and hide
    // the stale entries from the traffic.
    run(
        node,
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "ipqsvc",
            "track",
            "{ type filter hook forward priority 0; }",
        ],
    )?;
    run(
        node,
        "nft",
        &[
            "add",
            "rule",
            "inet",
            "ipqsvc",
            "track",
            "ct",
            "state",
            "established",
            "accept",
        ],
    )?;
    let rules = [
        format!("ip daddr {VIP_V4} udp dport {PORT_V4} dnat ip to {POD_A_V4}:{PORT_V4}"),
        format!("ip6 daddr {VIP_V6} udp dport {PORT_V6} dnat ip6 to [{POD_A_V6}]:{PORT_V6}"),
    ];
    for rule in rules {
        let mut args = vec!["add", "rule", "inet", "ipqsvc", "pre"];
        args.extend(rule.split_whitespace());
        run(node, "nft", &args)?;
    }
    Ok(())
}

/// Pod A's endpoint leaves the Service: the DNAT is gone, as kube-proxy removes it.
fn remove_backend(node: &NetNs) -> anyhow::Result<()> {
    run(node, "nft", &["flush", "chain", "inet", "ipqsvc", "pre"])?;
    Ok(())
}

/// `conntrack -L` lines (both families) that carry `addr` in any tuple.
fn conntrack_entries_of(node: &NetNs, addr: IpAddr) -> anyhow::Result<Vec<String>> {
    let family = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
    let out = run(node, "conntrack", &["-L", "-f", family])?;
    let needle = format!("={addr} ");
    Ok(out
        .lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_owned)
        .collect())
}

/// A steady UDP stream from pod C to a VIP, one datagram every 5 ms from one source port.
struct Stream {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Stream {
    fn start(client: &NetNs, vip: IpAddr, port: u16) -> Stream {
        let any: IpAddr = if vip.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let socket = client
            .run(|| UdpSocket::bind((any, 0)))
            .expect("binding the client's socket");
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                // Sends fail while the VIP has no route (ICMP errors); the stream goes on.
                if socket
                    .send_to(format!("svc {n}").as_bytes(), (vip, port))
                    .is_ok()
                {
                    sent2.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Stream {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A UDP socket in a pod on `port`, counting the stream's datagrams.
struct Listener(UdpSocket);

impl Listener {
    fn bind(pod: &NetNs, v6: bool, port: u16) -> anyhow::Result<Listener> {
        let any: IpAddr = if v6 {
            Ipv6Addr::UNSPECIFIED.into()
        } else {
            Ipv4Addr::UNSPECIFIED.into()
        };
        let socket = pod
            .run(|| UdpSocket::bind((any, port)))
            .with_context(|| format!("binding UDP port {port} in {}", pod.name()))?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(Listener(socket))
    }

    /// The stream's datagrams received during `window`.
    fn count(&self, window: Duration) -> anyhow::Result<usize> {
        let end = Instant::now() + window;
        let mut got = 0;
        let mut buf = [0u8; 64];
        while Instant::now() < end {
            match self.0.recv_from(&mut buf) {
                Ok((len, _)) if buf[..len].starts_with(b"svc ") => got += 1,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => bail!("receiving: {e}"),
            }
        }
        Ok(got)
    }
}

fn socket(lab: &Lab) -> std::path::PathBuf {
    lab.work_dir().join("ipq.sock")
}

/// `GET /v1/addresses/{addr}`: the view, or `None` for a free address.
fn address(lab: &Lab, addr: IpAddr) -> anyhow::Result<Option<Value>> {
    let answer = api::request(&socket(lab), "GET", &format!("/v1/addresses/{addr}"), None)?;
    match answer.status {
        200 => Ok(Some(answer.json()?)),
        404 => Ok(None),
        other => bail!("GET {addr}: {other} {}", answer.body),
    }
}

/// Waits until `addr`'s last flush has `trigger`, and returns it.
fn wait_flush(lab: &Lab, addr: IpAddr, trigger: &str) -> anyhow::Result<Value> {
    poll(
        &format!("{addr}: a {trigger} flush"),
        Duration::from_secs(10),
        || {
            let view = address(lab, addr)?;
            let flush = view.and_then(|v| v.get("last_flush").cloned());
            Ok(flush.filter(|f| f["trigger"] == trigger))
        },
    )
}

/// `POST /v1/claims` of `addrs` for the holder behind `interface` with `mac`, as ipq-cni
/// sends it; returns the answer and how long it took.
fn claim(
    lab: &Lab,
    addrs: &[IpAddr],
    interface: &str,
    mac: &str,
) -> anyhow::Result<(Value, Duration)> {
    let body = json!({
        "addresses": addrs,
        "holder": {"interface": interface, "mac": mac, "container_id": "c-new"},
        "source": "cni",
    });
    let started = Instant::now();
    let answer = api::request(&socket(lab), "POST", "/v1/claims", Some(&body.to_string()))?;
    let took = started.elapsed();
    ensure!(
        answer.status == 200,
        "claim: {} {}",
        answer.status,
        answer.body
    );
    Ok((answer.json()?, took))
}

/// How pod B comes to hold pod A's addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reuse {
    /// A is gone and its quarantine is over.
    AfterCooldown,
    /// A still lives (Draining); B's claim fences it.
    Early,
}

/// What pod B received of the Service's streams once it held A's addresses.
struct Outcome {
    received_v4: usize,
    received_v6: usize,
    sent_meanwhile: u64,
    left_v4: Vec<String>,
    left_v6: Vec<String>,
    claim_answer: Option<Value>,
}

/// The Service scenario: C streams to the VIP (DNAT to A); A's endpoint leaves the Service; B
/// takes A's addresses (as `reuse` says); then B listens for 1 s. With `agent`, B's addresses
/// are claimed through the API (as ipq-cni would) before B's routes go in.
fn service_scenario(lab: &Lab, agent: Option<&Agent>, reuse: Reuse) -> anyhow::Result<Outcome> {
    let client = NetNs::new("pc")?;
    wire_client(&lab.node, &client)?;
    add_service(&lab.node)?;
    let a_v4 = Listener::bind(&lab.pod_a, false, PORT_V4)?;
    let a_v6 = Listener::bind(&lab.pod_a, true, PORT_V6)?;
    let _s4 = Stream::start(&client, VIP_V4.into(), PORT_V4);
    let _s6 = Stream::start(&client, VIP_V6.into(), PORT_V6);
    ensure!(
        a_v4.count(Duration::from_millis(300))? > 0,
        "pod A gets the v4 stream"
    );
    ensure!(
        a_v6.count(Duration::from_millis(300))? > 0,
        "pod A gets the v6 stream"
    );
    ensure!(
        !conntrack_entries_of(&lab.node, POD_A_V4.into())?.is_empty(),
        "the v4 stream has its DNAT entry"
    );

    remove_backend(&lab.node)?;
    let addrs: [IpAddr; 2] = [POD_A_V4.into(), POD_A_V6.into()];
    match reuse {
        Reuse::AfterCooldown => {
            ip(&lab.node, "link del vethpa")?;
            match agent {
                Some(_) => {
                    for addr in addrs {
                        let flush = wait_flush(lab, addr, "holder_gone")?;
                        ensure!(
                            flush["errors"].is_null(),
                            "{addr}: holder-gone flush failed: {flush}"
                        );
                    }
                    for addr in addrs {
                        poll(
                            &format!("{addr} free after its quarantine"),
                            Duration::from_secs(15),
                            || Ok(address(lab, addr)?.is_none().then_some(())),
                        )?;
                    }
                }
                None => std::thread::sleep(Duration::from_secs(2)),
            }
        }
        Reuse::Early => {}
    }

    let b_v4 = Listener::bind(&lab.pod_b, false, PORT_V4)?;
    let b_v6 = Listener::bind(&lab.pod_b, true, PORT_V6)?;
    for addr in addrs {
        lab.add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, addr)?;
    }
    let claim_answer = match agent {
        Some(_) => Some(claim(lab, &addrs, "vethpb", POD_B_LLADDR)?.0),
        None => None,
    };
    // Calico's order: the route for the new holder goes in once its claim is answered.
    ip(
        &lab.node,
        &format!("route replace {POD_A_V4}/32 dev vethpb"),
    )?;
    ip(
        &lab.node,
        &format!("-6 route replace {POD_A_V6}/128 dev vethpb"),
    )?;
    let sent_before = _s4.sent() + _s6.sent();
    let received_v4 = b_v4.count(Duration::from_millis(1000))?;
    let received_v6 = b_v6.count(Duration::from_millis(200))?;
    let sent_meanwhile = _s4.sent() + _s6.sent() - sent_before;
    Ok(Outcome {
        received_v4,
        received_v6,
        sent_meanwhile,
        left_v4: conntrack_entries_of(&lab.node, POD_A_V4.into())?,
        left_v6: conntrack_entries_of(&lab.node, POD_A_V6.into())?,
        claim_answer,
    })
}

#[test]
fn without_ipq_a_services_stream_follows_its_conntrack_entry_to_the_next_holder(
) -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let out = service_scenario(&lab, None, Reuse::AfterCooldown)?;
    assert!(out.sent_meanwhile > 100, "the stream kept going");
    assert!(
        out.received_v4 > 0 && out.received_v6 > 0,
        "without a flush, pod B receives the Service's stream meant for A (v4 {}, v6 {}); \
         conntrack: {:?} {:?}",
        out.received_v4,
        out.received_v6,
        out.left_v4,
        out.left_v6,
    );
    assert!(
        !out.left_v4.is_empty() && !out.left_v6.is_empty(),
        "conntrack still has the DNAT entries to A's addresses"
    );
    Ok(())
}

fn assert_clean(out: &Outcome, agent: &Agent) {
    assert!(out.sent_meanwhile > 100, "the stream kept going");
    assert_eq!(
        (out.received_v4, out.received_v6),
        (0, 0),
        "pod B must receive none of the Service's stream; log:\n{}",
        agent.log()
    );
    assert!(
        out.left_v4.is_empty() && out.left_v6.is_empty(),
        "conntrack -L still lists A's addresses after the claim: {:?} {:?}",
        out.left_v4,
        out.left_v6
    );
    let answer = out.claim_answer.as_ref().expect("claimed through the API");
    for view in answer["addresses"].as_array().expect("addresses") {
        let flush = &view["last_flush"];
        assert_eq!(
            flush["trigger"], "new_holder",
            "the claim is answered with its finished flush: {view}"
        );
        assert!(flush["errors"].is_null(), "{flush}");
        assert!(flush["at"].is_string(), "{flush}");
    }
}

#[test]
fn after_the_cooldown_the_next_holder_gets_none_of_a_services_stream() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let agent = lab.start_agent(&SHORT_QUARANTINE)?;
    let out = service_scenario(&lab, Some(&agent), Reuse::AfterCooldown)?;
    assert_clean(&out, &agent);
    let flushed = agent.metric("ipq_conntrack_entries_flushed_total", &[])?;
    assert!(
        flushed >= 2.0,
        "both DNAT entries flushed, counted {flushed}"
    );
    assert_eq!(
        agent.metric("ipq_hygiene_failures_total", &[("step", "conntrack")])?,
        0.0
    );
    Ok(())
}

#[test]
fn an_early_reuse_is_answered_after_the_flush_and_the_next_holder_gets_none() -> anyhow::Result<()>
{
    let lab = Lab::new()?;
    let agent = lab.start_agent(&[])?;
    let out = service_scenario(&lab, Some(&agent), Reuse::Early)?;
    assert_clean(&out, &agent);
    let answer = out.claim_answer.as_ref().expect("claimed");
    let flushed: u64 = answer["addresses"]
        .as_array()
        .expect("addresses")
        .iter()
        .map(|v| v["last_flush"]["conntrack_entries"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        flushed >= 2,
        "the claim's own flush took the live DNAT entries (v4 and v6): {answer}"
    );
    // The old pod's PERMANENT neighbour entry (the ptp plugin's) points elsewhere: reported,
    // never deleted.
    let v4 = &answer["addresses"][0]["last_flush"];
    assert!(
        v4["permanent_neighbours"]
            .as_array()
            .is_some_and(|p| p.iter().any(|e| e
                .as_str()
                .is_some_and(|e| e.ends_with("lladdr 02:77:00:00:0a:02")))),
        "{v4}"
    );
    let kept = ip(&lab.node, &format!("neigh show {POD_A_V4} dev vethpa"))?;
    assert!(kept.contains("PERMANENT"), "{kept}");
    // The flush is in the event feed and in `ipq get`.
    let events = api::request(&socket(&lab), "GET", "/v1/events", None)?;
    let flushed_event = events.body.lines().any(|l| {
        serde_json::from_str::<Value>(l).is_ok_and(|e| {
            e["type"] == "hygiene"
                && e["address"] == POD_A_V4.to_string()
                && e["trigger"] == "new_holder"
                && e["conntrack_entries"].as_u64() >= Some(1)
        })
    });
    assert!(
        flushed_event,
        "no hygiene event in /v1/events:\n{}",
        events.body
    );
    let get = api::ipq(&socket(&lab), &["get", &POD_A_V4.to_string()])?;
    let text = get.ok();
    assert!(
        text.contains("Last flush:") && text.contains("(new_holder)"),
        "{text}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Neighbour caches on a bridge.

const BR_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
const BR_V6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 1);
const SHARED_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 5);
const SHARED_V6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 5);
const THIRD_V4: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 7);
const THIRD_V6: Ipv6Addr = Ipv6Addr::new(0xfd88, 0, 0, 0, 0, 0, 0, 7);
const BR_A_MAC: &str = "02:88:00:00:0a:02";
const BR_B_MAC: &str = "02:88:00:00:0b:02";
const BR_T_MAC: &str = "02:88:00:00:0c:02";

/// Puts `pod` on bridge `cni0` through port `port`, its `eth1` at `mac`, not announcing
/// itself (as the ptp and bridge plugins leave a pod: no gratuitous ARP, no unsolicited NA).
fn bridge_pod(
    node: &NetNs,
    pod: &NetNs,
    port: &str,
    mac: &str,
    addrs: Option<(Ipv4Addr, Ipv6Addr)>,
) -> anyhow::Result<()> {
    ip(
        node,
        &format!(
            "link add {port} type veth peer name eth1 address {mac} netns {}",
            pod.name()
        ),
    )?;
    ip(node, &format!("link set {port} master cni0 up"))?;
    for key in [
        "net.ipv4.conf.all.arp_notify",
        "net.ipv4.conf.default.arp_notify",
        "net.ipv6.conf.all.ndisc_notify",
        "net.ipv6.conf.default.ndisc_notify",
    ] {
        pod.sysctl(key, "0")?;
    }
    if let Some((v4, v6)) = addrs {
        ip(pod, &format!("addr add {v4}/24 dev eth1"))?;
        ip(pod, &format!("addr add {v6}/64 dev eth1 nodad"))?;
    }
    ip(pod, "link set eth1 up")?;
    Ok(())
}

/// `ping -c 1 -W 1` from `ns`; whether a reply came.
fn pings(ns: &NetNs, dst: IpAddr) -> bool {
    ns.command("ping")
        .args(["-n", "-q", "-c", "1", "-W", "1", &dst.to_string()])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The MAC `ns` resolves `addr` to, if any.
fn neighbour_mac(ns: &NetNs, addr: IpAddr) -> anyhow::Result<Option<String>> {
    let out = ip(ns, &format!("neigh show {addr}"))?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_owned))
}

#[test]
fn neighbour_caches_follow_the_new_holder_within_a_second() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    let third = NetNs::new("pt")?;
    ip(node, "link add cni0 type bridge")?;
    ip(node, &format!("addr add {BR_V4}/24 dev cni0"))?;
    ip(node, &format!("addr add {BR_V6}/64 dev cni0 nodad"))?;
    ip(node, "link set cni0 up")?;
    bridge_pod(
        node,
        &lab.pod_a,
        "vethba",
        BR_A_MAC,
        Some((SHARED_V4, SHARED_V6)),
    )?;
    bridge_pod(node, &lab.pod_b, "vethbb", BR_B_MAC, None)?;
    bridge_pod(node, &third, "vethbt", BR_T_MAC, Some((THIRD_V4, THIRD_V6)))?;
    let agent = lab.start_agent(&["--workload", "vethb*"])?;

    let shared: [IpAddr; 2] = [SHARED_V4.into(), SHARED_V6.into()];
    // The node and the third pod learn pod A's MAC for the shared addresses.
    for addr in shared {
        assert!(pings(node, addr), "node -> A {addr}");
        assert!(pings(&third, addr), "third pod -> A {addr}");
        assert_eq!(neighbour_mac(&third, addr)?.as_deref(), Some(BR_A_MAC));
    }
    // Past the neighbour lock time (1 s), within which Linux ignores overriding updates.
    std::thread::sleep(Duration::from_millis(1200));

    // Pod A is gone; pod B takes its addresses (during A's quarantine), announcing nothing.
    ip(node, "link del vethba")?;
    for addr in shared {
        poll(
            &format!("{addr} quarantined"),
            Duration::from_secs(10),
            || {
                Ok(address(&lab, addr)?
                    .filter(|v| v["state"] == "quarantined")
                    .map(|_| ()))
            },
        )?;
    }
    ip(&lab.pod_b, &format!("addr add {SHARED_V4}/24 dev eth1"))?;
    ip(
        &lab.pod_b,
        &format!("addr add {SHARED_V6}/64 dev eth1 nodad"),
    )?;
    let (answer, _) = claim(&lab, &shared, "vethbb", BR_B_MAC)?;
    let claimed = Instant::now();

    for addr in shared {
        // The third pod's cache now says B, before it sent B anything.
        let mac = poll(
            &format!("the third pod's entry for {addr} shows B's MAC"),
            Duration::from_secs(1),
            || Ok(neighbour_mac(&third, addr)?.filter(|m| m == BR_B_MAC)),
        )
        .with_context(|| format!("agent log:\n{}", agent.log()))?;
        assert_eq!(mac, BR_B_MAC);
        assert!(pings(&third, addr), "third pod -> B {addr}");
        assert!(pings(node, addr), "node -> B {addr}");
    }
    let took = claimed.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "node and third pod must reach B within a second of the claim (v4 and v6), took \
         {took:?}"
    );
    for view in answer["addresses"].as_array().expect("addresses") {
        let flush = &view["last_flush"];
        assert!(flush["errors"].is_null(), "{flush}");
        assert!(
            flush["announcements"].as_u64() >= Some(1),
            "announced on the bridge's other ports: {flush}"
        );
    }
    assert!(agent.metric("ipq_announcements_total", &[])? >= 2.0);
    assert!(
        agent.metric("ipq_neighbours_flushed_total", &[])? >= 1.0,
        "the node's entries pointing at A were deleted"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Safety.

#[test]
fn the_nodes_own_addresses_and_connections_are_never_flushed() -> anyhow::Result<()> {
    let lab = Lab::new()?;
    let node = &lab.node;
    add_service(node)?;
    // A connection of the node's own: node -> peer over the uplink, in conntrack.
    let peer_rx = lab.peer.run(|| UdpSocket::bind(("10.78.0.2", 5400)))?;
    let node_tx = node.run(|| UdpSocket::bind(("10.78.0.1", 5401)))?;
    node_tx.send_to(b"node", ("10.78.0.2", 5400))?;
    peer_rx.set_read_timeout(Some(Duration::from_secs(1)))?;
    peer_rx.recv_from(&mut [0u8; 16])?;
    let node_addr: IpAddr = "10.78.0.1".parse()?;
    ensure!(
        !conntrack_entries_of(node, node_addr)?.is_empty(),
        "the node's own flow is tracked"
    );
    let agent = lab.start_agent(&[])?;

    // A pod address is flushed: the node's flow stays.
    ip(node, "link del vethpa")?;
    wait_flush(&lab, POD_A_V4.into(), "holder_gone")?;
    assert!(
        !conntrack_entries_of(node, node_addr)?.is_empty(),
        "flushing a pod's address took the node's own flow"
    );

    // An address the node owns, claimed by a workload (a misconfigured IPAM): refused before
    // the registry (a node address is never a holder), so nothing of it is flushed.
    let refused = claim(&lab, &[node_addr], "vethpb", POD_B_LLADDR)
        .expect_err("a claim of the node's own address is refused");
    let refused = format!("{refused:#}");
    assert!(
        refused.contains("invalid_argument") && refused.contains("on this node itself"),
        "{refused}"
    );
    assert!(
        !conntrack_entries_of(node, node_addr)?.is_empty(),
        "the node's own flow survived a claim of its address; log:\n{}",
        agent.log()
    );
    Ok(())
}

#[test]
fn fencing_under_observe_flushes_nothing() -> anyhow::Result<()> {
    for flags in [
        &["--mode", "observe"][..],
        &["--on-early-reuse", "observe"][..],
    ] {
        let lab = Lab::new()?;
        let client = NetNs::new("pc")?;
        wire_client(&lab.node, &client)?;
        add_service(&lab.node)?;
        let a_v4 = Listener::bind(&lab.pod_a, false, PORT_V4)?;
        let agent = lab.start_agent(flags)?;
        let _stream = Stream::start(&client, VIP_V4.into(), PORT_V4);
        ensure!(
            a_v4.count(Duration::from_millis(300))? > 0,
            "A gets the stream"
        );
        lab.add_pod_address(&lab.pod_b, "vethpb", POD_B_LLADDR, POD_A_V4.into())?;
        let (answer, _) = claim(&lab, &[POD_A_V4.into()], "vethpb", POD_B_LLADDR)?;
        assert!(
            answer["addresses"][0]["last_flush"].is_null(),
            "{flags:?}: nothing flushed, so nothing to report: {answer}"
        );
        assert!(
            !conntrack_entries_of(&lab.node, POD_A_V4.into())?.is_empty(),
            "{flags:?}: the observed old holder's flow keeps its conntrack entry"
        );
        assert!(
            a_v4.count(Duration::from_millis(300))? > 0,
            "{flags:?}: A still gets the stream"
        );
        assert_eq!(
            agent.metric("ipq_conntrack_entries_flushed_total", &[])?,
            0.0,
            "{flags:?}"
        );
        assert_eq!(agent.metric("ipq_neighbours_flushed_total", &[])?, 0.0);
    }
    Ok(())
}
