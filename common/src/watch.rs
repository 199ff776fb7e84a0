//! `bpf()` calls by other processes that can change what ipq enforces with, as the watcher
//! programs report them through the `IPQ_BPF_CALLS` ring buffer: BPF trampolines (fentry) on
//! the kernel's own bpf() path where the kernel has them ([`WatchMode::Trampolines`]), else a
//! raw tracepoint on `sys_enter` that leaves every system call but `bpf()` (x86-64 only,
//! [`WatchMode::RawTracepoint`]).
//!
//! Nothing in the kernel announces a TCX or XDP link detached, a program attached ahead of
//! ipq's, or a write to a map: the watcher reports the commands that do those, with the
//! caller's process, and the agent verifies at once what they may have changed instead of at
//! its next periodic pass. The agent's own calls are not reported.

/// `enum bpf_cmd` values (linux/bpf.h, stable ABI) of the commands the watcher reports.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, strum::FromRepr)]
#[cfg_attr(
    feature = "names",
    derive(strum::IntoStaticStr),
    strum(serialize_all = "SCREAMING_SNAKE_CASE")
)]
pub enum BpfCmd {
    MapUpdateElem = 2,
    MapDeleteElem = 3,
    /// Opening a pinned object by its path: reported with the path, so that the agent knows
    /// who opened one of ipq's maps.
    ObjGet = 7,
    ProgAttach = 8,
    ProgDetach = 9,
    /// Opening a map by its id: reported with the id.
    MapGetFdById = 14,
    MapUpdateBatch = 26,
    MapDeleteBatch = 27,
    LinkCreate = 28,
    LinkUpdate = 29,
    LinkDetach = 34,
    /// Not a command: a memory mapping of one of ipq's maps made (`bpf_map_mmap`, trampolines
    /// only); reported with the kernel's count of the map's writable mappings before it.
    MapMmap = 0x1000,
    /// Not a command: a new descriptor of one of ipq's maps (`security_bpf_map`, trampolines
    /// only), by whatever path, id or link the caller named it.
    MapOpen = 0x1001,
}

impl BpfCmd {
    /// Whether the watcher reports `cmd`.
    #[inline(always)]
    pub const fn watched(cmd: u32) -> bool {
        matches!(cmd, 2 | 3 | 7 | 8 | 9 | 14 | 26 | 27 | 28 | 29 | 34)
    }

    /// Whether `cmd` writes a map: reported only for the processes the agent put in
    /// `IPQ_WATCHED` (those that opened one of its maps), since other tools' map writes are
    /// many and none of ipq's business.
    #[inline(always)]
    pub const fn writes_map(cmd: u32) -> bool {
        matches!(cmd, 2 | 3 | 26 | 27)
    }
}

/// One reported call.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BpfCall {
    /// A [`BpfCmd`] discriminant.
    pub cmd: u32,
    /// The calling process (thread group id).
    pub tgid: u32,
    /// `BPF_LINK_CREATE`'s and `BPF_PROG_ATTACH`'s target (an ifindex for TCX and XDP),
    /// `BPF_MAP_GET_FD_BY_ID`'s map id; for `BPF_MAP_UPDATE_ELEM` and `BPF_MAP_DELETE_ELEM`, how
    /// many bytes of the key are in `path` ([`WATCH_KEY_BYTES`], 4, or 0 where none could be
    /// read); for [`BpfCmd::MapMmap`], the writable mappings of the map the kernel counted
    /// before this one; 0 for the other commands, whose attribute names only the caller's
    /// descriptors.
    pub target: u32,
    /// The map opened, written or mapped, by its id, where the trampolines report it (they
    /// see the kernel's `struct bpf_map`); 0 where the watcher could not tell (the raw
    /// tracepoint sees only the caller's descriptor).
    pub map_id: u32,
    /// `BPF_OBJ_GET`'s path, NUL-terminated (cut at [`WATCH_PATH_BYTES`] - 1 bytes); the key
    /// of a map update or delete, in its first `target` bytes; for [`BpfCmd::MapMmap`], one
    /// byte: 1 if the agent itself made the mapping; zero for the other commands.
    pub path: [u8; WATCH_PATH_BYTES],
}
crate::assert_layout!(BpfCall, size = 128, align = 4);
crate::assert_offsets!(BpfCall {
    cmd: 0,
    tgid: 4,
    target: 8,
    map_id: 12,
    path: 16,
});

