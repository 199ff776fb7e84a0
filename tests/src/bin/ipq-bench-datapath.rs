//! The datapath probe of `cargo xtask bench` (not a test: it measures, it asserts nothing).
//!
//! In network namespaces of its own it loads the real object, fills the address map to each
//! registry size, and prints one JSON line per measurement on stdout:
//! `{"name":..,"size":..,"unit":..,"trial":..,"value":..}`. xtask takes min and median.
//!
//! - `BPF_PROG_TEST_RUN` of every path (ns per run, the kernel's mean over `--repeat` runs),
//!   each next to the empty program of its hook measured in the same trial, and the ratio.
//!   Drops are also measured against the floor programs (the same parse and lookups, then
//!   DROP): `<drop>_over_floor` is what ipq's counting, stamping and sampling add.
//! - veth packets per second from a pod to the node with no program, the empty TC program,
//!   ipq's TC ingress program, and an nftables netdev set of the same size (at the largest size).
//!
//! Trials are interleaved: every figure is measured once per trial, in an order that rotates.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use aya::programs::{
    tc::SchedClassifierLinkId, SchedClassifier, TcAttachType, TestRun, TestRunOptions, Xdp,
};
use ipq::{
    datapath::{Datapath, LoadOptions},
    netdev,
};
use ipq_common::{
    addr::{AddrEntry, AddrKey, AddrState, NO_IFINDEX},
    config::Mode,
    names,
    slots::SlotsOrder,
};
use ipq_tests::{
    netns::{require_root, BpffsDir, NetNs},
    packets::{
        arp, ethernet, ipv4, ipv6, udp, Fragment, Vlan, ARP_REPLY, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6,
        IPPROTO_UDP,
    },
};

const POD4: Ipv4Addr = Ipv4Addr::new(10, 30, 0, 2);
const NODE4: Ipv4Addr = Ipv4Addr::new(10, 30, 0, 1);
const POD6: Ipv6Addr = Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 2);
const PEER6: Ipv6Addr = Ipv6Addr::new(0xfd31, 0, 0, 0, 0, 0, 0, 2);
const FENCED4: Ipv4Addr = Ipv4Addr::new(10, 30, 0, 9);
const FENCED6: Ipv6Addr = Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 9);
const STALE4: Ipv4Addr = Ipv4Addr::new(10, 30, 0, 7);
const STALE6: Ipv6Addr = Ipv6Addr::new(0xfd30, 0, 0, 0, 0, 0, 0, 7);
const UNKNOWN4: Ipv4Addr = Ipv4Addr::new(10, 40, 0, 1);
const UNKNOWN6: Ipv6Addr = Ipv6Addr::new(0xfd40, 0, 0, 0, 0, 0, 0, 1);
/// The filler: quarantined addresses from one /16, the case that saturated the old bitmap.
const FILLER_BASE: u32 = 0x0a14_0000; // 10.20.0.0
/// Entries besides the filler.
const FIXED_ENTRIES: u32 = 6;
/// Destinations of the XDP pass figure: outside the filler's /16, averaged over, so that the
/// filter's false-positive rate shows as what it costs on average.
const XDP_PASS_DESTINATIONS: u32 = 16;
const UDP_PORT: u16 = 9;

struct Args {
    trials: u32,
    repeat: u32,
    sizes: Vec<u32>,
    veth: Duration,
}

fn args() -> anyhow::Result<Args> {
    let mut args = Args {
        trials: 7,
        repeat: 200_000,
        sizes: vec![1, 1000, 16384, 65536],
        veth: Duration::from_millis(1000),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| anyhow::anyhow!("{flag} {value}: {e}");
        match flag.as_str() {
            "--trials" => args.trials = value.parse().map_err(bad)?,
            "--repeat" => args.repeat = value.parse().map_err(bad)?,
            "--veth-ms" => args.veth = Duration::from_millis(value.parse().map_err(bad)?),
            "--sizes" => {
                args.sizes = value
                    .split(',')
                    .map(|s| s.parse().map_err(bad))
                    .collect::<Result<_, _>>()?
            }
            _ => bail!("unknown option {flag}"),
        }
    }
    if args.sizes.is_empty() || args.trials == 0 || args.repeat == 0 {
        bail!("--sizes, --trials and --repeat must not be empty or zero");
    }
    args.sizes.sort_unstable();
    Ok(args)
}

