//! The agent as its DaemonSet runs it, seen from the node: pid 1 of its pod's own PID namespace
//! (no hostPID) under the runtime's default seccomp filter, without CAP_SYS_ADMIN; another
//! process's write to its pinned `IPQ_ADDRS` undone within 100 ms by the bpf() watcher where the
//! shipped config attaches one, else within `verify_interval`, and then with no link on
//! `sys_enter` taxing the node's other system calls; and, idle for a minute, a small share of a
//! CPU and one verification pass per `verify_interval`.

use std::{
    fs,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _};
use aya::maps::{HashMap, MapData};
use ipq_common::addr::{AddrEntry, AddrKey, NO_IFINDEX};
use ipq_tests::cluster::{deploy::NAMESPACE, node::POD_ADDRESS, tasks, Cluster};

use super::metric;

/// The most of one CPU the idle agent may use with the bpf() watcher's trampolines (issue #36:
/// 0.5 %), and without them (no watcher, or the raw tracepoint), where every periodic pass
/// still compares the maps (this kind of build machine's kernel refuses fentry: 0.55 % measured
/// in a full run).
const IDLE_CPU_PERCENT: f64 = 0.5;
const IDLE_CPU_PERCENT_NO_TRAMPOLINES: f64 = 1.0;
/// The shipped `verify_interval` (the ConfigMap sets none: the agent's default).
const VERIFY_INTERVAL: Duration = Duration::from_secs(5);
/// How long another process's write to ipq's maps may stand where the bpf() watcher runs.
const REPAIR_WITHIN: Duration = Duration::from_millis(100);
/// Where it does not (the shipped `bpf_watcher = trampolines` on a kernel that refuses them):
/// the next periodic pass, one `verify_interval` away at most, and the pass's own time.
const REPAIR_WITHIN_NO_WATCHER: Duration = Duration::from_secs(6);
/// The DaemonSet's `bpffs_dir` (the ConfigMap's), and its pin of `IPQ_ADDRS`.
const ADDRS_PIN: &str = "/sys/fs/bpf/ipq/maps/IPQ_ADDRS";

/// capability.h's number of CAP_SYS_ADMIN.
const CAP_SYS_ADMIN: u32 = 21;

/// The agent container's process, by its pid on the node.
fn agent_pid(cluster: &Cluster) -> anyhow::Result<u32> {
    tasks::running_pid(&cluster.host, NAMESPACE, "agent")
}

/// The value of `key` in `/proc/<pid>/status`.
fn status_field(pid: u32, key: &str) -> anyhow::Result<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("/proc/{pid}/status of the agent"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .with_context(|| format!("no {key} in /proc/{pid}/status"))
}

/// Right after the install: the agent is pid 1 of a PID namespace of its own, under a seccomp
/// filter (mode 2: the runtime's default profile, which the DaemonSet asks for), and without
/// CAP_SYS_ADMIN.
pub fn runs_as_its_daemonset_says(cluster: &Cluster) -> anyhow::Result<()> {
    let pid = agent_pid(cluster)?;
    let seccomp = status_field(pid, "Seccomp")?;
    ensure!(
        seccomp == "2",
        "the agent (pid {pid} on the node) runs with Seccomp: {seccomp}, not 2 (a filter): \
         the DaemonSet's seccompProfile RuntimeDefault is not in force"
    );
    let nspid = status_field(pid, "NSpid")?;
    let ids: Vec<&str> = nspid.split_whitespace().collect();
    ensure!(
        ids.len() >= 2 && ids.last() == Some(&"1"),
        "the agent is not pid 1 of a PID namespace of its own (NSpid: {nspid}): the pod \
         would share the host's"
    );
    let eff = u64::from_str_radix(&status_field(pid, "CapEff")?, 16)?;
    ensure!(
        eff & (1 << CAP_SYS_ADMIN) == 0,
        "the agent has CAP_SYS_ADMIN (CapEff {eff:x})"
    );
    eprintln!("cluster tier: the agent: host pid {pid}, NSpid {nspid}, Seccomp {seccomp}");
    Ok(())
}

