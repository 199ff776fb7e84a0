//! Incident (h), churn: 200 pod lifecycles in quick succession, with addresses reused from
//! small pools while their earlier holders still drain (early reuse) or cool down (reuse in
//! cool-down). At the end, once every cool-down is over, the agent's registry (its metrics),
//! the pinned datapath map (`datapath show`), the link pins, and the kernel's real links and
//! routes all agree: no entry leaked, nothing quarantined beyond `max_cooldown`, no address
//! held or fenced by a deleted link.
//!
//! Each lifecycle, as the ptp CNI plugin and a terminating pod would do it:
//! 1. create: a veth `vethpc<i>` in the node with its other end in a pod namespace, the pod's
//!    addresses on that end, the node's host routes (/32, /128) through `vethpc<i>`;
//! 2. two lifecycles later, drain: its host routes withdrawn (every fifth pod skips this, as a
//!    pod killed outright does);
//! 3. four lifecycles later, gone: `vethpc<i>` deleted.
//!
//! IPv4 comes from a pool of 3 (each address is taken while its previous pod still lives),
//! IPv6 from a pool of 8 (each address is taken shortly after its previous pod went).
//!
//! Needs root, bpffs and `target/debug/ipq-agent`; `cargo xtask test` provides all three.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use ipq_tests::{
    attach::wait_tc_upgrades,
    lab::{poll, Agent, Lab, MapEntry, POD_A_V4, POD_A_V6, POD_B_V4, POD_B_V6},
    netns::NetNs,
};

const LIFECYCLES: usize = 200;
/// A pod drains this many lifecycles after it was created...
const DRAIN_AFTER: usize = 2;
/// ...and is deleted this many lifecycles after it was created.
const DELETE_AFTER: usize = 4;
const V4_POOL: usize = 3;
const V6_POOL: usize = 8;
const MAX_COOLDOWN: Duration = Duration::from_secs(1);
/// How late the agent may be, on a loaded machine, in ending a quarantine.
const SLACK: Duration = Duration::from_secs(2);
/// The whole run must stay well under a minute.
const TIME_BUDGET: Duration = Duration::from_secs(45);

fn v4(i: usize) -> IpAddr {
    Ipv4Addr::new(10, 77, 1, (i % V4_POOL) as u8 + 1).into()
}

fn v6(i: usize) -> IpAddr {
    Ipv6Addr::new(0xfd77, 1, 0, 0, 0, 0, 0, (i % V6_POOL) as u16 + 1).into()
}

fn host_if(i: usize) -> String {
    format!("vethpc{i}")
}

/// Pods killed outright: their routes are never withdrawn before their link goes.
fn killed(i: usize) -> bool {
    i % 5 == 4
}

