//! The kernel datapath: loading the embedded object with maps pinned under `bpffs_dir`,
//! attaching its programs to workload interfaces and uplinks, and the typed maps.

pub mod attach;
mod batch_read;
mod bpf_call;
pub mod bpf_watch;
pub mod bpffs;
mod error;
pub mod held_pins;
pub mod intent;
pub mod kernel_btf;
pub mod lock;
pub mod map_check;
pub mod maps;
mod object;
#[cfg(test)]
mod object_check;
mod pin_check;
mod pinned_maps;
mod port;
mod slots;
pub(crate) mod strict;
mod table;
pub mod verify;

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    pin::PinError,
    programs::{ProgramError, SchedClassifier, Xdp},
    Ebpf, EbpfLoader,
};
use ipq_common::{
    config::Mode,
    filter::FILTER_MASK_GLOBAL,
    names,
    sample::ConflictSample,
    slots::{slot_entries, SlotsOrder, SLOTS_MASK_GLOBAL, SLOTS_ORDER_GLOBAL, SLOTS_SEED_GLOBAL},
    watch::{
        GLOBAL_FILE_PRIVATE_DATA_OFFSET, GLOBAL_MAP_ID_OFFSET, GLOBAL_MAP_WRITECNT_OFFSET,
        GLOBAL_UPDATE_KEY_SLOT, GLOBAL_WATCH_PIDNS_DEV, GLOBAL_WATCH_PIDNS_INO, GLOBAL_WATCH_TGID,
    },
};
use log::{info, warn};

use self::attach::{probe::KernelFeatures, Attacher, JobReport, TcMode, WorkerPool};
use crate::config::{BpfWatcher, TcAttach};

pub use attach::Attached;
pub use error::DatapathError;
pub use maps::{ConfigCell, Counters, Samples};
pub use object::OBJECT;
pub use pinned_maps::{DatapathMaps, PinnedReading};
pub use port::{AddrTable, DatapathPort, MemDatapath, MemTable};
pub use table::{fast_path_eligible, AddressTable, MapDrift, MapsCheck};

use crate::paths::PinLayout;

/// What a loaded datapath needs from the configuration.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub bpffs_dir: PathBuf,
    pub capacity: u32,
    pub mode: Mode,
    /// How the programs order their reads of `IPQ_SLOTS`; `None`: what this CPU and kernel need
    /// (`SlotsOrder::choose`). Tests and the benchmark run the other orders on this machine.
    pub slots_order: Option<SlotsOrder>,
    /// Which bpf() watcher may attach (`bpf_watcher`).
    pub bpf_watcher: BpfWatcher,
}

/// A loaded datapath: the programs, the maps, and the attachments this agent made.
pub struct Datapath {
    /// This agent is the one writer of the maps under `bpffs_dir` for as long as it runs.
    _lock: lock::BpffsLock,
    ebpf: Ebpf,
    layout: PinLayout,
    pub maps: DatapathMaps,
    samples: Option<Samples>,
    /// The watcher of other processes' bpf() calls, or why it is not attached.
    bpf_watch: Option<Result<bpf_watch::BpfWatch, String>>,
    logger: Option<KernelLogger>,
    capacity: u32,
    features: KernelFeatures,
}

/// `bpffs_dir`, checked and locked for this agent: taken before anything of the node's state is
/// read or moved, so that a second agent is refused before it touches any of it.
pub struct ClaimedDir {
    layout: PinLayout,
    lock: lock::BpffsLock,
}

impl ClaimedDir {
    pub fn claim(bpffs_dir: &std::path::Path) -> Result<Self, DatapathError> {
        let layout = PinLayout::new(bpffs_dir);
        bpffs::ensure(layout.root())?;
        pin_check::create_dir(layout.root())?;
        // Before any map is opened: a second agent on the same maps is refused here.
        let lock = lock::acquire(layout.root())?;
        Ok(Self { layout, lock })
    }
}

impl Datapath {
    /// Claims `bpffs_dir` and loads the embedded object into it (see [`Datapath::load_in`]).
    pub fn load(options: &LoadOptions) -> Result<Self, DatapathError> {
        Self::load_in(ClaimedDir::claim(&options.bpffs_dir)?, options)
    }

