//! One typed wrapper per map: the only user-space code that reads or writes it.

use std::path::Path;

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, RingBuf};
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    config::DatapathConfig,
    counters::{Counter, COUNTER_SLOTS},
    iface::IfaceEntry,
    names,
};

use super::DatapathError;
use crate::paths::PinLayout;

/// Where a map comes from: the object just loaded, or a pin left by a running agent.
pub enum Source<'a> {
    Loaded(&'a mut aya::Ebpf),
    Pinned(&'a PinLayout),
}

impl Source<'_> {
    fn take(&mut self, name: &'static str) -> Result<Map, DatapathError> {
        match self {
            Source::Loaded(ebpf) => ebpf
                .take_map(name)
                .ok_or(DatapathError::MissingMap { name }),
            Source::Pinned(layout) => open_pinned(&layout.map(name), name),
        }
    }
}

fn open_pinned(path: &Path, name: &'static str) -> Result<Map, DatapathError> {
    let data = MapData::from_pin(path).map_err(|source| DatapathError::OpenPin {
        path: path.to_owned(),
        source,
    })?;
    Map::from_map_data(data).map_err(|source| DatapathError::Map { name, source })
}

fn typed<T>(name: &'static str, map: Map) -> Result<T, DatapathError>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(map).map_err(|source| DatapathError::Map { name, source })
}

