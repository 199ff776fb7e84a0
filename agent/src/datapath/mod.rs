//! The kernel datapath: loading the embedded object with maps pinned under `bpffs_dir`,
//! attaching its programs to workload interfaces and uplinks, and the typed maps.

pub mod attach;
mod bpf_call;
pub mod held_pins;
pub mod lock;
pub mod maps;
mod object;
mod port;
mod slots;
mod table;
pub mod verify;

use std::{
    ffi::CString,
    fs, io,
    net::IpAddr,
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, MapError},
    pin::PinError,
    programs::{links::LinkError, ProgramError, SchedClassifier, Xdp},
    Ebpf, EbpfError, EbpfLoader,
};
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    config::{DatapathConfig, Mode, DEFAULT_SAMPLE_INTERVAL_NS},
    counters::Counter,
    filter::{filter_words, valid_filter_words, FILTER_MASK_GLOBAL},
    iface::IfaceEntry,
    names,
    sample::ConflictSample,
    slots::{
        buckets_of_entries, slot_buckets, slot_entries, AddrSlot, SlotsMeta, BPF_F_MMAPABLE,
        SLOTS_MAGIC, SLOTS_MASK_GLOBAL, SLOTS_SEED_GLOBAL, SLOT_WAYS,
    },
};
use log::{info, warn};

use self::attach::{probe::KernelFeatures, Attacher, JobReport, TcMode};
use crate::config::TcAttach;
use thiserror::Error;

pub use attach::Attached;
pub use maps::{ConfigCell, Counters, Samples};
pub use object::OBJECT;
pub use port::{AddrTable, DatapathPort, MemDatapath, MemTable};
use slots::SlotTable;
pub use table::{fast_path_eligible, AddressTable};

use crate::paths::{AttachPoint, PinLayout, BPFFS_MOUNT};

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
    Dir(#[from] crate::safe_fs::DirError),
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

/// What a loaded datapath needs from the configuration.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub bpffs_dir: PathBuf,
    pub capacity: u32,
    pub mode: Mode,
}

/// What [`DatapathMaps::read_pinned`] read.
pub struct PinnedReading {
    pub entries: Vec<(AddrKey, AddrEntry)>,
    pub counters: Vec<Counter>,
}

/// The maps of a datapath, whether just loaded or opened from pins.
pub struct DatapathMaps {
    pub table: AddressTable,
    pub counters: Counters,
    pub config: ConfigCell,
}

impl DatapathMaps {
    /// `seed`: the seed of `IPQ_SLOTS` the programs were just loaded with; `None` for a
    /// table an agent already set up.
    fn open(mut source: maps::Source, seed: Option<u64>) -> Result<Self, DatapathError> {
        let addrs = maps::AddrMap::open(&mut source)?;
        let copy = SlotTable::open(maps::slots_map(&mut source)?, seed)?;
        let slots = maps::IfaceSlots::open(&mut source)?;
        let filter = maps::QuarantineFilter::open(&mut source)?;
        Ok(Self {
            table: AddressTable::open(addrs, copy, slots, filter)?,
            counters: Counters::open(&mut source)?,
            config: ConfigCell::open(&mut source)?,
        })
    }

    /// Opens the maps a running (or stopped) agent pinned under `bpffs_dir`, for tools that
    /// inspect or repair the datapath without loading programs.
    pub fn open_pinned(bpffs_dir: &Path) -> Result<Self, DatapathError> {
        // Stamps written here must be on the clock the loaded programs use.
        match attach::probe::coarse_clock() {
            Ok(coarse) => crate::netdev::use_coarse_clock(coarse),
            Err(e) => warn!("probing the kernel's clock helper: {e}; assuming the coarse clock"),
        }
        let layout = PinLayout::new(bpffs_dir);
        Self::open(maps::Source::Pinned(&layout), None)
    }

    pub fn counters(&self) -> Result<Vec<Counter>, DatapathError> {
        self.counters.read()
    }