/// Names the figures of the programs loaded with fetch-atomic barriers.
const FETCH_BARRIER_PREFIX: &str = "fetch_barrier_";
/// The figures with the address table unread (`SlotsOrder::HashOnly`).
const HASH_ONLY_PREFIX: &str = "hash_only_";

/// One measurement line.
fn emit(name: &str, size: u32, unit: &str, trial: u32, value: f64) {
    println!(
        "{}",
        serde_json::json!({"name": name, "size": size, "unit": unit, "trial": trial, "value": value})
    );
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hook {
    Tc,
    Xdp,
}

/// One figure: a program, the frames it is handed (averaged over), and the empty program of
/// its hook that it is compared with (`None` for the empty programs themselves).
struct Figure {
    name: &'static str,
    hook: Hook,
    program: &'static str,
    frames: Vec<Vec<u8>>,
    compare: bool,
    /// The figure of the floor program with the same frames: a drop is also reported as a
    /// ratio to it (`<name>_over_floor`), which is the part of a drop ipq's own work costs.
    floor: Option<&'static str>,
}

fn frame4(src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
    // 64 bytes on the wire without the FCS: 14 + 20 + 8 + 18.
    let datagram = udp(&[0u8; 18]);
    let packet = ipv4(src, dst, IPPROTO_UDP, Fragment::Whole, &datagram);
    ethernet(Vlan::Untagged, ETH_P_IP, &packet).bytes
}

fn frame6(src: Ipv6Addr, dst: Ipv6Addr) -> Vec<u8> {
    let packet = ipv6(src, dst, IPPROTO_UDP, &udp(&[0u8; 10]));
    ethernet(Vlan::Untagged, ETH_P_IPV6, &packet).bytes
}

fn arp_reply(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    ethernet(Vlan::Untagged, ETH_P_ARP, &arp(ARP_REPLY, sender, target)).bytes
}

fn figures() -> Vec<Figure> {
    use Hook::*;
    let peer4 = Ipv4Addr::new(10, 31, 0, 2);
    let xdp_pass4: Vec<Vec<u8>> = (0..XDP_PASS_DESTINATIONS)
        .map(|i| frame4(peer4, Ipv4Addr::from(0x0a15_0000 + i * 977)))
        .collect();
    let xdp_pass6: Vec<Vec<u8>> = (0..XDP_PASS_DESTINATIONS)
        .map(|i| {
            frame6(
                PEER6,
                Ipv6Addr::from((0xfd32_u128 << 112) | (u128::from(i) * 7919)),
            )
        })
        .collect();
    let f = |name, hook, program, frames, compare| Figure {
        name,
        hook,
        program,
        frames,
        compare,
        floor: None,
    };
    let drop = |name, hook, program, frames, floor| Figure {
        floor: Some(floor),
        ..f(name, hook, program, frames, true)
    };
    let (ingress, egress, xdp) = (
        names::PROG_TC_INGRESS,
        names::PROG_TC_EGRESS,
        names::PROG_XDP_UPLINK,
    );
    vec![
        f(
            "tc_empty",
            Tc,
            names::PROG_TC_EMPTY,
            vec![frame4(POD4, peer4)],
            false,
        ),
        f(
            "xdp_empty",
            Xdp,
            names::PROG_XDP_EMPTY,
            vec![frame4(peer4, POD4)],
            false,
        ),
        f(
            "tc_ingress_pass_v4",
            Tc,
            ingress,
            vec![frame4(POD4, peer4)],
            true,
        ),
        f(
            "tc_ingress_pass_v6",
            Tc,
            ingress,
            vec![frame6(POD6, PEER6)],
            true,
        ),
        f(
            "tc_egress_pass_v4",
            Tc,
            egress,
            vec![frame4(peer4, POD4)],
            true,
        ),
        f(
            "tc_egress_pass_v6",
            Tc,
            egress,
            vec![frame6(PEER6, POD6)],
            true,
        ),
        f("xdp_pass_v4", Xdp, xdp, xdp_pass4, true),
        f("xdp_pass_v6", Xdp, xdp, xdp_pass6, true),
        f(
            "tc_unknown_source_v4",
            Tc,
            ingress,
            vec![frame4(UNKNOWN4, peer4)],
            true,
        ),
        f(
            "tc_unknown_source_v6",
            Tc,
            ingress,
            vec![frame6(UNKNOWN6, PEER6)],
            true,
        ),
        // The floors of the drops below: the same parse and lookups, then DROP, nothing else.
        f(
            "tc_floor_fenced_v4",
            Tc,
            names::PROG_TC_FLOOR,
            vec![frame4(FENCED4, peer4)],
            true,
        ),
        f(
            "tc_floor_fenced_v6",
            Tc,
            names::PROG_TC_FLOOR,
            vec![frame6(FENCED6, PEER6)],
            true,
        ),
        f(
            "xdp_floor_stale_v4",
            Xdp,
            names::PROG_XDP_FLOOR,
            vec![frame4(peer4, STALE4)],
            true,
        ),
        f(
            "xdp_floor_stale_v6",
            Xdp,
            names::PROG_XDP_FLOOR,
            vec![frame6(PEER6, STALE6)],
            true,
        ),
        drop(
            "tc_drop_fenced_v4",
            Tc,
            ingress,
            vec![frame4(FENCED4, peer4)],
            "tc_floor_fenced_v4",
        ),
        drop(
            "tc_drop_fenced_v6",
            Tc,
            ingress,
            vec![frame6(FENCED6, PEER6)],
            "tc_floor_fenced_v6",
        ),
        // Parse and one hash lookup that misses, nothing else (an ARP reply from an unknown
        // sender is a remote-claim check, which has no filter in front of it). A drop's lookup
        // hits, which costs more (the key compare): its floor is `xdp_floor_stale_*`.
        f(
            "xdp_lookup_miss_arp",
            Xdp,
            xdp,
            vec![arp_reply(UNKNOWN4, peer4)],
            true,
        ),
        drop(
            "xdp_drop_stale_v4",
            Xdp,
            xdp,
            vec![frame4(peer4, STALE4)],
            "xdp_floor_stale_v4",
        ),
        drop(
            "xdp_drop_stale_v6",
            Xdp,
            xdp,
            vec![frame6(PEER6, STALE6)],
            "xdp_floor_stale_v6",
        ),
    ]
}

/// Mean ns per run of `figure`, over its frames.
fn measure(dp: &mut Datapath, figure: &Figure, ifindex: u32, repeat: u32) -> anyhow::Result<f64> {
    let mut ctx = [0u8; 44];
    ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
    let per_frame = (repeat / figure.frames.len() as u32).max(1);
    let mut total = 0.0;
    for frame in &figure.frames {
        let options = TestRunOptions {
            data_in: Some(frame),
            ctx_in: (figure.hook == Hook::Tc).then_some(&ctx[..]),
            repeat: per_frame,
            ..Default::default()
        };
        let program = dp
            .program_mut(figure.program)
            .with_context(|| format!("program {} missing", figure.program))?;
        let result = match figure.hook {
            Hook::Tc => <&mut SchedClassifier>::try_from(program)?.test_run(options)?,
            Hook::Xdp => <&mut Xdp>::try_from(program)?.test_run(options)?,
        };
        total += result.duration.as_nanos() as f64;
    }
    Ok(total / figure.frames.len() as f64)
}

/// Brings the registry to `size` entries: the fixed ones, then quarantined filler.
fn fill(dp: &mut Datapath, here: u32, other: u32, size: u32) -> anyhow::Result<()> {
    let now = netdev::monotonic_ns();
    if dp.maps.table.is_empty() {
        let active = AddrEntry::new(AddrState::Active, here, now);
        let fenced = AddrEntry::new(AddrState::Active, other, now).with_fenced(here);
        let stale = AddrEntry::new(AddrState::Quarantined, NO_IFINDEX, now);
        for (addr, entry) in [
            (IpAddr::V4(POD4), active),
            (IpAddr::V6(POD6), active),
            (IpAddr::V4(FENCED4), fenced),
            (IpAddr::V6(FENCED6), fenced),
            (IpAddr::V4(STALE4), stale),
            (IpAddr::V6(STALE6), stale),
        ] {
            dp.maps.table.put(AddrKey::from(addr), entry)?;
        }
    }
    let filler = size.saturating_sub(FIXED_ENTRIES);
    let have = (dp.maps.table.len() as u32).saturating_sub(FIXED_ENTRIES);
    let quarantined = AddrEntry::new(AddrState::Quarantined, NO_IFINDEX, now);
    for i in have..filler {
        let key = AddrKey::from_ipv4(Ipv4Addr::from(FILLER_BASE + i));
        dp.maps.table.put(key, quarantined)?;
    }
    Ok(())
}

fn load(
    bpffs: &BpffsDir,
    capacity: u32,
    slots_order: Option<SlotsOrder>,
) -> anyhow::Result<Datapath> {
    let mut dp = Datapath::load(&LoadOptions {
        bpffs_dir: bpffs.path().to_path_buf(),
        capacity,
        mode: Mode::Enforce,
        slots_order,
        bpf_watcher: ipq::config::BpfWatcher::Auto,
    })
    .context("loading the datapath")?;
    let tc: &mut SchedClassifier = dp
        .program_mut(names::PROG_TC_EMPTY)
        .context("empty TC program missing")?
        .try_into()?;
    tc.load()?;
    let xdp: &mut Xdp = dp
        .program_mut(names::PROG_XDP_EMPTY)
        .context("empty XDP program missing")?
        .try_into()?;
    xdp.load()?;
    let tc: &mut SchedClassifier = dp
        .program_mut(names::PROG_TC_FLOOR)
        .context("TC floor program missing")?
        .try_into()?;
    tc.load()?;
    let xdp: &mut Xdp = dp
        .program_mut(names::PROG_XDP_FLOOR)
        .context("XDP floor program missing")?
        .try_into()?;
    xdp.load()?;
    Ok(dp)
}

/// Every figure through `BPF_PROG_TEST_RUN`, named `<prefix><figure>`.
fn test_runs(
    dp: &mut Datapath,
    args: &Args,
    here: u32,
    other: u32,
    prefix: &str,
) -> anyhow::Result<()> {
    let figures = figures();
    for &size in &args.sizes {
        fill(dp, here, other, size)?;
        eprintln!("datapath: {} entries in the registry", dp.maps.table.len());
        for trial in 0..args.trials {
            let mut ns = BTreeMap::new();
            // Rotate the order each trial, so no figure always runs first (or right after
            // the same neighbour).
            let n = figures.len();
            for k in 0..n {
                let figure = &figures[(k + trial as usize) % n];
                ns.insert(figure.name, measure(dp, figure, here, args.repeat)?);
            }
            for figure in &figures {
                let value = ns[figure.name];
                let name = format!("{prefix}{}", figure.name);
                emit(&name, size, "ns", trial, value);
                if figure.compare {
                    let empty = match figure.hook {
                        Hook::Tc => ns["tc_empty"],
                        Hook::Xdp => ns["xdp_empty"],
                    };
                    let ratio_name = format!("{name}_ratio");
                    emit(&ratio_name, size, "x", trial, value / empty);
                }
                if let Some(floor) = figure.floor {
                    let floor_name = format!("{name}_over_floor");
                    emit(&floor_name, size, "x", trial, value / ns[floor]);
                }
            }
        }
    }
    Ok(())
}

/// What runs on the node side of the pod's veth during a veth figure.
#[derive(Clone, Copy, Debug)]
enum OnVeth {
    Nothing,
    Empty,
    Ipq,
    Nftables,
}

impl OnVeth {
    const ALL: [OnVeth; 4] = [Self::Nothing, Self::Empty, Self::Ipq, Self::Nftables];

    fn name(self) -> &'static str {
        match self {
            Self::Nothing => "veth_pps_no_program",
            Self::Empty => "veth_pps_empty_program",
            Self::Ipq => "veth_pps_ipq",
            Self::Nftables => "veth_pps_nftables_set",
        }
    }
}

