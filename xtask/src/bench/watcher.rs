//! The bpf() watcher's figures (issue 28): what it costs the node, and how soon a fence is back
//! after another process undoes it with a `bpf()` call, on a node whose agent verifies only
//! every 60 s (so only the watcher can repair within the figures):
//!
//! - `watcher_syscall_ns_off/on`: one `getppid()`, the cheapest system call, before the agent
//!   starts and while its watcher is attached (every system call of the node passes the
//!   tracepoint); `watcher_map_update_ns_off/on`: one `BPF_MAP_UPDATE_ELEM` on a map of the
//!   bench's own (another CNI's map updates: reported by nobody, but each passes the program);
//! - `watcher_tcx_detach_p50/p99`: a veth's TCX ingress link detached through its pin
//!   (`bpftool link detach pinned ...`), until the kernel lists a program on that hook again;
//! - `watcher_xdp_detach_p99`: the uplink's XDP link likewise, until `ip link` shows a program
//!   (polled with `ip`, a few ms a look);
//! - `watcher_addrs_write_p99`: an entry of `IPQ_ADDRS` rewritten by this process (the pin
//!   opened, one update: what bpftool does), until the map holds the agent's entry again.
//!
//! Each repair is timed from the call's return, polling (≤ 0.2 ms between looks, except XDP).
//! The undoings are [`APART`] apart: one tool's call at a time. (The agent serves a storm of
//! calls with a pass every 50 ms at most, so calls closer together wait up to that more.)
//! Target: p99 ≤ 100 ms.

use std::{
    ffi::CString,
    os::unix::ffi::OsStrExt as _,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{
    control::{node::Node, percentile},
    min_and_median, BenchOptions, Row, Target,
};

const GROUP: &str = "watcher";
const VETHS: u32 = 20;
/// Undoings of each kind per trial.
const EVENTS: u32 = 20;
const XDP_EVENTS: u32 = 5;
/// System calls timed per cost figure.
const CALLS: u32 = 1_000_000;
const GIVE_UP: Duration = Duration::from_secs(10);
/// Between one repair and the next undoing: more than the agent's least gap between two passes
/// the watcher asks for (50 ms).
const APART: Duration = Duration::from_millis(100);

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_TCX_INGRESS: u32 = 46;

fn bpf(cmd: libc::c_long, attr: &mut [u8; 64]) -> Result<i32> {
    // SAFETY: `attr` outlives the call and the pointers in it point to live buffers.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        bail!("bpf({cmd}): {}", std::io::Error::last_os_error());
    }
    Ok(rc as i32)
}

fn obj_get(path: &Path) -> Result<i32> {
    let c_path = CString::new(path.as_os_str().as_bytes())?;
    let mut attr = [0u8; 64];
    attr[0..8].copy_from_slice(&(c_path.as_ptr() as u64).to_ne_bytes());
    bpf(BPF_OBJ_GET, &mut attr).with_context(|| format!("opening {}", path.display()))
}

fn close(fd: i32) {
    // SAFETY: a descriptor this module opened, closed once.
    unsafe { libc::close(fd) };
}

fn detach_through_pin(path: &Path) -> Result<()> {
    let fd = obj_get(path)?;
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    let detached = bpf(BPF_LINK_DETACH, &mut attr);
    close(fd);
    detached.map(|_| ())
}

/// Programs on `ifindex`'s TCX ingress hook (in the caller's namespace).
fn tcx_ingress_programs(ifindex: u32) -> Result<u32> {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&ifindex.to_ne_bytes());
    attr[4..8].copy_from_slice(&BPF_TCX_INGRESS.to_ne_bytes());
    bpf(BPF_PROG_QUERY, &mut attr)?;
    Ok(u32::from_ne_bytes(attr[24..28].try_into()?))
}

fn map_elem(cmd: libc::c_long, fd: i32, key: &[u8], value: &mut [u8]) -> Result<()> {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(value.as_mut_ptr() as u64).to_ne_bytes());
    bpf(cmd, &mut attr).map(|_| ())
}