fn map_err(name: &'static str) -> impl Fn(MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

/// `IPQ_ADDRS`: address → state, holder, fence, kernel stamps.
pub struct AddrMap(HashMap<MapData, AddrKey, AddrEntry>);

impl AddrMap {
    pub fn open(source: &mut Source) -> Result<Self, DatapathError> {
        Ok(Self(typed(
            names::MAP_ADDRS,
            source.take(names::MAP_ADDRS)?,
        )?))
    }

    pub fn get(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        match self.0.get(addr, 0) {
            Ok(entry) => Ok(Some(entry)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(map_err(names::MAP_ADDRS)(e)),
        }
    }

    pub fn insert(&mut self, addr: &AddrKey, entry: &AddrEntry) -> Result<(), DatapathError> {
        self.0
            .insert(addr, entry, 0)
            .map_err(|source| match &source {
                MapError::SyscallError(e) if e.io_error.raw_os_error() == Some(libc::E2BIG) => {
                    DatapathError::Full { addr: addr.to_ip() }
                }
                _ => DatapathError::Map {
                    name: names::MAP_ADDRS,
                    source,
                },
            })
    }

    pub fn remove(&mut self, addr: &AddrKey) -> Result<(), DatapathError> {
        match self.0.remove(addr) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(e) => Err(map_err(names::MAP_ADDRS)(e)),
        }
    }

    /// Every entry: read in batches where the kernel can (see [`super::batch_read`]), else one
    /// by one.
    pub fn entries(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError> {
        use aya::maps::IterableMap as _;
        use std::os::fd::AsFd as _;
        let fd = self.0.map().fd().as_fd();
        match super::batch_read::lookup_all(fd) {
            Ok(Some(entries)) => return Ok(entries),
            Ok(None) => {}
            Err(source) => {
                return Err(DatapathError::BatchRead {
                    name: names::MAP_ADDRS,
                    source,
                })
            }
        }
        self.0
            .iter()
            .collect::<Result<_, _>>()
            .map_err(map_err(names::MAP_ADDRS))
    }
}

/// `IPQ_SLOTS`, as the map data the table maps into memory (`slots::SlotCells`).
pub fn slots_map(source: &mut Source) -> Result<MapData, DatapathError> {
    match source.take(names::MAP_SLOTS)? {
        Map::Array(data) => Ok(data),
        _ => Err(DatapathError::SlotsLayout {
            what: "map type (not an array)",
            found: 0,
        }),
    }
}

/// `IPQ_IFACES`: the per-interface fast-path slots.
pub struct IfaceSlots(Array<MapData, IfaceEntry>);

impl IfaceSlots {
    pub fn open(source: &mut Source) -> Result<Self, DatapathError> {
        Ok(Self(typed(
            names::MAP_IFACES,
            source.take(names::MAP_IFACES)?,
        )?))
    }

    pub fn get(&self, slot: u32) -> Result<IfaceEntry, DatapathError> {
        self.0.get(&slot, 0).map_err(map_err(names::MAP_IFACES))
    }

    pub fn set(&mut self, slot: u32, entry: &IfaceEntry) -> Result<(), DatapathError> {
        self.0
            .set(slot, entry, 0)
            .map_err(map_err(names::MAP_IFACES))
    }

    pub fn len(&self) -> u32 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

/// `IPQ_QBLOOM`: the Bloom filter of possibly quarantined addresses, sized at load.
pub struct QuarantineFilter(Array<MapData, u64>);

impl QuarantineFilter {
    pub fn open(source: &mut Source) -> Result<Self, DatapathError> {
        Ok(Self(typed(
            names::MAP_QFILTER,
            source.take(names::MAP_QFILTER)?,
        )?))
    }

    pub fn set_word(&mut self, word: u32, bits: u64) -> Result<(), DatapathError> {
        self.0
            .set(word, bits, 0)
            .map_err(map_err(names::MAP_QFILTER))
    }

    pub fn word(&self, word: u32) -> Result<u64, DatapathError> {
        self.0.get(&word, 0).map_err(map_err(names::MAP_QFILTER))
    }

    pub fn words(&self) -> Result<Vec<u64>, DatapathError> {
        (0..self.len())
            .map(|word| self.0.get(&word, 0).map_err(map_err(names::MAP_QFILTER)))
            .collect()
    }

    /// Words in the filter: a power of two, sized from `capacity` at load (or kept from a pin).
    pub fn len(&self) -> u32 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
}

/// Sets every bit of the single-hash bitmap an older agent pinned, if there is one: its XDP
/// programs may still be attached until this agent replaces them, and a filter of ones sends
/// every packet they see to the authoritative hash map. Nothing updates that bitmap any more,
/// so clearing (or leaving) any bit there could hide a quarantine: it must say "maybe" always.
pub fn blind_legacy_filter(layout: &PinLayout) -> Result<(), DatapathError> {
    let path = layout.map(names::MAP_QFILTER_LEGACY);
    if !path.exists() {
        return Ok(());
    }
    let name = names::MAP_QFILTER_LEGACY;
    let mut legacy: Array<MapData, u64> = typed(name, open_pinned(&path, name)?)?;
    for word in 0..legacy.len() {
        legacy.set(word, u64::MAX, 0).map_err(map_err(name))?;
    }
    log::info!(
        "{}: the previous agent's quarantine bitmap now matches everything until its programs \
         are replaced",
        path.display()
    );
    Ok(())
}

/// Removes the legacy bitmap's pin once this agent's programs are attached.
pub fn unpin_legacy_filter(layout: &PinLayout) -> Result<(), DatapathError> {
    let path = layout.map(names::MAP_QFILTER_LEGACY);
    super::held_pins::release(&path);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DatapathError::Io { path, source }),
    }
}

/// `IPQ_COUNTERS`: per-CPU packet and byte counters, summed on read.
pub struct Counters(PerCpuArray<MapData, Counter>);

impl Counters {
    pub fn open(source: &mut Source) -> Result<Self, DatapathError> {
        Ok(Self(typed(
            names::MAP_COUNTERS,
            source.take(names::MAP_COUNTERS)?,
        )?))
    }

    /// Every slot, summed over CPUs, indexed like `counters::counter_index`.
    pub fn read(&self) -> Result<Vec<Counter>, DatapathError> {
        (0..COUNTER_SLOTS)
            .map(|index| {
                let per_cpu = self
                    .0
                    .get(&index, 0)
                    .map_err(map_err(names::MAP_COUNTERS))?;
                Ok(per_cpu.iter().fold(Counter::default(), |sum, c| Counter {
                    packets: sum.packets + c.packets,
                    bytes: sum.bytes + c.bytes,
                }))
            })
            .collect()
    }
}

/// `IPQ_CONFIG`: the mode and the sample rate limit.
pub struct ConfigCell(Array<MapData, DatapathConfig>);

impl ConfigCell {
    pub fn open(source: &mut Source) -> Result<Self, DatapathError> {
        Ok(Self(typed(
            names::MAP_CONFIG,
            source.take(names::MAP_CONFIG)?,
        )?))
    }

    pub fn get(&self) -> Result<DatapathConfig, DatapathError> {
        self.0.get(&0, 0).map_err(map_err(names::MAP_CONFIG))
    }

    pub fn set(&mut self, config: &DatapathConfig) -> Result<(), DatapathError> {
        self.0.set(0, config, 0).map_err(map_err(names::MAP_CONFIG))
    }
}

/// `IPQ_SAMPLES`: the conflict-sample ring buffer.
pub struct Samples(pub RingBuf<MapData>);

impl Samples {
    pub fn open(source: &mut Source) -> Result<Self, DatapathError> {
        Ok(Self(typed(
            names::MAP_SAMPLES,
            source.take(names::MAP_SAMPLES)?,
        )?))
    }
}