/// While the rollout's old pod is fenced: a process on the node outside the pod (the test's,
/// opening the pin by its path in the node's mount namespace) unfences its entry in
/// `IPQ_ADDRS`, as `bpftool map update pinned` would; the agent writes the fence back within
/// 100 ms where its watcher runs, else at its next periodic pass. Which it is follows from the
/// DaemonSet's own config and the kernel: with the shipped `trampolines`, a kernel that refuses
/// them (this kind of build machine's) gets no watcher, and then the agent must hold no raw
/// tracepoint, which every system call of the node would pay for.
pub fn a_foreign_write_to_its_map_is_undone_at_once(cluster: &Cluster) -> anyhow::Result<()> {
    let watcher = metric(cluster, "ipq_datapath_bpf_watcher")? == 1.0;
    let raw_tracepoint = metric(
        cluster,
        "ipq_datapath_bpf_watcher_mode{mode=\"raw_tracepoint\"}",
    )? == 1.0;
    let kinds = ipq_tests::lab::bpf_link_kinds_of(agent_pid(cluster)?)?;
    eprintln!(
        "cluster tier: the agent's bpf() watcher: {}; its bpf links: {kinds:?}",
        if !watcher {
            "none"
        } else if raw_tracepoint {
            "raw tracepoint"
        } else {
            "trampolines"
        }
    );
    ensure!(
        !raw_tracepoint && !kinds.iter().any(|k| k == "raw_tracepoint"),
        "the agent as shipped holds a raw tracepoint link ({kinds:?}): every system call of the \
         node pays for it, and the DaemonSet's config does not ask for it"
    );
    let bound = if watcher {
        REPAIR_WITHIN
    } else {
        REPAIR_WITHIN_NO_WATCHER
    };
    let key = AddrKey::from(POD_ADDRESS.parse::<IpAddr>()?);
    let pin = cluster
        .host
        .run_in_mount_namespace(|| MapData::from_pin(ADDRS_PIN))?
        .with_context(|| format!("opening the node's {ADDRS_PIN}"))?;
    let mut map: HashMap<MapData, AddrKey, AddrEntry> =
        HashMap::try_from(aya::maps::Map::HashMap(pin)).context("IPQ_ADDRS as a hash map")?;
    let rewritten = || {
        metric(
            cluster,
            "ipq_datapath_map_entries_rewritten_total{map=\"IPQ_ADDRS\"}",
        )
    };
    // The open of the pin is a call the watcher reports too: the pass it asks for is over
    // once the count of passes has moved on, and only the write is left to find.
    if watcher {
        let passes = metric(cluster, "ipq_datapath_verify_passes_total")?;
        ipq_tests::lab::poll(
            "the verification the open of IPQ_ADDRS's pin asked for",
            Duration::from_secs(10),
            || Ok((metric(cluster, "ipq_datapath_verify_passes_total")? > passes).then_some(())),
        )?;
    }
    let before = rewritten()?;
    let mut entry = map.get(&key, 0).context("the fenced address's entry")?;
    ensure!(
        entry.fenced_ifindex != NO_IFINDEX,
        "{POD_ADDRESS} is not fenced in IPQ_ADDRS to begin with: {entry:?}"
    );
    let fenced = entry.fenced_ifindex;
    entry.fenced_ifindex = NO_IFINDEX;
    map.insert(key, entry, 0).context("writing IPQ_ADDRS")?;
    let written = Instant::now();
    // Read as often as the kernel answers, to time the repair to the millisecond; bounded
    // well past the bound so that a late repair is measured, not just failed.
    let repaired_in = loop {
        let now = map.get(&key, 0).context("reading the entry back")?;
        if now.fenced_ifindex == fenced {
            break written.elapsed();
        }
        ensure!(
            written.elapsed() < Duration::from_secs(10),
            "the fence of {POD_ADDRESS} was not written back in 10 s: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    eprintln!("cluster tier: a foreign write to IPQ_ADDRS undone in {repaired_in:.1?}");
    ensure!(
        repaired_in <= bound,
        "the agent wrote the fence back {repaired_in:?} after another process's write, more \
         than {bound:?} (watcher attached: {watcher})"
    );
    ipq_tests::lab::poll("the write back counted", Duration::from_secs(10), || {
        Ok((rewritten()? >= before + 1.0).then_some(()))
    })?;
    Ok(())
}

/// utime + stime of `pid`, in clock ticks (`/proc/<pid>/stat`, every thread of it).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses and may hold spaces: state
    // is field 3, utime 14 and stime 15.
    let after = stat
        .rsplit_once(')')
        .context("no command name in /proc/<pid>/stat")?
        .1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        Ok(fields
            .get(n - 3)
            .with_context(|| format!("field {n} of /proc/{pid}/stat"))?
            .parse()?)
    };
    Ok(field(14)? + field(15)?)
}

/// The agent left alone for a minute at the end of the scenarios (nothing scheduled on the
/// drained node, no exec into its pod, metrics read from the node): the share of one CPU it
/// used and the verification passes it made, both printed, then both bounded. This is a
/// measuring window, not a wait for an event: what it measures is what happens in it.
pub fn idle_it_is_quiet(cluster: &Cluster) -> anyhow::Result<()> {
    const QUIET: Duration = Duration::from_secs(60);
    let pid = agent_pid(cluster)?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let passes_before = metric(cluster, "ipq_datapath_verify_passes_total")?;
    let ticks_before = cpu_ticks(pid)?;
    let began = Instant::now();
    std::thread::sleep(QUIET);
    let ticks = cpu_ticks(pid)? - ticks_before;
    let elapsed = began.elapsed().as_secs_f64();
    let passes = metric(cluster, "ipq_datapath_verify_passes_total")? - passes_before;
    ensure!(
        agent_pid(cluster)? == pid,
        "the agent restarted during the quiet minute"
    );
    let cpu_percent = ticks as f64 / ticks_per_second / elapsed * 100.0;
    let passes_per_minute = passes * 60.0 / elapsed;
    let expected_per_minute = 60.0 / VERIFY_INTERVAL.as_secs_f64();
    eprintln!(
        "cluster tier: the agent idle for {elapsed:.1} s: {cpu_percent:.2} % of a CPU, \
         {passes_per_minute:.1} verification passes a minute (one per verify_interval: \
         {expected_per_minute:.0})"
    );
    ensure!(
        passes_per_minute <= expected_per_minute + 2.0,
        "the idle agent verified its datapath {passes_per_minute:.1} times a minute, not about \
         {expected_per_minute:.0} (one per verify_interval): each pass takes the rtnl lock \
         every pod creation on the node needs"
    );
    let trampolines = metric(
        cluster,
        "ipq_datapath_bpf_watcher_mode{mode=\"trampolines\"}",
    )? == 1.0;
    let bound = if trampolines {
        IDLE_CPU_PERCENT
    } else {
        IDLE_CPU_PERCENT_NO_TRAMPOLINES
    };
    ensure!(
        cpu_percent <= bound,
        "the idle agent used {cpu_percent:.2} % of a CPU over {elapsed:.1} s, more than \
         {bound} % (watcher: {})",
        if trampolines {
            "trampolines"
        } else {
            "not the trampolines"
        }
    );
    Ok(())
}
