//! A whole hash map read in batches (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6).
//!
//! The agent reads `IPQ_ADDRS` whole when it opens the datapath (to mirror it) and when it
//! recovers from the pinned maps. Iterating it costs two system calls per entry (the next key,
//! then its value): about 130 000 calls and a fifth of a second of a restart at 64k addresses,
//! before the agent is ready. A batch read returns thousands of entries per call.

use std::{io, mem::size_of, os::fd::AsRawFd as _, os::fd::BorrowedFd};

use aya::Pod;

use aya_obj::generated::bpf_cmd;

use super::bpf_call::{bpf_with, zeroed_attr};

/// Entries asked for per call.
const CHUNK: u32 = 4096;
/// `ENOTSUPP`, the kernel-internal errno a map type without batch operations answers.
const ENOTSUPP: i32 = 524;

/// Every entry of the hash map `map`, or `None` when this kernel cannot read it in batches
/// (then the caller iterates). Entries added or removed meanwhile may or may not be in it, as
/// with an iteration.
pub(crate) fn lookup_all<K: Pod, V: Pod>(map: BorrowedFd<'_>) -> io::Result<Option<Vec<(K, V)>>> {
    let mut entries = Vec::new();
    let read = for_each_batch::<K, V>(map, |batch| entries.extend_from_slice(batch))?;
    Ok(read.then_some(entries))
}

/// Hands every entry of the hash map `map` to `visit`, a batch of at most [`CHUNK`] at a time
/// (memory for one batch, whatever the map holds). `false` when this kernel cannot read it in
/// batches (then the caller iterates); a walk abandoned after some batches is `false` too, and
/// those batches were visited.
pub(crate) fn for_each_batch<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    mut visit: impl FnMut(&[(K, V)]),
) -> io::Result<bool> {
    let mut batch: Vec<(K, V)> = Vec::with_capacity(CHUNK as usize);
    let mut keys = vec![0u8; CHUNK as usize * size_of::<K>()];
    let mut values = vec![0u8; CHUNK as usize * size_of::<V>()];
    // The position to go on from: a bucket index (4 bytes) for hash maps, room for more.
    let mut token = [0u8; 16];
    let mut next = [0u8; 16];
    let mut first = true;
    loop {
        let mut attr = zeroed_attr();
        attr.batch.in_batch = if first { 0 } else { token.as_ptr() as u64 };
        attr.batch.out_batch = next.as_mut_ptr() as u64;
        attr.batch.keys = keys.as_mut_ptr() as u64;
        attr.batch.values = values.as_mut_ptr() as u64;
        attr.batch.count = CHUNK;
        attr.batch.map_fd = map.as_raw_fd() as u32;
        let result = bpf_with(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // The kernel writes how many entries it filled, also with ENOENT (the last batch).
        // SAFETY: the `batch` member, which the kernel wrote back.
        let count = unsafe { attr.batch.count }.min(CHUNK);
        let done = match result {
            // A batch that neither filled anything nor ended the walk would be asked again
            // for ever: iterate instead.
            Ok(_) if count == 0 => return Ok(false),
            Ok(_) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) if is_unsupported(&e, first) => return Ok(false),
            Err(e) => return Err(e),
        };
        batch.clear();
        for i in 0..count as usize {
            // SAFETY: the kernel wrote `count` keys and values of these sizes; Pod types are
            // valid for any bytes, and the reads are unaligned.
            let (key, value) = unsafe {
                (
                    std::ptr::read_unaligned(keys.as_ptr().add(i * size_of::<K>()).cast::<K>()),
                    std::ptr::read_unaligned(values.as_ptr().add(i * size_of::<V>()).cast::<V>()),
                )
            };
            batch.push((key, value));
        }
        visit(&batch);
        if done {
            return Ok(true);
        }
        token = next;
        first = false;
    }
}

/// Whether to iterate instead: `EINVAL` from a kernel that predates the command and
/// `ENOTSUPP`/`EOPNOTSUPP` from a map type without it (both on the first call), or `ENOSPC`
/// at any call, a bucket larger than a whole chunk.
fn is_unsupported(error: &io::Error, first: bool) -> bool {
    match error.raw_os_error() {
        Some(libc::ENOSPC) => true,
        Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP) => first,
        _ => false,
    }
}

#[cfg(test)]
mod tests;
