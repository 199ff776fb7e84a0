//! The maps of a datapath, opened from a loaded object or from pins, and the read-only
//! reading of the pins that the break-glass `show` and the tests use beside a running agent.

use std::path::Path;

use ipq_common::{
    addr::{AddrEntry, AddrKey},
    config::{Mode, DEFAULT_SAMPLE_INTERVAL_NS},
    counters::Counter,
};
use log::warn;

use super::{attach, maps, slots::SlotTable, AddressTable, ConfigCell, Counters, DatapathError};
use crate::paths::PinLayout;

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
    pub(super) fn open(mut source: maps::Source, seed: Option<u64>) -> Result<Self, DatapathError> {
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

    /// What the programs expect a co-tenant probe to carry (`attach::witness`).
    pub fn set_probe_cookie(&mut self, cookie: u32) -> Result<(), DatapathError> {
        let mut config = self.config.get()?;
        config.probe_cookie = cookie;
        self.config.set(&config)
    }
}