/// An nftables netdev table on `dev` dropping sources in a set of the filler and fixed
/// quarantined addresses, `size` in all; removed by [`nft_off`].
fn nft_on(node: &NetNs, dev: &str, size: u32) -> anyhow::Result<()> {
    let mut elements = String::new();
    let _ = write!(elements, "{STALE4}, {FENCED4}");
    for i in 0..size.saturating_sub(2) {
        let _ = write!(elements, ", {}", Ipv4Addr::from(FILLER_BASE + i));
    }
    let ruleset = format!(
        "table netdev ipqbench {{\n  set quarantined {{ type ipv4_addr; elements = {{ {elements} }} }}\n  \
         chain ingress {{ type filter hook ingress device {dev} priority 0; ip saddr @quarantined drop; }}\n}}\n"
    );
    let path = std::env::temp_dir().join(format!("ipq-bench-nft-{}.nft", std::process::id()));
    std::fs::write(&path, ruleset)?;
    let status = node.command("nft").arg("-f").arg(&path).status();
    let _ = std::fs::remove_file(&path);
    if !status
        .context("running nft (apt-get install nftables)")?
        .success()
    {
        bail!("nft -f refused the benchmark's ruleset");
    }
    Ok(())
}

fn nft_off(node: &NetNs) -> anyhow::Result<()> {
    let status = node
        .command("nft")
        .args(["delete", "table", "netdev", "ipqbench"])
        .status()?;
    if !status.success() {
        bail!("nft delete table netdev ipqbench failed");
    }
    Ok(())
}