/// Bytes of a reported `BPF_OBJ_GET` path, its NUL included.
pub const WATCH_PATH_BYTES: usize = 112;

/// Bytes of a map write's key the watcher reports: an `IPQ_ADDRS` key (an address); the
/// agent reads the first 4 as an index of `IPQ_SLOTS` or `IPQ_IFACES` too.
pub const WATCH_KEY_BYTES: usize = 16;

impl Default for BpfCall {
    fn default() -> Self {
        Self {
            cmd: 0,
            tgid: 0,
            target: 0,
            map_id: 0,
            path: [0; WATCH_PATH_BYTES],
        }
    }
}

/// Processes whose map writes the watcher reports, at most (an LRU map the agent writes).
pub const WATCHED_TGIDS: u32 = 256;

/// The watcher's programs and maps (not pinned: they watch for the agent that loaded them).
/// The raw tracepoint, the fallback:
pub const PROG_WATCH_BPF: &str = "ipq_watch_bpf";
/// The trampolines, each on the kernel function of the same name after `ipq_watch_`.
pub const PROG_WATCH_SECURITY_BPF: &str = "ipq_watch_security_bpf";
pub const PROG_WATCH_MAP_OPEN: &str = "ipq_watch_security_bpf_map";
pub const PROG_WATCH_MAP_UPDATE: &str = "ipq_watch_bpf_map_update_value";
/// Where the kernel's BTF has no `bpf_map_update_value` (inlined into its callers, as in
/// Debian's 6.1), map updates are seen one level down, at the update functions of the map
/// types ipq's maps are (hash and array; its per-CPU counters are not enforcement state).
pub const PROG_WATCH_HTAB_UPDATE: &str = "ipq_watch_htab_map_update_elem";
pub const PROG_WATCH_ARRAY_UPDATE: &str = "ipq_watch_array_map_update_elem";
pub const PROG_WATCH_HTAB_DELETE: &str = "ipq_watch_htab_map_delete_elem";
pub const PROG_WATCH_HTAB_LOOKUP_DELETE: &str = "ipq_watch_htab_map_lookup_and_delete_elem";
pub const PROG_WATCH_HTAB_LOOKUP_DELETE_BATCH: &str = "ipq_watch_htab_map_lookup_and_delete_batch";
pub const PROG_WATCH_MAP_MMAP: &str = "ipq_watch_bpf_map_mmap";

/// The trampolines the agent attaches, each with the kernel function it attaches to and
/// whether the watcher is whole without it (`false`: all of these attach, or the trampolines
/// are not used at all). Map updates are seen by one of [`UPDATE_HOOKS`]' sets besides.
pub const TRAMPOLINES: [(&str, &str, bool); 6] = [
    (PROG_WATCH_SECURITY_BPF, "security_bpf", false),
    (PROG_WATCH_MAP_OPEN, "security_bpf_map", false),
    (PROG_WATCH_HTAB_DELETE, "htab_map_delete_elem", false),
    (PROG_WATCH_MAP_MMAP, "bpf_map_mmap", false),
    // Linux 5.14+ (BPF_MAP_LOOKUP_AND_DELETE_ELEM of a hash map): where it does not exist,
    // neither does the command.
    (
        PROG_WATCH_HTAB_LOOKUP_DELETE,
        "htab_map_lookup_and_delete_elem",
        true,
    ),
    (
        PROG_WATCH_HTAB_LOOKUP_DELETE_BATCH,
        "htab_map_lookup_and_delete_batch",
        true,
    ),
];

/// Where the trampolines see map updates.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UpdateHook {
    /// `bpf_map_update_value`: bpf()'s own path (single and batch updates); nothing else pays.
    SyscallPath = 0,
    /// The hash and array maps' update functions, where the kernel's BTF has no
    /// `bpf_map_update_value`: they also run for BPF programs' `bpf_map_update_elem` on maps of
    /// those types, which then pay a trampoline and a compare.
    MapOps = 1,
}

/// The trampolines of each [`UpdateHook`], as [`TRAMPOLINES`] lists them.
pub const UPDATE_HOOKS: [(UpdateHook, &[(&str, &str)]); 2] = [
    (
        UpdateHook::SyscallPath,
        &[(PROG_WATCH_MAP_UPDATE, "bpf_map_update_value")],
    ),
    (
        UpdateHook::MapOps,
        &[
            (PROG_WATCH_HTAB_UPDATE, "htab_map_update_elem"),
            (PROG_WATCH_ARRAY_UPDATE, "array_map_update_elem"),
        ],
    ),
];