/// ns per call of `call`, over [`CALLS`] calls.
fn per_call(mut call: impl FnMut()) -> f64 {
    let started = Instant::now();
    for _ in 0..CALLS {
        call();
    }
    started.elapsed().as_nanos() as f64 / f64::from(CALLS)
}

/// (getppid ns, map update ns) on this node now, the update on `map` (an array of one u64).
fn costs(map: i32) -> (f64, f64) {
    // SAFETY: getppid has no preconditions.
    let syscall = per_call(|| unsafe {
        libc::getppid();
    });
    let key = 0u32.to_ne_bytes();
    let mut value = 7u64.to_ne_bytes();
    let update = per_call(|| {
        let _ = map_elem(BPF_MAP_UPDATE_ELEM, map, &key, &mut value);
    });
    (syscall, update)
}

fn own_map() -> Result<i32> {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&BPF_MAP_TYPE_ARRAY.to_ne_bytes());
    attr[4..8].copy_from_slice(&4u32.to_ne_bytes());
    attr[8..12].copy_from_slice(&8u32.to_ne_bytes());
    attr[12..16].copy_from_slice(&1u32.to_ne_bytes());
    bpf(BPF_MAP_CREATE, &mut attr).context("creating the bench's own map")
}

/// Polls `back` until it holds: the ms since `from`.
fn until(what: &str, from: Instant, mut back: impl FnMut() -> Result<bool>) -> Result<f64> {
    loop {
        if back()? {
            return Ok(from.elapsed().as_secs_f64() * 1e3);
        }
        if from.elapsed() > GIVE_UP {
            bail!("{what}: not repaired within {GIVE_UP:?}");
        }
        thread::sleep(Duration::from_micros(200));
    }
}

fn ifindex(name: &str) -> Result<u32> {
    let c_name = CString::new(name)?;
    // SAFETY: a NUL-terminated name.
    match unsafe { libc::if_nametoindex(c_name.as_ptr()) } {
        0 => bail!("{name}: no such interface"),
        index => Ok(index),
    }
}

/// `IPQ_ADDRS`' key of 10.99.0.`i` (an IPv4-mapped address).
fn addr_key(i: u32) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[10] = 0xff;
    key[11] = 0xff;
    key[12..16].copy_from_slice(&[10, 99, 0, i as u8 + 1]);
    key
}

fn row(name: &str, unit: &'static str, values: &[f64], target: Option<&str>) -> Row {
    let (min, median) = min_and_median(values).unwrap_or((f64::NAN, f64::NAN));
    Row {
        group: GROUP,
        name: name.to_owned(),
        size: None,
        unit,
        min,
        median,
        target: target.map(|text| Target {
            text: text.to_owned(),
            met: median <= 100.0,
        }),
    }
}

