//! Everything loading, opening or writing the datapath can fail with, each naming the pin,
//! map or program.

use std::{io, net::IpAddr, path::PathBuf};

use aya::{
    maps::MapError,
    pin::PinError,
    programs::{links::LinkError, ProgramError},
    EbpfError,
};
use ipq_common::names;
use thiserror::Error;

use super::lock;
use crate::paths::{AttachPoint, BPFFS_MOUNT};

#[derive(Debug, Error)]
pub enum DatapathError {
    #[error(
        "{path} is not on a bpf filesystem: mount one with `mount -t bpf bpf {BPFFS_MOUNT}` \
         (`cargo xtask setup` does) or set bpffs_dir below a bpffs mount"
    )]
    NotBpffs { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Locked(#[from] lock::LockError),
    #[error("bpffs_dir: {0}")]
    Dir(#[from] ipq_fs::safe_fs::DirError),
    #[error(
        "pinned map {path} does not fit this agent ({what}: pinned {pinned}, needed {needed}); \
         it was made by an incompatible ipq version: drain the node, remove {path} and restart"
    )]
    IncompatiblePin {
        path: PathBuf,
        what: &'static str,
        pinned: u32,
        needed: u32,
    },
    #[error("loading the eBPF object failed: {0}")]
    Load(#[source] Box<EbpfError>),
    #[error("program {name} is missing from the eBPF object")]
    MissingProgram { name: &'static str },
    #[error("map {name} is missing from the eBPF object")]
    MissingMap { name: &'static str },
    #[error(
        "the bpf() watcher's raw tracepoint reads x86-64's system call registers: not on this \
         architecture"
    )]
    WatcherArch,
    #[error("neither of the bpf() watchers: trampolines: {trampolines}; raw tracepoint: {raw_tracepoint}")]
    Watcher {
        trampolines: String,
        raw_tracepoint: String,
    },
    #[error("ipq has {maps} pinned maps, the bpf() watcher room for {room}")]
    WatchedMaps { maps: usize, room: u32 },
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        source: ProgramError,
    },
    #[error("map {name}: {source}")]
    Map {
        name: &'static str,
        source: MapError,
    },
    #[error("map {name}: reading it in batches: {source}")]
    BatchRead {
        name: &'static str,
        source: io::Error,
    },
    #[error("opening pinned map {path}: {source} (is an ipq agent installed on this node?)")]
    OpenPin { path: PathBuf, source: MapError },
    #[error("attaching {point:?} to {ifname}: {source}")]
    Attach {
        ifname: String,
        point: AttachPoint,
        source: ProgramError,
    },
    #[error("pinned link {path}: {source}")]
    Link { path: PathBuf, source: LinkError },
    #[error("pinning link at {path}: {source}")]
    Pin { path: PathBuf, source: PinError },
    #[error("the address map is full: {addr} was not stored")]
    Full { addr: IpAddr },
    #[error(
        "the pinned table {} has {found} as its {what}, which this agent cannot read: drain \
         the node, remove the pin and restart",
        names::MAP_SLOTS
    )]
    SlotsLayout { what: &'static str, found: u32 },
    #[error("mapping map {name} into memory: {source}")]
    Mmap {
        name: &'static str,
        source: io::Error,
    },
    #[error(
        "the pinned table {} was set up with another seed than the programs were loaded with",
        names::MAP_SLOTS
    )]
    SlotsSeed,
    #[error(
        "the pinned table {} was never set up (its agent stopped while loading): start the agent",
        names::MAP_SLOTS
    )]
    SlotsNotSetUp,
    #[error("probing the kernel's BPF features: {0}")]
    Probe(#[source] io::Error),
    #[error(
        "tc_attach = \"tcx\" but this kernel has no TCX links (probed): use tc_attach = \"auto\" \
         or \"netlink\""
    )]
    NoTcx,
    #[error("starting the attach workers: {0}")]
    Workers(#[source] io::Error),
}