pub const MAP_BPF_CALLS: &str = "IPQ_BPF_CALLS";
pub const MAP_WATCHED: &str = "IPQ_WATCHED";
/// The ids of ipq's pinned maps, which the trampolines report writes of (written by the
/// agent before it attaches them).
pub const MAP_WATCHED_MAPS: &str = "IPQ_WATCHED_MAPS";
/// Entries of [`MAP_WATCHED_MAPS`]; 0 is no map.
pub const WATCHED_MAPS: u32 = 8;
// Every pinned map is watched: one more needs room here (and in the program's array).
const _: () = assert!(crate::names::PINNED_MAPS.len() <= WATCHED_MAPS as usize);
// A write of IPQ_PROBES could fake a co-tenant probe's count: the watcher must watch it.
const _: () = assert!(listed(&crate::names::PINNED_MAPS, crate::names::MAP_PROBES));

/// Whether `name` is one of `names` (a `const` comparison, byte by byte).
const fn listed(names: &[&str], name: &str) -> bool {
    let mut i = 0;
    while i < names.len() {
        let (a, b) = (names[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return true;
            }
        }
        i += 1;
    }
    false
}
/// Per CPU, the calls the watcher could not report because its ring was full.
pub const MAP_BPF_CALLS_LOST: &str = "IPQ_BPF_CALLS_LOST";
/// The raw tracepoint the watcher is attached to: every system call's entry (x86-64 only:
/// the program reads x86-64's system call number and registers).
pub const WATCHED_TRACEPOINT: &str = "sys_enter";

/// The `.rodata` globals the loader sets so that the agent's own calls are not reported, in
/// whatever PID namespace it runs: its process id in its own PID namespace, and that
/// namespace's device and inode (`stat /proc/self/ns/pid`; the device as the kernel's
/// `dev_t`, `MKDEV(major, minor)`), which `bpf_get_ns_current_pid_tgid` translates the
/// caller's id into. A caller in another PID namespace is someone else.
pub const GLOBAL_WATCH_TGID: &str = "IPQ_WATCH_TGID";
pub const GLOBAL_WATCH_PIDNS_DEV: &str = "IPQ_WATCH_PIDNS_DEV";
pub const GLOBAL_WATCH_PIDNS_INO: &str = "IPQ_WATCH_PIDNS_INO";

/// The `.rodata` globals of the offsets in the kernel's `struct bpf_map` of its `id` (u32)
/// and `writecnt` (atomic64_t), and in `struct file` of `private_data` (the map of a map's
/// file), as the kernel's BTF says, set by the loader for the trampolines.
pub const GLOBAL_MAP_ID_OFFSET: &str = "IPQ_MAP_ID_OFFSET";
pub const GLOBAL_MAP_WRITECNT_OFFSET: &str = "IPQ_MAP_WRITECNT_OFFSET";
pub const GLOBAL_FILE_PRIVATE_DATA_OFFSET: &str = "IPQ_FILE_PRIVATE_DATA_OFFSET";

/// The `.rodata` global of the trampoline context's slot (a u64 each) that holds
/// `bpf_map_update_value`'s `key`: 2 where its second parameter is `struct file *` (recent
/// kernels), 3 where it is `struct fd` passed by value, two slots (older ones), as its BTF
/// says. The program reads one of these two; the loader refuses the trampoline otherwise.
pub const GLOBAL_UPDATE_KEY_SLOT: &str = "IPQ_UPDATE_KEY_SLOT";
/// The slots [`GLOBAL_UPDATE_KEY_SLOT`] may hold.
pub const UPDATE_KEY_SLOTS: [u32; 2] = [2, 3];

/// Which watcher reports other processes' bpf() calls.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[cfg_attr(
    feature = "names",
    derive(strum::IntoStaticStr, strum::VariantArray),
    strum(serialize_all = "snake_case")
)]
pub enum WatchMode {
    /// fentry trampolines on the kernel's bpf() path: other system calls pay nothing; every
    /// command (compat included) and every write of ipq's maps, by any descriptor.
    Trampolines,
    /// A raw tracepoint on `sys_enter` (x86-64): every system call of the node pays for it.
    RawTracepoint,
    /// Neither attached: the periodic verification alone.
    None,
}

/// Size of the `IPQ_BPF_CALLS` ring buffer in bytes (a power-of-two number of pages).
pub const BPF_CALLS_RING_BYTES: u32 = 64 * 1024;