pub fn run(opts: &BenchOptions) -> Result<Vec<Row>> {
    super::release_binaries(&["ipq-agent"])?;
    let args = [
        "--workload",
        "bw*",
        "--uplink",
        "up0",
        "--tc-attach",
        "tcx",
        "--verify-interval",
        "60s",
    ];
    let mut node = Node::new(&args)?;
    let mut batch =
        String::from("link add up0 type veth peer up1\nlink set up0 up\nlink set up1 up\n");
    for i in 0..VETHS {
        batch.push_str(&format!(
            "link add bw{i} type veth peer bq{i}\nlink set bw{i} up\nlink set bq{i} up\n\
             route add 10.99.0.{}/32 dev bw{i}\n",
            i + 1
        ));
    }
    node.ip_batch(&batch)?;
    let map = own_map()?;
    let (mut syscall_off, mut update_off, mut syscall_on, mut update_on) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..opts.trials {
        let (syscall, update) = costs(map);
        syscall_off.push(syscall);
        update_off.push(update);
    }
    node.start_agent()?;
    let links = node.bpffs.join("links");
    let ifindexes: Vec<u32> = node.run(|| {
        (0..VETHS)
            .map(|i| ifindex(&format!("bw{i}")))
            .collect::<Result<Vec<u32>>>()
    })?;
    let up0 = node.run(|| ifindex("up0"))?;
    // Every veth on its TCX link before anything is timed.
    let started = Instant::now();
    for &index in &ifindexes {
        until("the veths on TCX", started, || {
            node.run(|| tcx_ingress_programs(index).map(|n| n > 0))
        })
        .map_err(|e| e.context(node.log()))?;
    }
    for _ in 0..opts.trials {
        let (syscall, update) = costs(map);
        syscall_on.push(syscall);
        update_on.push(update);
    }
    let addrs = obj_get(&node.bpffs.join("maps/IPQ_ADDRS"))?;
    let (mut tcx_p50, mut tcx_p99, mut xdp_p99, mut addrs_p99) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for trial in 0..opts.trials {
        eprintln!("bench watcher: trial {} of {}", trial + 1, opts.trials);
        let (mut tcx, mut xdp, mut written) = (Vec::new(), Vec::new(), Vec::new());
        for n in 0..EVENTS {
            let index = ifindexes[(n % VETHS) as usize];
            let pin = links.join(format!("if{index}-tcx-ingress"));
            thread::sleep(APART);
            detach_through_pin(&pin)?;
            let from = Instant::now();
            let ms = until(&format!("if{index} tcx ingress"), from, || {
                node.run(|| tcx_ingress_programs(index).map(|n| n > 0))
            });
            tcx.push(ms.map_err(|e| e.context(node.log()))?);

            let key = addr_key(n % VETHS);
            let mut ipq_wrote = [0u8; 40];
            map_elem(BPF_MAP_LOOKUP_ELEM, addrs, &key, &mut ipq_wrote)?;
            let mut tampered = ipq_wrote;
            // holder_ifindex (offset 4) pointed elsewhere: another holder's entry.
            tampered[4] ^= 0x40;
            thread::sleep(APART);
            map_elem(BPF_MAP_UPDATE_ELEM, addrs, &key, &mut tampered)?;
            let from = Instant::now();
            let ms = until("IPQ_ADDRS written back", from, || {
                let mut now = [0u8; 40];
                map_elem(BPF_MAP_LOOKUP_ELEM, addrs, &key, &mut now)?;
                // The agent's part of the entry (the programs' stamps after 24 bytes).
                Ok(now[..24] == ipq_wrote[..24])
            });
            written.push(ms.map_err(|e| e.context(node.log()))?);
        }
        for _ in 0..XDP_EVENTS {
            thread::sleep(APART);
            detach_through_pin(&links.join(format!("if{up0}-xdp")))?;
            let from = Instant::now();
            let ms = until("up0 xdp", from, || {
                Ok(node
                    .ip(&["link", "show", "dev", "up0"])?
                    .contains("prog/xdp"))
            });
            xdp.push(ms.map_err(|e| e.context(node.log()))?);
        }
        tcx_p50.push(percentile(&mut tcx.clone(), 0.5));
        tcx_p99.push(percentile(&mut tcx, 0.99));
        xdp_p99.push(percentile(&mut xdp, 0.99));
        addrs_p99.push(percentile(&mut written, 0.99));
    }
    close(addrs);
    close(map);
    node.stop_agent()?;
    Ok(vec![
        row("watcher_syscall_ns_off", "ns", &syscall_off, None),
        row("watcher_syscall_ns_on", "ns", &syscall_on, None),
        row("watcher_map_update_ns_off", "ns", &update_off, None),
        row("watcher_map_update_ns_on", "ns", &update_on, None),
        row("watcher_tcx_detach_p50", "ms", &tcx_p50, None),
        row("watcher_tcx_detach_p99", "ms", &tcx_p99, Some("≤ 100 ms")),
        row("watcher_xdp_detach_p99", "ms", &xdp_p99, Some("≤ 100 ms")),
        row(
            "watcher_addrs_write_p99",
            "ms",
            &addrs_p99,
            Some("≤ 100 ms"),
        ),
    ])
}