/// Datagrams the pod's socket got out in `duration` (each one crossed the veth and the node's
/// ingress before `send` returned: veth delivers in the sender's context).
fn blast(socket: &UdpSocket, duration: Duration) -> f64 {
    let payload = [0u8; 18];
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < duration {
        for _ in 0..256 {
            if socket.send(&payload).is_ok() {
                sent += 1;
            }
        }
    }
    sent as f64 / start.elapsed().as_secs_f64()
}

fn veth_runs(
    dp: &mut Datapath,
    node: &NetNs,
    pod: &NetNs,
    args: &Args,
    size: u32,
) -> anyhow::Result<()> {
    // Runs on the node namespace's thread already: only the pod's socket needs `pod.run`.
    let sink = UdpSocket::bind(SocketAddr::from((NODE4, UDP_PORT)))?;
    let sender = pod.run(|| -> std::io::Result<UdpSocket> {
        let socket = UdpSocket::bind(SocketAddr::from((POD4, 0)))?;
        socket.connect(SocketAddr::from((NODE4, UDP_PORT)))?;
        Ok(socket)
    })?;
    for trial in 0..args.trials {
        for k in 0..OnVeth::ALL.len() {
            let on = OnVeth::ALL[(k + trial as usize) % OnVeth::ALL.len()];
            let link = attach(dp, on, size, node)?;
            let pps = blast(&sender, args.veth);
            detach(dp, on, link, node)?;
            emit(on.name(), size, "pps", trial, pps);
        }
    }
    drop(sink);
    Ok(())
}