    /// Loads the embedded object into a claimed `bpffs_dir`. Maps already pinned by an earlier
    /// agent are re-used with their contents; missing ones are created and pinned.
    pub fn load_in(dir: ClaimedDir, options: &LoadOptions) -> Result<Self, DatapathError> {
        let ClaimedDir { layout, lock } = dir;
        pin_check::create_dir(&layout.maps_dir())?;
        pin_check::create_dir(&layout.links_dir())?;
        pin_check::create_dir(&layout.programs_dir())?;
        let pin_check::Sizes {
            capacity,
            filter_words,
            slot_buckets,
            slot_seed,
            addrs_preallocated,
        } = pin_check::check_pins(&layout, options.capacity)?;
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

        let slots_order = options.slots_order.unwrap_or(SlotsOrder::choose(
            cfg!(target_arch = "x86_64"),
            features.fetch_atomics,
        ));
        if slots_order == SlotsOrder::HashOnly && addrs_preallocated {
            // The map is kept for its entries (an upgrade must not forget a quarantine); what it
            // costs is the exactness of a verdict read while the agent rewrites addresses.
            warn!(
                "the pinned address map {} is preallocated (made by an earlier ipq): every \
                 verdict on this CPU and kernel reads it, and a packet judged while the agent \
                 rewrites addresses may get another address's verdict; drain the node and \
                 remove the pin so that this build makes one that is freed after a grace period",
                layout.map(names::MAP_ADDRS).display()
            );
        }
        let slots_order_global = slots_order as u32;
        let log_level = kernel_log_level();
        let filter_mask = filter_words - 1;
        // The watcher leaves out this process's own calls by its id in its own PID namespace,
        // whichever that is (in a pod: its own, where it is pid 1).
        let own = OwnPidNamespace::read()?;
        // The trampolines read the kernel's structures at the offsets its BTF gives; without
        // them, the raw tracepoint is the watcher.
        let offsets =
            kernel_btf::WatchOffsets::from_file(std::path::Path::new(kernel_btf::VMLINUX_BTF));
        let (trampolines, offsets) = match offsets {
            Ok(offsets) => (Ok(offsets.update_hook), offsets),
            Err(e) => (
                Err(e.to_string()),
                kernel_btf::WatchOffsets {
                    map_id: 0,
                    map_writecnt: 0,
                    file_private_data: 0,
                    update_hook: ipq_common::watch::UpdateHook::SyscallPath,
                    update_key_slot: 2,
                },
            ),
        };
        // Every load of the object is configured alike: the spare TC programs below must
        // run on the same maps with the same globals as the first.
        let configured = || {
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
                // How the programs order their reads of the table on this CPU and kernel.
                .override_global(SLOTS_ORDER_GLOBAL, &slots_order_global, true)
                // The kernel skips log records the agent's logger would discard anyway.
                .override_global("AYA_LOG_LEVEL", &log_level, false)
                // The watcher reports every process's bpf() calls but this one's.
                .override_global(GLOBAL_WATCH_TGID, &own.pid, true)
                .override_global(GLOBAL_WATCH_PIDNS_DEV, &own.dev, true)
                .override_global(GLOBAL_WATCH_PIDNS_INO, &own.ino, true)
                .override_global(GLOBAL_MAP_ID_OFFSET, &offsets.map_id, true)
                .override_global(GLOBAL_MAP_WRITECNT_OFFSET, &offsets.map_writecnt, true)
                .override_global(
                    GLOBAL_FILE_PRIVATE_DATA_OFFSET,
                    &offsets.file_private_data,
                    true,
                )
                .override_global(GLOBAL_UPDATE_KEY_SLOT, &offsets.update_key_slot, true);
            loader
        };
        let mut ebpf = configured()
            .load(object::for_order(slots_order))
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
        // A second instance of each TC program, on the same pinned maps: a TCX hook takes a
        // program once, so moving ipq's link ahead of a co-tenant without a gap attaches the
        // other instance first and only then detaches the old link (attach::pins). Only where
        // the kernel has TCX; without them a move has a gap, as before (said, not fatal).
        let spare_started = std::time::Instant::now();
        let spare_pins = [
            (names::PROG_TC_INGRESS, names::PROG_TC_INGRESS_SPARE),
            (names::PROG_TC_EGRESS, names::PROG_TC_EGRESS_SPARE),
        ];
        let spare_loaded = features.tcx.then(|| -> Result<(), DatapathError> {
            let mut spare = configured()
                .load(object::for_order(slots_order))
                .map_err(|e| DatapathError::Load(Box::new(e)))?;
            for (name, pin) in spare_pins {
                let prog: &mut SchedClassifier = program(&mut spare, name)?;
                prog.load()
                    .map_err(|source| DatapathError::Program { name, source })?;
                pin_program(|path| prog.pin(path), &layout, pin)?;
            }
            // Its pins keep the spare programs (and the maps they use); nothing else of it
            // is used.
            Ok(())
        });
        if let Some(Err(e)) = &spare_loaded {
            warn!(
                "the spare TC programs did not load ({e}): moving ipq's TCX link ahead of \
                 another tool's program leaves a gap of a grace period"
            );
        }
        if !matches!(spare_loaded, Some(Ok(()))) {
            // No spare of an earlier agent's is left to be attached by mistake.
            for (_, pin) in spare_pins {
                let _ = fs::remove_file(layout.program(pin));
            }
        }
        let spare_took = spare_started.elapsed();

        // Every map and program pin is held from here on: removing one detaches nothing.
        for dir in [layout.maps_dir(), layout.programs_dir()] {
            held_pins::hold_dir(&dir).map_err(|source| DatapathError::Io { path: dir, source })?;
        }
        let bpf_watch = match options.bpf_watcher {
            BpfWatcher::Off => Err("bpf_watcher = off".to_owned()),
            choice => {
                bpf_watch::attach(&mut ebpf, &layout, trampolines, choice == BpfWatcher::Auto)
                    .map_err(|e| e.to_string())
            }
        };
        match &bpf_watch {
            Ok(watch) => info!(
                "bpf() watcher attached ({}): another process's link detach, program attach or \
                 write to ipq's maps is verified at once{}",
                bpf_watch::describe(watch.mode),
                watch
                    .why_not_trampolines
                    .as_ref()
                    .map(|why| format!(" (not the trampolines: {why})"))
                    .unwrap_or_default()
            ),
            Err(e) => log::log!(
                // What the operator chose is said, not warned about.
                if options.bpf_watcher == BpfWatcher::Auto {
                    log::Level::Warn
                } else {
                    log::Level::Info
                },
                "bpf() watcher not attached ({e}): another process's link detach, program \
                 attach or map write is found by the periodic verification only"
            ),
        }
        let samples = Samples::open(&mut maps::Source::Loaded(&mut ebpf))?;
        let logger = aya_log::EbpfLogger::init(&mut ebpf)
            .map_err(|e| warn!("kernel-side log records will not be read: {e}"))
            .ok();
        // Sets a new table up with the seed before anything can attach the programs.
        let mut maps = DatapathMaps::open(maps::Source::Loaded(&mut ebpf), Some(slot_seed))?;
        maps.set_mode(options.mode)?;
        // A new cookie per load: only this agent's probes are counted (never 0, which counts
        // nothing).
        let probe_cookie = (random_seed()? as u32) | 1;
        maps.set_probe_cookie(probe_cookie)?;
        attach::witness::install(&layout.map(names::MAP_PROBES), probe_cookie);
        info!(
            "datapath loaded: {} addresses in pinned maps under {} (the spare TC programs in \
             {} ms); kernel has TCX: {}, reads of the address table: {}, clock: {}",
            maps.table.len(),
            layout.root().display(),
            spare_took.as_millis(),
            features.tcx,
            match slots_order {
                SlotsOrder::InOrder => "plain loads (the CPU keeps loads in order)",
                SlotsOrder::FetchBarrier => "ordered by fetch-atomic barriers",
                SlotsOrder::HashOnly =>
                    "hash map only (a weakly ordered CPU and no fetch atomics before Linux 5.12)",
            },
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
            bpf_watch: Some(bpf_watch),
            logger,
            capacity,
            features,
        })
    }

    pub fn layout(&self) -> &PinLayout {
        &self.layout
    }

    /// The watcher of other processes' bpf() calls, or why there is none (once).
    pub fn take_bpf_watch(&mut self) -> Result<bpf_watch::BpfWatch, String> {
        self.bpf_watch
            .take()
            .unwrap_or_else(|| Err("already taken".to_owned()))
    }

    /// The mirror of what the address table wrote, for the verification (once).
    pub fn take_maps_mirror(&mut self) -> Option<intent::IntentMirror> {
        self.maps.table.take_mirror()
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
        overflows: prometheus::IntCounter,
    ) -> Result<(Attacher, tokio::sync::mpsc::Receiver<JobReport>), DatapathError> {
        let (workers, reports) = WorkerPool::start(self.layout.clone(), mode, overflows)?;
        Ok((Attacher::new(workers), reports))
    }

    /// A program of the loaded object, by name: tests and benchmarks run programs through
    /// `BPF_PROG_TEST_RUN`, including the empty floor programs the agent never attaches.
    pub fn program_mut(&mut self, name: &str) -> Option<&mut aya::programs::Program> {
        self.ebpf.program_mut(name)
    }
}

/// This process's id in its own PID namespace, and that namespace's identity as
/// `bpf_get_ns_current_pid_tgid` takes it: the device as the kernel's `dev_t` (`MKDEV`, major
/// in the top 12 bits of 32), the inode.
#[derive(Clone, Copy, Debug)]
pub struct OwnPidNamespace {
    pub pid: u32,
    pub dev: u64,
    pub ino: u64,
}

impl OwnPidNamespace {
    const PATH: &'static str = "/proc/self/ns/pid";

    pub fn read() -> Result<Self, DatapathError> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = fs::metadata(Self::PATH).map_err(|source| DatapathError::Io {
            path: PathBuf::from(Self::PATH),
            source,
        })?;
        let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
        Ok(Self {
            pid: std::process::id(),
            dev: (u64::from(major) << 20) | u64::from(minor),
            ino: meta.ino(),
        })
    }
}

/// Reader of the kernel programs' log records (aya-log), which it forwards to `log`.
pub type KernelLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

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
