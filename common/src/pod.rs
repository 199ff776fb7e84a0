//! `aya::Pod` for every type stored in a map. Sound because each is `#[repr(C)]`, has no
//! implicit padding (see the layout asserts) and is valid for any bit pattern.

use crate::{
    addr::{AddrEntry, AddrKey},
    config::DatapathConfig,
    counters::Counter,
    iface::IfaceEntry,
    sample::ConflictSample,
    slots::{AddrSlot, SlotsMeta},
    watch::BpfCall,
};

unsafe impl aya::Pod for AddrKey {}
unsafe impl aya::Pod for AddrEntry {}
unsafe impl aya::Pod for IfaceEntry {}
unsafe impl aya::Pod for DatapathConfig {}
unsafe impl aya::Pod for Counter {}
unsafe impl aya::Pod for ConflictSample {}
unsafe impl aya::Pod for AddrSlot {}
unsafe impl aya::Pod for SlotsMeta {}
unsafe impl aya::Pod for BpfCall {}
