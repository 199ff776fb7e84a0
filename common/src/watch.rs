//! `bpf()` calls by other processes that can change what ipq enforces with, as the watcher
//! program (a raw tracepoint on `sys_enter` that leaves every system call but `bpf()`) reports
//! them through the
//! `IPQ_BPF_CALLS` ring buffer.
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
    /// read); 0 for the other commands, whose attribute names only the caller's descriptors.
    pub target: u32,
    /// Reserved; zero.
    pub _reserved: u32,
    /// `BPF_OBJ_GET`'s path, NUL-terminated (cut at [`WATCH_PATH_BYTES`] - 1 bytes); the key
    /// of a map update or delete, in its first `target` bytes; zero for the other commands.
    pub path: [u8; WATCH_PATH_BYTES],
}
crate::assert_layout!(BpfCall, size = 128, align = 4);
crate::assert_offsets!(BpfCall {
    cmd: 0,
    tgid: 4,
    target: 8,
    _reserved: 12,
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
            _reserved: 0,
            path: [0; WATCH_PATH_BYTES],
        }
    }
}

/// Processes whose map writes the watcher reports, at most (an LRU map the agent writes).
pub const WATCHED_TGIDS: u32 = 256;

/// The watcher's program and maps (not pinned: they watch for the agent that loaded them).
pub const PROG_WATCH_BPF: &str = "ipq_watch_bpf";
pub const MAP_BPF_CALLS: &str = "IPQ_BPF_CALLS";
pub const MAP_WATCHED: &str = "IPQ_WATCHED";
/// Per CPU, the calls the watcher could not report because its ring was full.
pub const MAP_BPF_CALLS_LOST: &str = "IPQ_BPF_CALLS_LOST";
/// The raw tracepoint the watcher is attached to: every system call's entry (x86-64 only:
/// the program reads x86-64's system call number and registers).
pub const WATCHED_TRACEPOINT: &str = "sys_enter";

/// The `.rodata` global the loader sets to the agent's own process id: its calls are not
/// reported.
pub const GLOBAL_WATCH_TGID: &str = "IPQ_WATCH_TGID";

/// Size of the `IPQ_BPF_CALLS` ring buffer in bytes (a power-of-two number of pages).
pub const BPF_CALLS_RING_BYTES: u32 = 64 * 1024;
