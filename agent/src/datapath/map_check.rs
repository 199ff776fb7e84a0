//! The kernel's address maps read whole, off the owner loop, for the verification to compare
//! with what the one writer wrote ([`super::AddressTable::verify`]).
//!
//! Nothing announces a write to a map: any process with `CAP_BPF` can open a pin and unfence
//! an address with one `bpf()` call. `IPQ_ADDRS` is read in batches (`BPF_MAP_LOOKUP_BATCH`,
//! a few calls at 64k addresses), `IPQ_IFACES` and `IPQ_QBLOOM` likewise where the kernel
//! can; `IPQ_SLOTS` is the table's own shared mapping, read where it is compared. The reading
//! runs on its own descriptors (opened from the pins), so the owner loop only compares.

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

use super::{batch_read, DatapathError};
use crate::paths::PinLayout;

/// The kernel's `IPQ_ADDRS`, `IPQ_IFACES` and `IPQ_QBLOOM` as one pass read them.
#[derive(Clone, Debug, Default)]
pub struct MapsReading {
    pub addrs: Vec<(AddrKey, AddrEntry)>,
    /// By slot.
    pub ifaces: Vec<IfaceEntry>,
    /// By word.
    pub filter: Vec<u64>,
    /// How long the reads took.
    pub took: Duration,
}

/// Reads the three maps pinned under `layout`.
pub fn read(layout: &PinLayout) -> Result<MapsReading, DatapathError> {
    let started = Instant::now();
    let addrs = {
        let map = open(layout, names::MAP_ADDRS)?;
        match batch_read::lookup_all::<AddrKey, AddrEntry>(map.fd().as_fd()) {
            Ok(Some(entries)) => entries,
            Ok(None) => {
                let map = aya::maps::HashMap::<_, AddrKey, AddrEntry>::try_from(
                    aya::maps::Map::HashMap(map),
                )
                .map_err(map_error(names::MAP_ADDRS))?;
                map.iter()
                    .collect::<Result<_, _>>()
                    .map_err(map_error(names::MAP_ADDRS))?
            }
            Err(source) => {
                return Err(DatapathError::BatchRead {
                    name: names::MAP_ADDRS,
                    source,
                })
            }
        }
    };
    let ifaces = read_array::<IfaceEntry>(layout, names::MAP_IFACES)?;
    let filter = read_array::<u64>(layout, names::MAP_QFILTER)?;
    Ok(MapsReading {
        addrs,
        ifaces,
        filter,
        took: started.elapsed(),
    })
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