    /// What the pinned maps under `bpffs_dir` hold, read without writing anything: every
    /// `IPQ_ADDRS` entry (the truth the accelerators are derived from) and the counters. For
    /// `ipq-agent datapath show` and the tests, beside a running agent, which is the maps' one
    /// writer: opening the table would set its copy and slots again.
    pub fn read_pinned(bpffs_dir: &Path) -> Result<PinnedReading, DatapathError> {
        let layout = PinLayout::new(bpffs_dir);
        let mut source = maps::Source::Pinned(&layout);
        let addrs = maps::AddrMap::open(&mut source)?;
        let counters = Counters::open(&mut source)?;
        Ok(PinnedReading {
            entries: addrs.entries()?,
            counters: counters.read()?,
        })
    }

    pub fn set_mode(&mut self, mode: Mode) -> Result<(), DatapathError> {
        let mut config = self.config.get()?;
        config.mode = mode as u32;
        if config.sample_interval_ns == 0 {
            config.sample_interval_ns = DEFAULT_SAMPLE_INTERVAL_NS;
        }
        self.config.set(&config)
    }
}

/// A loaded datapath: the programs, the maps, and the attachments this agent made.
pub struct Datapath {
    /// This agent is the one writer of the maps under `bpffs_dir` for as long as it runs.
    _lock: lock::BpffsLock,
    ebpf: Ebpf,
    layout: PinLayout,
    pub maps: DatapathMaps,
    samples: Option<Samples>,
    logger: Option<KernelLogger>,
    capacity: u32,
    features: KernelFeatures,
}

/// Sizes of the maps the object is loaded with.
struct Sizes {
    capacity: u32,
    filter_words: u32,
    slot_buckets: u32,
    /// The seed of a pinned `IPQ_SLOTS` that an agent set up; `None` when there is none yet.
    slot_seed: Option<u64>,
}

/// Key and value sizes every pinned map must have, from the shared types.
fn expected_layout(name: &str) -> Option<(u32, u32)> {
    use core::mem::size_of;
    let sizes = match name {
        names::MAP_ADDRS => (size_of::<AddrKey>(), size_of::<AddrEntry>()),
        names::MAP_SLOTS => (size_of::<u32>(), size_of::<AddrSlot>()),
        names::MAP_IFACES => (size_of::<u32>(), size_of::<IfaceEntry>()),
        names::MAP_QFILTER => (size_of::<u32>(), size_of::<u64>()),
        names::MAP_COUNTERS => (size_of::<u32>(), size_of::<Counter>()),
        names::MAP_CONFIG => (size_of::<u32>(), size_of::<DatapathConfig>()),
        _ => return None,
    };
    Some((sizes.0 as u32, sizes.1 as u32))
}

