//! Nothing ahead of ipq in silence (netlink mode): another tool's filter added at a priority
//! before ipq's on a protected clsact hook (`tc filter add ... ingress pref 1 u32 match u32 0
//! 0 classid 1:1`, as a CNI's own filter does) ends classification, so the fenced pod's
//! packets never reach ipq's program. The kernel announces the filter; within milliseconds
//! the interface is `bypassed` by it: not protected in `ipq status`, `/readyz` failing, the
//! bypassed gauge and counter set. ipq never touches the filter; once it is deleted, the
//! interface is protected again and the pod fenced.
//!
//! A co-tenant's cls_bpf direct-action filter ahead of ipq's is judged by probes the agent
//! puts through the hook, one of each of the interface's addresses, with the DaemonSet's
//! capabilities (no `CAP_SYS_ADMIN`): one that hands packets on (`TC_ACT_UNSPEC`) lets them
//! reach ipq's program, the interface stays protected and the agent ready, and the fenced pod's
//! packets are still dropped; one that ends classification (`TC_ACT_OK`) keeps them from it and
//! makes the interface `bypassed`, as above. The probes never reach the pod and are never
//! counted as fenced traffic.
//!
//! Needs root, bpffs, `tc` (iproute2), `setpriv` (util-linux) and `target/debug/ipq-agent`;
//! `cargo xtask test` provides them.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use aya::maps::{Array, MapData};
use ipq_common::{counters::Hook, names};
use ipq_tests::{
    api,
    lab::{poll, udp_burst, Agent, Lab, DAEMONSET_CAPS, PEER_V4, POD_A_V4, POD_A_V6},
    netns::{output_of, BpffsDir, NetNs},
    raw_bpf::{obj_pin, program_returning},
};

fn tc(ns: &NetNs, args: &str) {
    output_of(ns.command("tc").args(args.split_whitespace()))
        .unwrap_or_else(|e| panic!("tc {args}: {e:#}"));
}

fn vethpa(agent: &Agent) -> serde_json::Value {
    let status = api::request(&agent.api_socket(), "GET", "/v1/status", None)
        .expect("GET /v1/status")
        .json()
        .expect("status JSON");
    status["interfaces"]
        .as_array()
        .and_then(|all| all.iter().find(|i| i["name"] == "vethpa").cloned())
        .unwrap_or_else(|| panic!("vethpa not in {status}"))
}

fn metric(agent: &Agent, name: &str) -> f64 {
    agent.metric(name, &[("hook", "tc_ingress")]).unwrap_or(0.0)
}

#[test]
fn a_filter_ahead_of_ipqs_makes_the_interface_bypassed_at_once_and_protected_once_it_goes() {
    let lab = Lab::new().expect("building the lab");
    let args = [
        "--workload",
        "vethp*",
        "--uplink",
        "up0",
        "--tc-attach",
        "netlink",
    ];
    let agent = lab.start_agent(&args).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    assert_eq!(vethpa(&agent)["protection"], "protected");

    let added = Instant::now();
    tc(
        &lab.node,
        "filter add dev vethpa ingress pref 1 u32 match u32 0 0 classid 1:1",
    );
    poll("vethpa bypassed", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "bypassed").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let took = added.elapsed();
    eprintln!("bypassed reported {took:?} after the filter was added");
    assert!(
        took < Duration::from_millis(500),
        "reported {took:?} after the filter"
    );
    let interface = vethpa(&agent);
    let error = interface["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("tc-ingress: u32 filter pref 1"),
        "the filter is named: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("bypassed"), "{body}");
    assert_eq!(metric(&agent, "ipq_datapath_bypassed_interfaces"), 1.0);
    assert_eq!(metric(&agent, "ipq_datapath_bypasses_total"), 1.0);
    assert!(metric(&agent, "ipq_datapath_unprotected_interfaces") >= 1.0);
    // What ipq says is what the kernel does: the pod's packets get past ipq now.
    assert!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10) > 0,
        "the filter ahead ends classification before ipq's program"
    );
    let still = output_of(
        lab.node
            .command("tc")
            .args(["filter", "show", "dev", "vethpa", "ingress", "pref", "1"]),
    )
    .expect("tc filter show");
    assert!(
        still.contains("u32"),
        "ipq never touches the filter: {still}"
    );
    assert!(
        agent.log().contains("NOT PROTECTED: bypassed"),
        "{}",
        agent.log()
    );

    tc(&lab.node, "filter del dev vethpa ingress pref 1");
    poll("vethpa protected again", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 10),
        0,
        "fenced again"
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    assert_eq!(metric(&agent, "ipq_datapath_bypassed_interfaces"), 0.0);
}

