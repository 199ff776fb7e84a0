//! Names of maps and programs in the eBPF object. They are also the pin names under `bpffs_dir`,
//! so renaming one is a breaking change for upgrades: the new agent would not find the old pin.

pub const MAP_ADDRS: &str = "IPQ_ADDRS";
pub const MAP_IFACES: &str = "IPQ_IFACES";
/// The inlined exact copy of `IPQ_ADDRS` the programs read first (`slots`).
pub const MAP_SLOTS: &str = "IPQ_SLOTS";
/// The quarantine filter (a Bloom filter sized from `capacity`).
pub const MAP_QFILTER: &str = "IPQ_QBLOOM";
/// The single-hash 64 Ki-bit bitmap of agents before the Bloom filter. An upgraded agent fills
/// it with ones while the old XDP programs may still be attached (so they consult the hash map
/// for every address: slower, never blind), and removes its pin once it has attached its own.
pub const MAP_QFILTER_LEGACY: &str = "IPQ_QFILTER";
pub const MAP_COUNTERS: &str = "IPQ_COUNTERS";
pub const MAP_SAMPLES: &str = "IPQ_SAMPLES";
pub const MAP_CONFIG: &str = "IPQ_CONFIG";
/// Co-tenant probes seen by ipq's TC programs, per hook (`probe`): written by the programs
/// only, read by the agent.
pub const MAP_PROBES: &str = "IPQ_PROBES";

/// Every map ipq pins, in the order the loader checks them; the bpf() watcher reports other
/// processes' writes of each (`watch::WATCHED_MAPS` is its room).
pub const PINNED_MAPS: [&str; 8] = [
    MAP_ADDRS,
    MAP_SLOTS,
    MAP_IFACES,
    MAP_QFILTER,
    MAP_COUNTERS,
    MAP_SAMPLES,
    MAP_CONFIG,
    MAP_PROBES,
];

pub const PROG_TC_INGRESS: &str = "ipq_tc_ingress";
pub const PROG_TC_EGRESS: &str = "ipq_tc_egress";
pub const PROG_XDP_UPLINK: &str = "ipq_xdp_uplink";
/// The pins of the TC programs' second instances (the same code on the same maps): what ipq
/// attaches first on a TCX hook before detaching its old link, when it must move ahead of
/// another tool's program (a hook takes a program once).
pub const PROG_TC_INGRESS_SPARE: &str = "ipq_tc_ingress_spare";
pub const PROG_TC_EGRESS_SPARE: &str = "ipq_tc_egress_spare";
/// Empty programs of each hook: the floor the benchmarks and tests compare against.
pub const PROG_TC_EMPTY: &str = "ipq_tc_empty";
pub const PROG_XDP_EMPTY: &str = "ipq_xdp_empty";
/// The floors of the drop paths, for the benchmark: the real parse, filter and hash lookup, and
/// nothing else (no counting, stamping or sampling). Never loaded by the agent.
pub const PROG_TC_FLOOR: &str = "ipq_tc_floor";
pub const PROG_XDP_FLOOR: &str = "ipq_xdp_floor";

/// Default capacity of `IPQ_ADDRS`; the agent's `capacity` key overrides it at load time.
pub const DEFAULT_ADDR_CAPACITY: u32 = 65536;
/// Size of the conflict-sample ring buffer in bytes (a power-of-two number of pages).
pub const SAMPLES_RING_BYTES: u32 = 256 * 1024;

/// The `.rodata` global the loader sets to 1 where `bpf_ktime_get_coarse_ns` exists (5.11+), so
/// the programs stamp with CLOCK_MONOTONIC_COARSE there and with CLOCK_MONOTONIC elsewhere.
pub const GLOBAL_COARSE_CLOCK: &str = "IPQ_COARSE_CLOCK";

/// Priority (`tc filter ... pref`) of ipq's cls_bpf filter on kernels without TCX (or with
/// `tc_attach = "netlink"`). Lower numbers run first. 1 is Cilium's (`--tc-filter-priority`
/// default, handle 1) and 0 asks the kernel to pick (49152 downwards), so 2 is the earliest
/// priority no common CNI takes by default: ipq judges a packet before any filter that could
/// redirect it away (a redirect ends classification), and it never shares a filter chain
/// (`tcf_proto`) with another tool, whose deletion of "its" priority would remove ipq's filter.
/// A filter at priority 1 (Cilium's legacy tc mode) still runs before ipq: see docs/kernels.md.
pub const TC_FILTER_PRIORITY: u16 = 2;

/// Handle of ipq's cls_bpf filter at `TC_FILTER_PRIORITY`: 0x4951 is "IQ" in ASCII, far from
/// the small handles tools number from 1. With the priority it names ipq's filter on a hook:
/// `tc filter show dev IF ingress pref 2 handle 0x4951 bpf` lists it and nothing else. ipq
/// replaces or deletes a filter there only when it is a cls_bpf filter running an `ipq_`
/// program; anything else at that place is reported as a conflict and left alone.
pub const TC_FILTER_HANDLE: u32 = 0x4951;