fn attach(
    dp: &mut Datapath,
    on: OnVeth,
    size: u32,
    node: &NetNs,
) -> anyhow::Result<Option<SchedClassifierLinkId>> {
    let program = match on {
        OnVeth::Nothing => return Ok(None),
        OnVeth::Nftables => {
            nft_on(node, "bd-host", size)?;
            return Ok(None);
        }
        OnVeth::Empty => names::PROG_TC_EMPTY,
        OnVeth::Ipq => names::PROG_TC_INGRESS,
    };
    let prog: &mut SchedClassifier = dp.program_mut(program).context("missing")?.try_into()?;
    Ok(Some(prog.attach("bd-host", TcAttachType::Ingress)?))
}

fn detach(
    dp: &mut Datapath,
    on: OnVeth,
    link: Option<SchedClassifierLinkId>,
    node: &NetNs,
) -> anyhow::Result<()> {
    match (on, link) {
        (OnVeth::Nftables, _) => nft_off(node),
        (OnVeth::Empty | OnVeth::Ipq, Some(link)) => {
            let program = match on {
                OnVeth::Empty => names::PROG_TC_EMPTY,
                _ => names::PROG_TC_INGRESS,
            };
            let prog: &mut SchedClassifier =
                dp.program_mut(program).context("missing")?.try_into()?;
            prog.detach(link)?;
            Ok(())
        }
        _ => Ok(()),
    }
}