/// `TC_ACT_UNSPEC`: a direct-action filter returning it hands the packet to the next filter.
const TC_ACT_UNSPEC: i32 = -1;
/// `TC_ACT_OK`: ends classification, the packet goes on unseen by later filters.
const TC_ACT_OK: i32 = 0;

/// A program returning `code`, pinned in `dir` as `name` (for `tc ... object-pinned`).
fn pinned_program(dir: &BpffsDir, code: i32, name: &str) -> std::path::PathBuf {
    let prog = program_returning(code, name);
    let path = dir.path().join(name);
    obj_pin(prog, &path);
    // SAFETY: the descriptor program_returning returned; the pin keeps the program.
    unsafe { libc::close(prog) };
    path
}

fn cotenants(agent: &Agent, verdict: &str) -> f64 {
    agent
        .metric(
            "ipq_datapath_cotenants_ahead",
            &[("hook", "tc_ingress"), ("verdict", verdict)],
        )
        .unwrap_or(-1.0)
}

const NETLINK_AGENT: [&str; 6] = [
    "--workload",
    "vethp*",
    "--uplink",
    "up0",
    "--tc-attach",
    "netlink",
];

/// Waits until `hook`'s line on vethpa's `ahead` says something, and returns the interface.
fn judged(agent: &Agent, hook: &str) -> serde_json::Value {
    poll("the filter ahead judged", Duration::from_secs(5), || {
        let interface = vethpa(agent);
        Ok(interface["ahead"]
            .as_array()
            .is_some_and(|a| {
                a.iter()
                    .any(|l| l.as_str().is_some_and(|l| l.contains(hook)))
            })
            .then_some(interface))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()))
}

/// Fenced packets ipq's programs dropped on vethpa's hooks, by hook, as the metrics count them.
fn fenced_drops(agent: &Agent) -> [f64; 2] {
    ["tc_ingress", "tc_egress"].map(|hook| {
        agent
            .metric(
                "ipq_dropped_packets_total",
                &[("hook", hook), ("reason", "fenced")],
            )
            .unwrap_or(0.0)
    })
}

/// A co-tenant's cls_bpf filter ahead of ipq's on vethpa's ingress that hands every packet on
/// (`TC_ACT_UNSPEC`), judged so: the bpffs directory holding its program, the program's pin,
/// and vethpa's status.
fn hands_on_filter_ahead(
    lab: &Lab,
    agent: &Agent,
) -> (BpffsDir, std::path::PathBuf, serde_json::Value) {
    let pins = BpffsDir::new().expect("a bpffs dir of the test's own");
    let hands_on = pinned_program(&pins, TC_ACT_UNSPEC, "cotenant_next");
    tc(
        &lab.node,
        &format!(
            "filter add dev vethpa ingress pref 1 handle 1 bpf da object-pinned {}",
            hands_on.display()
        ),
    );
    let interface = judged(agent, "tc-ingress");
    assert_eq!(interface["protection"], "protected", "{interface}");
    (pins, hands_on, interface)
}

