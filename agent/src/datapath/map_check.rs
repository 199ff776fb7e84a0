//! The kernel's address maps compared with what their one writer wrote, off the owner loop
//! ([`IntentMirror`]): only what differs goes to the owner loop, which looks again at each
//! suspect and writes its own back ([`super::AddressTable::recheck`]).
//!
//! Nothing announces a write to a map: any process with `CAP_BPF` can open a pin and unfence
//! an address with one `bpf()` call. `IPQ_ADDRS` is read in batches (`BPF_MAP_LOOKUP_BATCH`,
//! a batch in memory at a time) and each batch compared as it comes; `IPQ_SLOTS` is read
//! through the table's own mapping, slot by slot under the programs' counter protocol;
//! `IPQ_IFACES` and `IPQ_QBLOOM` (a few hundred KiB) are read whole. The reading runs on its
//! own descriptors (opened from the pins). A write the owner loop makes while the maps are read
//! may make its address a suspect: the mirror takes in the table's writes again after the
//! reads, and a suspect the kernel held as the table has written it since is dropped; the owner
//! loop finds the rest that agree and drops them too.

use std::{
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, MapData},
    Pod,
};
use ipq_common::{
    addr::{AddrEntry, AddrKey},
    iface::IfaceEntry,
    names,
};

use super::{
    batch_read,
    intent::IntentMirror,
    slots::{CellRead, SlotsReader},
    DatapathError,
};
use crate::paths::PinLayout;

/// What one comparison found differing, for the owner loop to look at again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapSuspects {
    /// Addresses whose `IPQ_ADDRS` or `IPQ_SLOTS` entry (or lack of one) is not what the table
    /// wrote, in address order, each once.
    pub addrs: Vec<AddrKey>,
    /// `IPQ_SLOTS` slots found mid-write (a counter odd): settled by the owner loop if still so.
    pub unsettled: Vec<usize>,
    /// `IPQ_IFACES` slots not as written.
    pub slots: Vec<u32>,
    /// `IPQ_QBLOOM` words not as written.
    pub words: Vec<u32>,
    /// Addresses the table holds.
    pub addresses: usize,
    /// The reads and the comparison, off the owner loop.
    pub took: Duration,
}

impl MapSuspects {
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
            && self.unsettled.is_empty()
            && self.slots.is_empty()
            && self.words.is_empty()
    }
}

/// Which of the mirror's addresses a walk of one map met: one bit each.
struct Seen(Vec<u64>);

impl Seen {
    fn new(len: usize) -> Self {
        Self(vec![0; len.div_ceil(64)])
    }

    fn mark(&mut self, index: usize) {
        self.0[index / 64] |= 1 << (index % 64);
    }

    fn unmarked(&self, len: usize) -> impl Iterator<Item = usize> + '_ {
        (0..len).filter(|i| self.0[i / 64] & (1 << (i % 64)) == 0)
    }
}

/// Compares the maps pinned under `layout` with `mirror` (after taking in what the table wrote
/// since the last time).
pub fn compare(
    layout: &PinLayout,
    mirror: &mut IntentMirror,
) -> Result<MapSuspects, DatapathError> {
    let started = Instant::now();
    mirror.absorb();
    // (address, its digest as read, `None` where the map lacked it)
    let mut addrs: Vec<(AddrKey, Option<u32>)> = Vec::new();
    {
        let mut seen = Seen::new(mirror.len());
        let mut visit = |batch: &[(AddrKey, AddrEntry)]| {
            for (addr, entry) in batch {
                check_addr(mirror, &mut seen, &mut addrs, addr, entry);
            }
        };
        let map = open(layout, names::MAP_ADDRS)?;
        let batched =
            batch_read::for_each_batch::<AddrKey, AddrEntry>(map.fd().as_fd(), &mut visit)
                .map_err(|source| DatapathError::BatchRead {
                    name: names::MAP_ADDRS,
                    source,
                })?;
        if !batched {
            // A kernel without batch reads: two calls an entry, still one entry in memory.
            seen = Seen::new(mirror.len());
            addrs.clear();
            let map =
                aya::maps::HashMap::<_, AddrKey, AddrEntry>::try_from(aya::maps::Map::HashMap(map))
                    .map_err(map_error(names::MAP_ADDRS))?;
            for item in map.iter() {
                let (addr, entry) = item.map_err(map_error(names::MAP_ADDRS))?;
                check_addr(mirror, &mut seen, &mut addrs, &addr, &entry);
            }
        }
        addrs.extend(
            seen.unmarked(mirror.len())
                .map(|i| (mirror.addr_at(i), None)),
        );
    }
    let (unsettled, mut torn) = compare_slots(mirror, &mirror.cells, &mut addrs);
    // What the owner loop wrote while the maps were read is no suspect.
    mirror.absorb();
    addrs.retain(|(addr, read)| mirror.find(addr).map(|(_, digest)| digest) != *read);
    torn.extend(addrs.into_iter().map(|(addr, _)| addr));
    let mut addrs = torn;
    addrs.sort_unstable();
    addrs.dedup();
    let digests = mirror.digests();
    let slots = differing(
        &read_array::<IfaceEntry>(layout, names::MAP_IFACES)?,
        &mirror.slots,
        |slot| digests.slot(slot),
    );
    let words = differing(
        &read_array::<u64>(layout, names::MAP_QFILTER)?,
        &mirror.words,
        |word| digests.word(*word),
    );
    Ok(MapSuspects {
        addrs,
        unsettled,
        slots,
        words,
        addresses: mirror.len(),
        took: started.elapsed(),
    })
}