/// Checks that `path` lies on a bpf filesystem.
fn check_bpffs(path: &Path) -> Result<(), DatapathError> {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    let mut probe = path.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    let c_path = CString::new(probe.as_os_str().as_encoded_bytes()).map_err(|_| {
        DatapathError::NotBpffs {
            path: path.to_owned(),
        }
    })?;
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a zeroed out-parameter of the right type.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 || stat.f_type as i64 != BPF_FS_MAGIC {
        return Err(DatapathError::NotBpffs {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// Creates or checks a directory of pins: owned by the agent's user and writable by nobody
/// else, who could otherwise unlink the link pins and so detach enforcement.
fn create_dir(path: &Path) -> Result<(), DatapathError> {
    Ok(crate::safe_fs::ensure_dir(
        path,
        crate::safe_fs::DirAccess::Traversable,
    )?)
}

impl Datapath {
    /// Loads the embedded object. Maps already pinned by an earlier agent are re-used with
    /// their contents; missing ones are created and pinned.
    pub fn load(options: &LoadOptions) -> Result<Self, DatapathError> {
        let layout = PinLayout::new(&options.bpffs_dir);
        check_bpffs(layout.root())?;
        create_dir(layout.root())?;
        // Before any map is opened: a second agent on the same maps is refused here.
        let lock = lock::acquire(layout.root())?;
        create_dir(&layout.maps_dir())?;
        create_dir(&layout.links_dir())?;
        create_dir(&layout.programs_dir())?;
        let Sizes {
            capacity,
            filter_words,
            slot_buckets,
            slot_seed,
        } = Self::check_pins(&layout, options.capacity)?;
        // A new table gets a random seed: nobody choosing addresses can aim them at one bucket.
        let slot_seed = match slot_seed {
            Some(seed) => seed,
            None => random_seed()?,
        };
        let slot_mask = slot_buckets - 1;
        maps::blind_legacy_filter(&layout)?;
        let features = attach::probe::features().map_err(DatapathError::Probe)?;
        // The programs stamp with the coarse clock only where the helper exists; user space
        // reads the same clock from here on.
        let coarse_clock = u32::from(features.coarse_clock);
        crate::netdev::use_coarse_clock(features.coarse_clock);

        let log_level = kernel_log_level();
        let filter_mask = filter_words - 1;
        let mut loader = EbpfLoader::new();
        loader
            .default_map_pin_directory(layout.maps_dir())
            .map_max_entries(names::MAP_ADDRS, capacity)
            .override_global(names::GLOBAL_COARSE_CLOCK, &coarse_clock, true)
            .map_max_entries(names::MAP_QFILTER, filter_words)
            // The program masks filter indices with this; it must match the map's real size.
            .override_global(FILTER_MASK_GLOBAL, &filter_mask, true)
            .map_max_entries(names::MAP_SLOTS, slot_entries(slot_buckets))
            // The programs find addresses with these: they must be the table's own.
            .override_global(SLOTS_MASK_GLOBAL, &slot_mask, true)
            .override_global(SLOTS_SEED_GLOBAL, &slot_seed, true)
            // The kernel skips log records the agent's logger would discard anyway.
            .override_global("AYA_LOG_LEVEL", &log_level, false);
        let mut ebpf = loader
            .load(OBJECT)
            .map_err(|e| DatapathError::Load(Box::new(e)))?;

        for name in [names::PROG_TC_INGRESS, names::PROG_TC_EGRESS] {
            let prog: &mut SchedClassifier = program(&mut ebpf, name)?;
            prog.load()
                .map_err(|source| DatapathError::Program { name, source })?;
            pin_program(|path| prog.pin(path), &layout, name)?;
        }
        let xdp: &mut Xdp = program(&mut ebpf, names::PROG_XDP_UPLINK)?;
        xdp.load().map_err(|source| DatapathError::Program {
            name: names::PROG_XDP_UPLINK,
            source,
        })?;
        pin_program(|path| xdp.pin(path), &layout, names::PROG_XDP_UPLINK)?;

        // Every map and program pin is held from here on: removing one detaches nothing.
        for dir in [layout.maps_dir(), layout.programs_dir()] {
            held_pins::hold_dir(&dir).map_err(|source| DatapathError::Io { path: dir, source })?;
        }
        let samples = Samples::open(&mut maps::Source::Loaded(&mut ebpf))?;
        let logger = aya_log::EbpfLogger::init(&mut ebpf)
            .map_err(|e| warn!("kernel-side log records will not be read: {e}"))
            .ok();
        // Sets a new table up with the seed before anything can attach the programs.
        let mut maps = DatapathMaps::open(maps::Source::Loaded(&mut ebpf), Some(slot_seed))?;
        maps.set_mode(options.mode)?;
        info!(
            "datapath loaded: {} addresses in pinned maps under {}; kernel has TCX: {}, clock: {}",
            maps.table.len(),
            layout.root().display(),
            features.tcx,
            if features.coarse_clock {
                "CLOCK_MONOTONIC_COARSE (bpf_ktime_get_coarse_ns)"
            } else {
                "CLOCK_MONOTONIC (bpf_ktime_get_ns)"
            }
        );
        Ok(Self {
            _lock: lock,
            ebpf,
            layout,
            maps,
            samples: Some(samples),
            logger,
            capacity,
            features,
        })
    }

    /// Verifies pins left by an earlier agent before the loader trusts them, and returns the
    /// sizes to load with: an existing address map keeps its size (and its contents), and an
    /// existing filter keeps its size, so the size the programs are loaded with is always the
    /// size of the map they will read, whatever the configured capacity became.
    fn check_pins(layout: &PinLayout, capacity: u32) -> Result<Sizes, DatapathError> {
        let mut effective = capacity;
        let mut pinned_filter_words = None;
        let mut pinned_slots = None;
        for name in names::PINNED_MAPS {
            let path = layout.map(name);
            if !path.exists() {
                continue;
            }
            let data = MapData::from_pin(&path).map_err(|source| DatapathError::OpenPin {
                path: path.clone(),
                source,
            })?;
            let map_info = data
                .info()
                .map_err(|source| DatapathError::Map { name, source })?;
            if let Some((key, value)) = expected_layout(name) {
                for (what, pinned, needed) in [
                    ("key size", map_info.key_size(), key),
                    ("value size", map_info.value_size(), value),
                ] {
                    if pinned != needed {
                        return Err(DatapathError::IncompatiblePin {
                            path,
                            what,
                            pinned,
                            needed,
                        });
                    }
                }
            }
            if name == names::MAP_ADDRS && map_info.max_entries() != capacity {
                log::warn!(
                    "capacity is {capacity} but the pinned address map holds {}: keeping the \
                     pinned map and its entries; to resize, drain the node and remove {}",
                    map_info.max_entries(),
                    path.display()
                );
                effective = map_info.max_entries();
            }
            if name == names::MAP_SLOTS {
                let entries = map_info.max_entries();
                let buckets = buckets_of_entries(entries).ok_or(DatapathError::SlotsLayout {
                    what: "elements",
                    found: entries,
                })?;
                if map_info.map_flags() & BPF_F_MMAPABLE == 0 {
                    return Err(DatapathError::SlotsLayout {
                        what: "flags",
                        found: map_info.map_flags(),
                    });
                }
                pinned_slots = Some((buckets, pinned_slot_seed(data, buckets)?));
            }
            if name == names::MAP_QFILTER {
                let words = map_info.max_entries();
                if !valid_filter_words(words) {
                    return Err(DatapathError::IncompatiblePin {
                        path,
                        what: "filter words",
                        pinned: words,
                        needed: filter_words(capacity),
                    });
                }
                pinned_filter_words = Some(words);
            }
        }
        let filter_words = match pinned_filter_words {
            Some(words) => {
                if words != filter_words(effective) {
                    log::warn!(
                        "the pinned quarantine filter has {words} words, {} would fit capacity                          {effective}: keeping the pinned one (false positives cost lookups only)",
                        filter_words(effective)
                    );
                }
                words
            }
            None => filter_words(effective),
        };
        let (slot_buckets, slot_seed) = match pinned_slots {
            Some((buckets, seed)) => {
                if buckets != slot_buckets(effective) {
                    log::warn!(
                        "the pinned address table has {buckets} buckets, {} would fit capacity \
                         {effective}: keeping the pinned one",
                        slot_buckets(effective)
                    );
                }
                (buckets, seed)
            }
            None => (slot_buckets(effective), None),
        };
        Ok(Sizes {
            capacity: effective,
            filter_words,
            slot_buckets,
            slot_seed,
        })
    }

    pub fn layout(&self) -> &PinLayout {
        &self.layout
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The conflict-sample ring buffer, handed out once to its reader.
    pub fn take_samples(&mut self) -> Option<Samples> {
        self.samples.take()
    }

    /// The reader of the kernel programs' aya-log records, handed out once.
    pub fn take_logger(&mut self) -> Option<KernelLogger> {
        self.logger.take()
    }

    /// What the kernel probes found at load.
    pub fn features(&self) -> KernelFeatures {
        self.features
    }

    /// The TC attach mode `tc_attach` asks for on this kernel.
    pub fn tc_mode(&self, tc_attach: TcAttach) -> Result<TcMode, DatapathError> {
        match (tc_attach, self.features.tcx) {
            (TcAttach::Auto, true) => Ok(TcMode::NetlinkThenTcx),
            (TcAttach::Tcx, true) => Ok(TcMode::Tcx),
            (TcAttach::Tcx, false) => Err(DatapathError::NoTcx),
            (TcAttach::Auto, false) | (TcAttach::Netlink, _) => Ok(TcMode::Netlink),
        }
    }

    /// Starts the attach workers (see [`attach`]); their reports arrive on the receiver.
    pub fn start_attacher(
        &self,
        mode: TcMode,
    ) -> Result<(Attacher, tokio::sync::mpsc::UnboundedReceiver<JobReport>), DatapathError> {
        Attacher::start(self.layout.clone(), mode)
    }

    /// A program of the loaded object, by name: tests and benchmarks run programs through
    /// `BPF_PROG_TEST_RUN`, including the empty floor programs the agent never attaches.
    pub fn program_mut(&mut self, name: &str) -> Option<&mut aya::programs::Program> {
        self.ebpf.program_mut(name)
    }
}

/// Reader of the kernel programs' log records (aya-log), which it forwards to `log`.
pub type KernelLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// The seed a pinned `IPQ_SLOTS` of `buckets` was set up with, if an agent set it up.
fn pinned_slot_seed(data: MapData, buckets: u32) -> Result<Option<u64>, DatapathError> {
    let name = names::MAP_SLOTS;
    let table: aya::maps::Array<MapData, SlotsMeta> =
        aya::maps::Array::try_from(aya::maps::Map::Array(data))
            .map_err(|source| DatapathError::Map { name, source })?;
    let meta = table
        .get(&(buckets * SLOT_WAYS), 0)
        .map_err(|source| DatapathError::Map { name, source })?;
    Ok((meta.magic == SLOTS_MAGIC && meta.buckets == buckets).then_some(meta.seed))
}

/// 64 random bits from the kernel.
fn random_seed() -> Result<u64, DatapathError> {
    let mut seed = [0u8; 8];
    // SAFETY: writes at most 8 bytes into the buffer.
    let n = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
    if n != seed.len() as isize {
        return Err(DatapathError::Io {
            path: PathBuf::from("getrandom(2)"),
            source: io::Error::last_os_error(),
        });
    }
    Ok(u64::from_ne_bytes(seed))
}

/// The aya-log level (`aya_log_common::Level`: 1 error ... 5 trace) matching the agent's own.
fn kernel_log_level() -> u8 {
    match log::max_level() {
        log::LevelFilter::Off => 0,
        log::LevelFilter::Error => 1,
        log::LevelFilter::Warn => 2,
        log::LevelFilter::Info => 3,
        log::LevelFilter::Debug => 4,
        log::LevelFilter::Trace => 5,
    }
}

/// Pins a loaded program at `<bpffs_dir>/progs/<name>` for the attach workers, in place of
/// the pin of an earlier agent (whose program stays alive while a link or filter runs it).
fn pin_program(
    pin: impl FnOnce(&Path) -> Result<(), PinError>,
    layout: &PinLayout,
    name: &'static str,
) -> Result<(), DatapathError> {
    let path = layout.program(name);
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(DatapathError::Io { path, source }),
    }
    pin(&path).map_err(|source| DatapathError::Pin { path, source })
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, DatapathError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(DatapathError::MissingProgram { name })?
        .try_into()
        .map_err(|source| DatapathError::Program { name, source })
}

/// Decodes one ring-buffer record into a sample, refusing records of the wrong size.
pub fn decode_sample(bytes: &[u8]) -> Option<ConflictSample> {
    if bytes.len() != std::mem::size_of::<ConflictSample>() {
        return None;
    }
    // SAFETY: the length is checked; ConflictSample is Pod (valid for any bytes).
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<ConflictSample>()) })
}