#[test]
fn a_bpf_filter_ahead_that_hands_packets_on_keeps_the_interface_protected_and_one_that_passes_them_does_not(
) {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent_wrapped(&DAEMONSET_CAPS, &NETLINK_AGENT)
        .expect("starting ipq-agent with the DaemonSet's capabilities");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    // Hands on: TC_ACT_UNSPEC for every packet.
    let (pins, hands_on, interface) = hands_on_filter_ahead(&lab, &agent);
    let ahead = interface["ahead"][0].as_str().unwrap_or_default();
    assert!(
        ahead.contains("bpf filter pref 1")
            && ahead.contains("cotenant_next")
            && ahead.contains("hands packets on")
            && ahead.contains("reached ipq's program"),
        "the status names the filter and what the probe found: {interface}"
    );
    assert!(
        ahead.contains(&POD_A_V4.to_string()),
        "a probe from the fenced pod's address went through it: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(
        code, 200,
        "a co-tenant that hands packets on keeps the node ready: {body}"
    );
    // The witness: the fenced pod's datagrams still meet ipq's program, which drops them.
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 200),
        0,
        "every fenced datagram is handed on to ipq's filter and dropped"
    );
    assert_eq!(cotenants(&agent, "hands_on"), 1.0);
    assert_eq!(metric(&agent, "ipq_datapath_bypasses_total"), 0.0);
    assert_eq!(metric(&agent, "ipq_datapath_bypassed_interfaces"), 0.0);
    let run = api::ipq(&agent.api_socket(), &["status"]).expect("ipq status");
    let status = run.ok();
    assert!(
        status.contains("co-tenant ahead hands on") && status.contains("ahead of ipq on vethpa"),
        "ipq status says why vethpa is protected:\n{status}"
    );

    // Ends classification: TC_ACT_OK for every packet (the filter's program replaced in place).
    let passes = pinned_program(&pins, TC_ACT_OK, "cotenant_ok");
    tc(
        &lab.node,
        &format!(
            "filter replace dev vethpa ingress pref 1 handle 1 bpf da object-pinned {}",
            passes.display()
        ),
    );
    poll("vethpa bypassed", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "bypassed").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let interface = vethpa(&agent);
    let error = interface["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cotenant_ok") && error.contains("never reached ipq's program"),
        "the filter and what the probe found are named: {interface}"
    );
    let (code, body) = agent.readyz().expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert_eq!(metric(&agent, "ipq_datapath_bypasses_total"), 1.0);
    assert_eq!(cotenants(&agent, "ends_processing"), 1.0);
    assert_eq!(cotenants(&agent, "hands_on"), 0.0);
    let delivered = udp_burst(&lab.pod_a, &lab.peer, peer, 200);
    eprintln!("{delivered} of 200 fenced datagrams delivered past the TC_ACT_OK filter");
    assert!(delivered > 0, "what ipq reports is what the kernel does");

    // Back to handing packets on, in place: protected and ready again, fenced again.
    tc(
        &lab.node,
        &format!(
            "filter replace dev vethpa ingress pref 1 handle 1 bpf da object-pinned {}",
            hands_on.display()
        ),
    );
    poll("vethpa protected again", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "protected").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let interface = vethpa(&agent);
    assert!(
        interface["ahead"][0]
            .as_str()
            .is_some_and(|a| a.contains("cotenant_next") && a.contains("hands packets on")),
        "{interface}"
    );
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    assert_eq!(cotenants(&agent, "ends_processing"), 0.0);
    assert_eq!(cotenants(&agent, "hands_on"), 1.0);
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 200),
        0,
        "fenced again behind the filter that hands packets on"
    );

    tc(&lab.node, "filter del dev vethpa ingress pref 1");
    poll("nothing ahead any more", Duration::from_secs(5), || {
        Ok(vethpa(&agent)["ahead"]
            .as_array()
            .is_none_or(|a| a.is_empty())
            .then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(vethpa(&agent)["protection"], "protected");
    assert_eq!(cotenants(&agent, "hands_on"), 0.0);
}

/// Frames that arrived at pod a's `eth0` carrying ipq's probe port, read from a packet socket
/// opened there before the probes: what its stack would have been handed, whatever it did
/// with them.
struct PodTap(std::os::fd::OwnedFd);

impl PodTap {
    fn open(lab: &Lab) -> Self {
        use std::os::fd::FromRawFd as _;
        let eth0 = ipq_tests::lab::ifindex(&lab.pod_a, "eth0").expect("pod a's eth0");
        let fd = lab.pod_a.run(|| {
            // SAFETY: plain system calls; the fd is owned below.
            let protocol = (libc::ETH_P_ALL as u16).to_be();
            let fd = unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    i32::from(protocol),
                )
            };
            assert!(
                fd >= 0,
                "a packet socket in pod a: {}",
                std::io::Error::last_os_error()
            );
            let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            at.sll_family = libc::AF_PACKET as u16;
            at.sll_protocol = protocol;
            at.sll_ifindex = eth0 as i32;
            let bound = unsafe {
                libc::bind(
                    fd,
                    std::ptr::from_ref(&at).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(bound, 0, "binding: {}", std::io::Error::last_os_error());
            fd
        });
        // SAFETY: the socket just made, owned by nobody else.
        Self(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// The probe frames received so far (UDP to port 0x4951 over IPv4 or IPv6).
    fn probes(&self) -> usize {
        use std::os::fd::AsRawFd as _;
        let mut probes = 0;
        let mut frame = [0u8; 2048];
        loop {
            // SAFETY: reads into the buffer above, at most its length.
            let n = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    frame.as_mut_ptr().cast(),
                    frame.len(),
                    0,
                )
            };
            if n < 0 {
                return probes;
            }
            let frame = &frame[..n as usize];
            let port_at = match frame.get(12..14) {
                Some([0x08, 0x00]) => 14 + 20 + 2,
                Some([0x86, 0xdd]) => 14 + 40 + 2,
                _ => continue,
            };
            if frame.get(port_at..port_at + 2) == Some(&[0x49, 0x51][..]) {
                probes += 1;
            }
        }
    }
}

#[test]
fn probes_never_reach_the_pod_nor_count_as_fenced_and_fenced_traffic_is_still_dropped() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab
        .start_agent_wrapped(&DAEMONSET_CAPS, &NETLINK_AGENT)
        .expect("starting ipq-agent with the DaemonSet's capabilities");
    lab.maps().fence_pod_a().expect("fencing pod a");
    let peer = IpAddr::from(PEER_V4);
    assert_eq!(udp_burst(&lab.pod_a, &lab.peer, peer, 10), 0, "fenced");
    let tap = PodTap::open(&lab);
    let drops_before = fenced_drops(&agent);

    // A filter that hands packets on, ahead of ipq's on both hooks: each is probed, once per
    // address of the interface.
    let pins = BpffsDir::new().expect("a bpffs dir of the test's own");
    let hands_on = pinned_program(&pins, TC_ACT_UNSPEC, "cotenant_next");
    for hook in ["ingress", "egress"] {
        tc(
            &lab.node,
            &format!(
                "filter add dev vethpa {hook} pref 1 handle 1 bpf da object-pinned {}",
                hands_on.display()
            ),
        );
    }
    judged(&agent, "tc-ingress");
    let interface = judged(&agent, "tc-egress");
    assert_eq!(interface["protection"], "protected", "{interface}");
    assert_eq!(agent.readyz().expect("readyz").0, 200);
    let ahead = interface["ahead"].to_string();
    assert!(
        ahead.contains(&POD_A_V4.to_string()) && ahead.contains(&POD_A_V6.to_string()),
        "a probe of each of pod a's addresses on each hook: {interface}"
    );
    assert_eq!(
        fenced_drops(&agent),
        drops_before,
        "probes are dropped by ipq's program without counting as fenced traffic"
    );
    assert_eq!(tap.probes(), 0, "no probe reached pod a's interface");

    // Fenced traffic both ways is still dropped and counted, behind the co-tenant.
    assert_eq!(
        udp_burst(&lab.pod_a, &lab.peer, peer, 50),
        0,
        "from the pod"
    );
    assert_eq!(
        udp_burst(&lab.peer, &lab.pod_a, IpAddr::from(POD_A_V4), 50),
        0,
        "to the pod"
    );
    let drops_after = fenced_drops(&agent);
    assert!(
        drops_after[0] >= drops_before[0] + 50.0 && drops_after[1] >= drops_before[1] + 50.0,
        "{drops_before:?} -> {drops_after:?}"
    );

    // A filter that ends processing on egress: the probe to the pod gets past ipq, and still
    // never reaches the pod's stack (a MAC not the pod's), but its interface sees it.
    let passes = pinned_program(&pins, TC_ACT_OK, "cotenant_ok");
    tc(
        &lab.node,
        &format!(
            "filter replace dev vethpa egress pref 1 handle 1 bpf da object-pinned {}",
            passes.display()
        ),
    );
    poll("vethpa bypassed", Duration::from_secs(5), || {
        Ok((vethpa(&agent)["protection"] == "bypassed").then_some(()))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(agent.readyz().expect("readyz").0, 503);
    assert!(
        tap.probes() > 0,
        "the tap sees what a co-tenant that ends processing lets through: it can fail"
    );
}

/// ipq's count of the probes its TC ingress program saw (`IPQ_PROBES`, by hook).
fn probes_counted(probes: &Array<MapData, u64>) -> u64 {
    probes
        .get(&(Hook::TcIngress as u32), 0)
        .expect("reading IPQ_PROBES")
}

/// `IPQ_PROBES` written by another process: a count raised at the right moment would make a
/// co-tenant that ends processing look like one that hands packets on. The watcher reports the
/// write (the trampolines name the map; the raw tracepoint, which cannot, reports any write by a
/// process that opened one of ipq's pins), and every co-tenant ahead is probed again at once:
/// a new probe reaches ipq's program, counted above the forged count.
#[test]
fn a_write_of_the_probe_count_by_another_process_gets_the_cotenant_probed_again() {
    let lab = Lab::new().expect("building the lab");
    // As root: the kernel tier's guests have no setpriv (the probes' capabilities are the
    // other tests' concern).
    let agent = lab.start_agent(&NETLINK_AGENT).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    let (_pins, _, _) = hands_on_filter_ahead(&lab, &agent);

    // Opened, and the pass its open asked for over: what follows is the write alone.
    let before_open = agent.verified_at();
    let path = lab.bpffs.path().join("maps").join(names::MAP_PROBES);
    let mut probes: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(
        MapData::from_pin(&path).expect("opening IPQ_PROBES"),
    ))
    .expect("IPQ_PROBES as an array");
    poll(
        "the pass the open asked for",
        Duration::from_secs(5),
        || {
            let now = agent.verified_at();
            Ok((!now.is_null() && now != before_open).then_some(()))
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    let counted = probes_counted(&probes);
    assert!(counted > 0, "the co-tenant was probed: {counted}");

    let forged = counted + 1_000_000;
    probes
        .set(Hook::TcIngress as u32, forged, 0)
        .expect("writing IPQ_PROBES");
    poll(
        "a new probe counted above the forged count",
        Duration::from_secs(5),
        || Ok((probes_counted(&probes) > forged).then_some(())),
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", agent.log()));
    assert_eq!(vethpa(&agent)["protection"], "protected");
}