fn check_addr(
    mirror: &IntentMirror,
    seen: &mut Seen,
    suspects: &mut Vec<(AddrKey, Option<u32>)>,
    addr: &AddrKey,
    entry: &AddrEntry,
) {
    let read = mirror.digests().entry(entry);
    match mirror.find(addr) {
        Some((index, digest)) => {
            seen.mark(index);
            if digest != read {
                suspects.push((*addr, Some(read)));
            }
        }
        None => suspects.push((*addr, Some(read))),
    }
}

/// `IPQ_SLOTS` against the mirror: what differs into `suspects`. Returns the slots found
/// mid-write and their addresses (as read, possibly torn).
fn compare_slots(
    mirror: &IntentMirror,
    cells: &SlotsReader,
    suspects: &mut Vec<(AddrKey, Option<u32>)>,
) -> (Vec<usize>, Vec<AddrKey>) {
    let mut seen = Seen::new(mirror.len());
    let (mut unsettled, mut torn) = (Vec::new(), Vec::new());
    for index in 0..cells.len() {
        match cells.read(index) {
            CellRead::Empty => {}
            CellRead::Held(addr, entry) => check_addr(mirror, &mut seen, suspects, &addr, &entry),
            CellRead::Unsettled(addr) => {
                unsettled.push(index);
                if let Some((i, _)) = mirror.find(&addr) {
                    seen.mark(i);
                }
                torn.push(addr);
            }
        }
    }
    suspects.extend(
        seen.unmarked(mirror.len())
            .map(|i| (mirror.addr_at(i), None)),
    );
    (unsettled, torn)
}

/// The indexes whose value in `read` does not digest as `wanted` says.
fn differing<V>(read: &[V], wanted: &[u32], digest: impl Fn(&V) -> u32) -> Vec<u32> {
    read.iter()
        .zip(wanted)
        .enumerate()
        .filter(|(_, (value, want))| digest(value) != **want)
        .map(|(index, _)| index as u32)
        .collect()
}

fn open(layout: &PinLayout, name: &'static str) -> Result<MapData, DatapathError> {
    let path = layout.map(name);
    MapData::from_pin(&path).map_err(|source| DatapathError::OpenPin { path, source })
}

fn map_error(name: &'static str) -> impl Fn(aya::maps::MapError) -> DatapathError {
    move |source| DatapathError::Map { name, source }
}

/// Every element of the array map `name`, by index: in batches where the kernel can, else one
/// lookup each.
fn read_array<V: Pod + Default>(
    layout: &PinLayout,
    name: &'static str,
) -> Result<Vec<V>, DatapathError> {
    let map = open(layout, name)?;
    let len = map.info().map_err(map_error(name))?.max_entries() as usize;
    match batch_read::lookup_all::<u32, V>(map.fd().as_fd()) {
        Ok(Some(entries)) => {
            let mut values = vec![V::default(); len];
            for (index, value) in entries {
                if let Some(slot) = values.get_mut(index as usize) {
                    *slot = value;
                }
            }
            Ok(values)
        }
        Ok(None) => {
            let array =
                Array::<_, V>::try_from(aya::maps::Map::Array(map)).map_err(map_error(name))?;
            (0..len as u32)
                .map(|i| array.get(&i, 0).map_err(map_error(name)))
                .collect()
        }
        Err(source) => Err(DatapathError::BatchRead { name, source }),
    }
}
