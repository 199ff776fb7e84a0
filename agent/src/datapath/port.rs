//! What the registry's owner needs of the datapath, as traits: the address table (the map the
//! kernel programs enforce from) and the attachments. The real [`Datapath`] implements them
//! over the kernel; tests implement them in memory, so the tracker is tested without root.

use std::collections::BTreeMap;

use ipq_common::addr::{AddrEntry, AddrKey};

use super::{
    bpf_watch::ReportedKey, map_check::MapSuspects, AddressTable, Datapath, DatapathError,
    MapsCheck,
};

/// The address table's public face: one entry per registered address.
pub trait AddrTable {
    /// The entry of `addr` as last written (no syscall).
    fn get(&self, addr: &AddrKey) -> Option<AddrEntry>;
    /// Writes the entry of `addr`, keeping the kernel-written stamps of an existing one.
    fn put(&mut self, addr: AddrKey, entry: AddrEntry) -> Result<(), DatapathError>;
    /// Removes `addr` (it becomes Free), returning what it was.
    fn remove(&mut self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError>;
    /// Every entry, with the kernel-written stamps as they are now.
    fn entries(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError>;
    /// Every entry as this table last read or wrote it (no syscall).
    fn cached(&self) -> Vec<(AddrKey, AddrEntry)>;
    /// The entry of `addr` as the kernel has it now, with its stamps: one lookup.
    fn kernel_entry(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError>;
    /// How many entries the table holds.
    fn len(&self) -> usize;
    /// Looks again at what the off-loop comparison found differing from what the table wrote
    /// (`suspects`), and writes `wanted`'s entry back where the kernel still differs. A table
    /// in memory has nothing to compare.
    fn recheck(
        &mut self,
        _suspects: &MapSuspects,
        _wanted: &dyn Fn(&AddrKey) -> Option<AddrEntry>,
    ) -> MapsCheck {
        MapsCheck::default()
    }
    /// What to look at for map writes another process made, by the keys the bpf() watcher
    /// reported. A table in memory has nothing another process could write.
    fn reported_suspects(&self, _keys: &[ReportedKey]) -> MapSuspects {
        MapSuspects::default()
    }
    /// Where the pinned copies disagreed when the table opened (the stricter was kept).
    fn opened_disagreeing(&self) -> &[String] {
        &[]
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AddrTable for AddressTable {
    fn get(&self, addr: &AddrKey) -> Option<AddrEntry> {
        AddressTable::get(self, addr)
    }

    fn put(&mut self, addr: AddrKey, entry: AddrEntry) -> Result<(), DatapathError> {
        AddressTable::put(self, addr, entry)
    }

    fn remove(&mut self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        AddressTable::remove(self, addr)
    }

    fn entries(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError> {
        AddressTable::entries(self)
    }

    fn cached(&self) -> Vec<(AddrKey, AddrEntry)> {
        AddressTable::cached(self)
    }

    fn kernel_entry(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        AddressTable::kernel_entry(self, addr)
    }

    fn len(&self) -> usize {
        AddressTable::len(self)
    }

    fn recheck(
        &mut self,
        suspects: &MapSuspects,
        wanted: &dyn Fn(&AddrKey) -> Option<AddrEntry>,
    ) -> MapsCheck {
        AddressTable::recheck(self, suspects, wanted)
    }

    fn reported_suspects(&self, keys: &[ReportedKey]) -> MapSuspects {
        AddressTable::reported_suspects(self, keys)
    }

    fn opened_disagreeing(&self) -> &[String] {
        AddressTable::opened_disagreeing(self)
    }
}

/// The datapath as the tracker drives it: the address table. (Attaching programs runs off the
/// owner loop, in [`super::attach::Attacher`].)
pub trait DatapathPort {
    fn table(&self) -> &dyn AddrTable;
    fn table_mut(&mut self) -> &mut dyn AddrTable;
}

impl DatapathPort for Datapath {
    fn table(&self) -> &dyn AddrTable {
        &self.maps.table
    }

    fn table_mut(&mut self) -> &mut dyn AddrTable {
        &mut self.maps.table
    }
}

/// An address table in memory, for tests: what the kernel map would hold.
#[derive(Debug, Default)]
pub struct MemTable {
    pub entries: BTreeMap<AddrKey, AddrEntry>,
    /// The map's size, when a test gives one: a new address beyond it is refused as the
    /// kernel's hash map refuses it (`Full`, nothing stored).
    pub capacity: Option<usize>,
}

impl AddrTable for MemTable {
    fn get(&self, addr: &AddrKey) -> Option<AddrEntry> {
        self.entries.get(addr).copied()
    }

    fn put(&mut self, addr: AddrKey, mut entry: AddrEntry) -> Result<(), DatapathError> {
        if let Some(current) = self.entries.get(&addr) {
            entry.last_stale_ns = current.last_stale_ns;
            entry.last_sample_ns = current.last_sample_ns;
        } else if self.capacity.is_some_and(|size| self.entries.len() >= size) {
            return Err(DatapathError::Full { addr: addr.to_ip() });
        }
        self.entries.insert(addr, entry);
        Ok(())
    }

    fn remove(&mut self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        Ok(self.entries.remove(addr))
    }

    fn entries(&self) -> Result<Vec<(AddrKey, AddrEntry)>, DatapathError> {
        Ok(self.entries.iter().map(|(k, v)| (*k, *v)).collect())
    }

    fn cached(&self) -> Vec<(AddrKey, AddrEntry)> {
        self.entries.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn kernel_entry(&self, addr: &AddrKey) -> Result<Option<AddrEntry>, DatapathError> {
        Ok(self.entries.get(addr).copied())
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// A datapath in memory, for tests: a [`MemTable`].
#[derive(Debug, Default)]
pub struct MemDatapath {
    pub table: MemTable,
}

impl DatapathPort for MemDatapath {
    fn table(&self) -> &dyn AddrTable {
        &self.table
    }

    fn table_mut(&mut self) -> &mut dyn AddrTable {
        &mut self.table
    }
}