/// Runs `commands` through one `ip -n <ns> -batch -`: one process per step, not per command.
fn batch(ns: &NetNs, commands: &[String]) {
    let mut child = Command::new("ip")
        .args(["-n", ns.name(), "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running ip -batch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(commands.join("\n").as_bytes())
        .expect("writing to ip -batch");
    let out = child.wait_with_output().expect("ip -batch");
    assert!(
        out.status.success(),
        "ip -n {} -batch failed: {}\ncommands:\n{}",
        ns.name(),
        String::from_utf8_lossy(&out.stderr),
        commands.join("\n")
    );
}

/// What the test did to one pod.
#[derive(Clone, Debug)]
struct Pod {
    index: usize,
    alive: bool,
    routed: bool,
}

/// The kernel's view of the node: workload links (name → ifindex) and host routes through them.
#[derive(Debug)]
struct Kernel {
    links: BTreeMap<String, u32>,
    routes: BTreeSet<(IpAddr, String)>,
}

fn read_kernel(node: &NetNs) -> Kernel {
    let mut links = BTreeMap::new();
    for line in node.ip(&["-o", "link", "show"]).expect("ip link").lines() {
        // "7: vethpc12@if2: <BROADCAST,...> ..."
        let mut fields = line.split(": ");
        let (Some(index), Some(name)) = (fields.next(), fields.next()) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if name.starts_with("vethp") {
            links.insert(name.to_owned(), index.trim().parse().expect("ifindex"));
        }
    }
    let mut routes = BTreeSet::new();
    for family in ["-4", "-6"] {
        let out = node
            .ip(&[family, "-o", "route", "show", "table", "main"])
            .expect("ip route");
        for line in out.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let Some(dev) = fields
                .iter()
                .position(|f| *f == "dev")
                .and_then(|i| fields.get(i + 1))
            else {
                continue;
            };
            // A host route prints without a prefix length; anything through a gateway is not.
            if !dev.starts_with("vethp") || fields.contains(&"via") || fields[0].contains('/') {
                continue;
            }
            if let Ok(addr) = fields[0].parse::<IpAddr>() {
                routes.insert((addr, (*dev).to_owned()));
            }
        }
    }
    Kernel { links, routes }
}

/// What the map must hold once every cool-down is over, from what the test did: for each
/// address, the newest live pod with its route is its Active holder, else the newest live pod
/// that had it is its Draining holder; an older live pod that had it is fenced; an address no
/// live pod has is gone.
fn expected_map(pods: &[Pod], kernel: &Kernel) -> BTreeMap<IpAddr, MapEntry> {
    let index_of = |i: usize| kernel.links[&host_if(i)];
    let mut users: BTreeMap<IpAddr, Vec<&Pod>> = BTreeMap::new();
    for pod in pods.iter().filter(|p| p.alive) {
        for addr in [v4(pod.index), v6(pod.index)] {
            users.entry(addr).or_default().push(pod);
        }
    }
    let mut map = BTreeMap::new();
    let lab_pods = [
        (IpAddr::from(POD_A_V4), "vethpa"),
        (POD_A_V6.into(), "vethpa"),
        (POD_B_V4.into(), "vethpb"),
        (POD_B_V6.into(), "vethpb"),
    ];
    for (addr, dev) in lab_pods {
        map.insert(
            addr,
            MapEntry {
                state: "active".to_owned(),
                holder: kernel.links[dev],
                fenced: 0,
            },
        );
    }
    for (addr, users) in users {
        let newest = users.last().expect("at least one");
        let (state, holder) = match users.iter().rev().find(|p| p.routed) {
            Some(routed) => ("active", routed),
            None => ("draining", newest),
        };
        let fenced = users
            .iter()
            .rev()
            .find(|p| p.index != holder.index)
            .map_or(0, |p| index_of(p.index));
        map.insert(
            addr,
            MapEntry {
                state: state.to_owned(),
                holder: index_of(holder.index),
                fenced,
            },
        );
    }
    map
}

fn link_pins(lab: &Lab) -> BTreeSet<String> {
    fs::read_dir(lab.bpffs.path().join("links"))
        .expect("reading the link pins")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

fn metric(agent: &Agent, name: &str, labels: &[(&str, &str)]) -> f64 {
    agent
        .metric(name, labels)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// (h) 200 pod lifecycles, then everything agrees. See the module documentation.
#[test]
fn churn_of_200_pod_lifecycles_leaves_registry_maps_and_kernel_in_agreement() {
    let started = Instant::now();
    let lab = Lab::new().expect("building the lab");
    let pod_ns = NetNs::new("churn").expect("the pods' namespace");
    let agent = lab
        .start_agent(&[
            "--workload",
            "vethp*",
            "--uplink",
            "up0",
            "--cooldown",
            "300ms",
            "--quiet-period",
            "100ms",
            "--max-cooldown",
            "1s",
        ])
        .expect("starting ipq-agent");

    let mut pods: Vec<Pod> = Vec::new();
    let mut last_deletion = Instant::now();
    for i in 0..LIFECYCLES {
        // Pod i comes up.
        let (name, a4, a6) = (host_if(i), v4(i), v6(i));
        batch(
            &lab.node,
            &[
                format!(
                    "link add {name} type veth peer name p{i} netns {}",
                    pod_ns.name()
                ),
                format!("link set {name} up"),
            ],
        );
        batch(
            &pod_ns,
            &[
                format!("link set p{i} up"),
                format!("addr add {a4}/32 dev p{i}"),
                format!("addr add {a6}/128 dev p{i} nodad"),
            ],
        );
        batch(
            &lab.node,
            &[
                // A metric of its own: the route of a killed pod on the same address may
                // still be there.
                format!("route add {a4}/32 dev {name} metric {}", i + 1),
                format!("route add {a6}/128 dev {name} metric {}", i + 1),
            ],
        );
        pods.push(Pod {
            index: i,
            alive: true,
            routed: true,
        });
        // An older pod terminates: its routes are withdrawn.
        if let Some(j) = i.checked_sub(DRAIN_AFTER).filter(|j| !killed(*j)) {
            let name = host_if(j);
            batch(
                &lab.node,
                &[
                    format!("route del {}/32 dev {name}", v4(j)),
                    format!("route del {}/128 dev {name}", v6(j)),
                ],
            );
            pods[j].routed = false;
        }
        // An even older one is gone.
        if let Some(j) = i.checked_sub(DELETE_AFTER) {
            batch(&lab.node, &[format!("link del {}", host_if(j))]);
            pods[j].alive = false;
            pods[j].routed = false;
            last_deletion = Instant::now();
        }
    }
    let churned = started.elapsed();

    // Every cool-down ends by max_cooldown after the last deletion; the agent converges to
    // exactly what the kernel says.
    let kernel = read_kernel(&lab.node);
    let want = expected_map(&pods, &kernel);
    let settled_by = last_deletion + MAX_COOLDOWN + SLACK;
    let mut last_seen = BTreeMap::new();
    let waited = poll(
        "the map to match the kernel with nothing quarantined",
        settled_by.saturating_duration_since(Instant::now()),
        || {
            last_seen = lab.maps().entries()?;
            Ok((last_seen == want).then(Instant::now))
        },
    );
    let settled_at = waited.unwrap_or_else(|e| {
        let diff: Vec<String> = want
            .keys()
            .chain(last_seen.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter(|a| want.get(a) != last_seen.get(a))
            .map(|a| {
                format!(
                    "  {a}: want {:?}, map has {:?}",
                    want.get(a),
                    last_seen.get(a)
                )
            })
            .collect();
        panic!(
            "{e:#}\ndifferences:\n{}\nkernel: {kernel:#?}",
            diff.join("\n")
        )
    });
    let map = last_seen;

    // The map against the kernel's links and routes, independently of the model.
    let live: BTreeSet<u32> = kernel.links.values().copied().collect();
    let name_of: BTreeMap<u32, &String> = kernel.links.iter().map(|(n, i)| (*i, n)).collect();
    for (addr, entry) in &map {
        assert!(
            live.contains(&entry.holder),
            "{addr}: held by if{} which is not a live workload link: {entry:?}",
            entry.holder
        );
        assert!(
            entry.fenced == 0 || live.contains(&entry.fenced),
            "{addr}: fences if{} which is not a live workload link: {entry:?}",
            entry.fenced
        );
        let routed = kernel
            .routes
            .contains(&(*addr, name_of[&entry.holder].clone()));
        match entry.state.as_str() {
            "active" => assert!(routed, "{addr}: Active without its host route: {entry:?}"),
            "draining" => assert!(!routed, "{addr}: Draining with its host route: {entry:?}"),
            other => panic!("{addr}: {other} after every cool-down is over: {entry:?}"),
        }
    }
    for (addr, dev) in &kernel.routes {
        let entry = map
            .get(addr)
            .unwrap_or_else(|| panic!("{addr} has a host route through {dev} but no entry"));
        let ifindex = kernel.links[dev];
        assert!(
            entry.holder == ifindex || entry.fenced == ifindex,
            "{addr} routed through {dev} (if{ifindex}) but the map says {entry:?}"
        );
    }

    // The registry (its metrics) against the map.
    let count = |state: &str| map.values().filter(|e| e.state == state).count() as f64;
    for state in ["active", "draining", "quarantined"] {
        assert_eq!(
            metric(&agent, "ipq_addresses", &[("state", state)]),
            count(state),
            "ipq_addresses{{state={state}}} vs the map"
        );
    }
    assert_eq!(
        metric(&agent, "ipq_registry_entries", &[]),
        map.len() as f64,
        "ipq_registry_entries vs the map"
    );

    // Attachments: exactly the live workload links and the uplink, nothing of a deleted link
    // (once the last new pods' netlink filters have moved to TCX links).
    wait_tc_upgrades(&agent);
    let mut want_pins: BTreeSet<String> = live
        .iter()
        .flat_map(|i| [format!("if{i}-tcx-ingress"), format!("if{i}-tcx-egress")])
        .collect();
    let up0 = ipq_tests::lab::ifindex(&lab.node, "up0").expect("up0");
    want_pins.insert(format!("if{up0}-xdp"));
    assert_eq!(link_pins(&lab), want_pins, "link pins");
    for hook in ["tc_ingress", "tc_egress"] {
        assert_eq!(
            metric(&agent, "ipq_datapath_interfaces", &[("hook", hook)]),
            live.len() as f64,
            "ipq_datapath_interfaces{{hook={hook}}}"
        );
    }

    // The churn did exercise reuse: every IPv4 claim after the first three was over a live
    // holder.
    let early = metric(&agent, "ipq_conflicts_total", &[("kind", "early_reuse")]);
    let resyncs = metric(&agent, "ipq_netlink_resyncs_total", &[]);
    assert!(
        early >= 1.0,
        "no early_reuse conflict in {LIFECYCLES} lifecycles"
    );
    if resyncs == 0.0 {
        assert_eq!(
            early,
            (LIFECYCLES - V4_POOL) as f64,
            "early_reuse conflicts (every IPv4 claim after the first {V4_POOL})"
        );
    }
    // Every quarantine (one per deleted pod: each still held its IPv6 address when it went)
    // ended, by release or by a claim, and none lasted much beyond max_cooldown.
    let ended = metric(&agent, "ipq_quarantine_duration_seconds_count", &[]);
    let within = metric(
        &agent,
        "ipq_quarantine_duration_seconds_bucket",
        &[("le", "2.5")],
    );
    let reclaimed = metric(
        &agent,
        "ipq_conflicts_total",
        &[("kind", "reuse_in_cooldown")],
    );
    assert_eq!(
        within, ended,
        "quarantines longer than 2.5 s with max_cooldown {MAX_COOLDOWN:?}"
    );
    if resyncs == 0.0 {
        assert_eq!(
            ended + reclaimed,
            (LIFECYCLES - DELETE_AFTER) as f64,
            "quarantines released ({ended}) plus reclaimed in cool-down ({reclaimed}) vs \
             pods deleted"
        );
    }
    let elapsed = started.elapsed();
    eprintln!(
        "churn: {LIFECYCLES} lifecycles in {churned:?}, settled {:?} after the last deletion, \
         {early} early_reuse, {reclaimed} reuse_in_cooldown, {ended} released, {resyncs} \
         resyncs, {elapsed:?} in all",
        settled_at - last_deletion,
    );
    assert!(
        elapsed < TIME_BUDGET,
        "the churn test took {elapsed:?}, over its {TIME_BUDGET:?} budget"
    );
}
