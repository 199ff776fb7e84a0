//! Pins an earlier agent left, checked before the loader trusts them: on a bpf filesystem, in
//! directories only the agent's user may write, with the key and value sizes this build
//! reads; and the sizes to load with, which a pinned map keeps whatever the configuration says.

use std::{ffi::CString, path::Path};

use aya::maps::MapData;
use ipq_common::{
    addr::{AddrEntry, AddrKey, BPF_F_NO_PREALLOC},
    config::DatapathConfig,
    counters::{Counter, COUNTER_SLOTS},
    filter::{filter_words, valid_filter_words},
    iface::IfaceEntry,
    names,
    probe::PROBE_SLOTS,
    slots::{
        buckets_of_entries, slot_buckets, AddrSlot, SlotsMeta, BPF_F_MMAPABLE, SLOTS_MAGIC,
        SLOT_WAYS,
    },
};

use super::DatapathError;
use crate::paths::PinLayout;

/// Sizes of the maps the object is loaded with.
pub(super) struct Sizes {
    pub(super) capacity: u32,
    pub(super) filter_words: u32,
    pub(super) slot_buckets: u32,
    /// The seed of a pinned `IPQ_SLOTS` that an agent set up; `None` when there is none yet.
    pub(super) slot_seed: Option<u64>,
    /// Whether the pinned `IPQ_ADDRS` is preallocated (an earlier build's pin): its kernel hands
    /// a replaced element to the next update at once, even where this build's map would wait
    /// for a grace period (`ipq_common::addr::BPF_F_NO_PREALLOC`).
    pub(super) addrs_preallocated: bool,
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
        names::MAP_PROBES => (size_of::<u32>(), size_of::<u64>()),
        _ => return None,
    };
    Some((sizes.0 as u32, sizes.1 as u32))
}

/// Checks that `path` lies on a bpf filesystem.
pub(super) fn check_bpffs(path: &Path) -> Result<(), DatapathError> {
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
pub(super) fn create_dir(path: &Path) -> Result<(), DatapathError> {
    Ok(ipq_fs::safe_fs::ensure_dir(
        path,
        ipq_fs::safe_fs::DirAccess::Traversable,
    )?)
}

/// Verifies pins left by an earlier agent before the loader trusts them, and returns the
/// sizes to load with: an existing address map keeps its size (and its contents), and an
/// existing filter keeps its size, so the size the programs are loaded with is always the
/// size of the map they will read, whatever the configured capacity became.
pub(super) fn check_pins(layout: &PinLayout, capacity: u32) -> Result<Sizes, DatapathError> {
    let mut effective = capacity;
    let mut pinned_filter_words = None;
    let mut pinned_slots = None;
    let mut addrs_preallocated = false;
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
        // The probe counts are a moment's, nothing to keep across agents. A shorter array,
        // an earlier version's (fewer hooks), would leave some hook's probes uncounted, every
        // co-tenant ahead there looking like a bypass: it is replaced, so that an upgrade past
        // a new hook goes through. A longer one, a later version's that this one is rolled
        // back to, counts this build's hooks in its first entries as they are numbered
        // everywhere (`Hook`'s ordinals only ever grow): it is used as it is.
        if name == names::MAP_PROBES && map_info.max_entries() < PROBE_SLOTS {
            replace_pin(
                &path,
                data,
                &format!(
                    "has {} entries, this build counts the probes of {PROBE_SLOTS} hooks (an \
                     earlier version's)",
                    map_info.max_entries()
                ),
            )?;
            continue;
        }
        // The counters' indices are laid out by the numbers of actions, hooks and reasons
        // (`counter_index`): another version's array, of another length, holds its counts
        // under other indices, and would have this build's misread or lost. It is replaced:
        // the counters start again from zero, which Prometheus takes as a reset.
        if name == names::MAP_COUNTERS && map_info.max_entries() != COUNTER_SLOTS {
            replace_pin(
                &path,
                data,
                &format!(
                    "has {} entries, this build's counters {COUNTER_SLOTS} (another version's \
                     layout; the counts start again from zero)",
                    map_info.max_entries()
                ),
            )?;
            continue;
        }
        if name == names::MAP_ADDRS {
            addrs_preallocated = map_info.map_flags() & BPF_F_NO_PREALLOC == 0;
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
                    "the pinned quarantine filter has {words} words, {} would fit capacity \
                 {effective}: keeping the pinned one (false positives cost lookups only)",
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
        addrs_preallocated,
    })
}

/// Removes the pin at `path` of a map whose contents need not outlive this start (`why` it is
/// not this build's), so that the loader creates this build's map in its place. Programs of
/// an earlier agent still attached keep the old map until this agent's replace them.
fn replace_pin(path: &Path, data: MapData, why: &str) -> Result<(), DatapathError> {
    log::info!("{} {why}: replaced by a new one", path.display());
    drop(data);
    std::fs::remove_file(path).map_err(|source| DatapathError::Io {
        path: path.to_owned(),
        source,
    })
}

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