fn main() -> anyhow::Result<()> {
    require_root()?;
    let args = args()?;
    let node = NetNs::new("bench-node")?;
    let pod = NetNs::new("bench-pod")?;
    let pod_end = format!("netns {}", pod.name());
    let wire = format!("link add bd-host type veth peer name eth0 {pod_end}");
    node.ip(&wire.split_whitespace().collect::<Vec<_>>())?;
    node.ip(&[
        "link",
        "add",
        "bd-other",
        "type",
        "veth",
        "peer",
        "name",
        "bd-other2",
    ])?;
    node.ip(&["addr", "add", &format!("{NODE4}/24"), "dev", "bd-host"])?;
    node.ip(&["link", "set", "bd-host", "up"])?;
    pod.ip(&["addr", "add", &format!("{POD4}/24"), "dev", "eth0"])?;
    pod.ip(&["link", "set", "eth0", "up"])?;
    let bpffs = BpffsDir::new()?;
    let capacity = *args.sizes.last().expect("checked non-empty");
    node.run(|| -> anyhow::Result<()> {
        let here = netdev::ifindex("bd-host").context("bd-host missing")?;
        let other = netdev::ifindex("bd-other").context("bd-other missing")?;
        let started = Instant::now();
        let mut dp = load(&bpffs, capacity, None)?;
        eprintln!(
            "datapath: loaded at capacity {capacity} in {:?}",
            started.elapsed()
        );
        test_runs(&mut dp, &args, here, other, "")?;
        // The same figures with the reads of the table ordered as a weakly ordered CPU needs
        // them (fetch-atomic barriers), on this CPU: what the barriers would cost here, where
        // x86-64 does without them (`SlotsOrder`).
        {
            let bpffs = BpffsDir::new()?;
            let mut ordered = load(&bpffs, capacity, Some(SlotsOrder::FetchBarrier))?;
            test_runs(&mut ordered, &args, here, other, FETCH_BARRIER_PREFIX)?;
        }
        // The same figures with the table not read at all: every lookup asks `IPQ_ADDRS`
        // and reads the verdict twice (it may be torn by the agent's reuse of an element),
        // as arm64 kernels before 5.12 run them, and any CPU while a slot is mid-write.
        {
            let bpffs = BpffsDir::new()?;
            let mut hashed = load(&bpffs, capacity, Some(SlotsOrder::HashOnly))?;
            test_runs(&mut hashed, &args, here, other, HASH_ONLY_PREFIX)?;
        }
        // The pod's neighbour entry, so no ARP is in the measured loop.
        // (`/sys` is the host's here: ask `ip` for the MAC.)
        let brief = node.ip(&["-br", "link", "show", "bd-host"])?;
        let node_mac = brief
            .split_whitespace()
            .nth(2)
            .with_context(|| format!("no MAC in {brief:?}"))?;
        pod.ip(&[
            "neigh",
            "replace",
            &NODE4.to_string(),
            "lladdr",
            node_mac,
            "dev",
            "eth0",
            "nud",
            "permanent",
        ])?;
        veth_runs(&mut dp, &node, &pod, &args, capacity)
    })
}
