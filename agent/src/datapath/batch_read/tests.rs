//! Against a real hash map of this kernel (needs CAP_BPF, as every datapath test does).

use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};

use aya_obj::generated::bpf_map_type;

use super::*;

/// A hash map of u64 → u64 with room for `max` entries.
fn hash_map(max: u32) -> OwnedFd {
    crate::needs_root::needs_root("create a BPF hash map");
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_1.map_type = bpf_map_type::BPF_MAP_TYPE_HASH as u32;
    attr.__bindgen_anon_1.key_size = 8;
    attr.__bindgen_anon_1.value_size = 8;
    attr.__bindgen_anon_1.max_entries = max;
    let fd = bpf_with(bpf_cmd::BPF_MAP_CREATE, &mut attr).unwrap_or_else(|e| {
        panic!("creating a BPF hash map: {e} (this test needs CAP_BPF: run it as root)")
    });
    // SAFETY: a descriptor the kernel just returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn put(map: &OwnedFd, key: u64, value: u64) {
    let mut attr = zeroed_attr();
    attr.__bindgen_anon_2.map_fd = map.as_raw_fd() as u32;
    attr.__bindgen_anon_2.key = std::ptr::addr_of!(key) as u64;
    attr.__bindgen_anon_2.__bindgen_anon_1.value = std::ptr::addr_of!(value) as u64;
    bpf_with(bpf_cmd::BPF_MAP_UPDATE_ELEM, &mut attr).expect("BPF_MAP_UPDATE_ELEM");
}

#[test]
fn every_entry_is_read_across_several_batches() {
    // More than two chunks, so the walk goes on from the kernel's position twice.
    let n = u64::from(CHUNK) * 2 + 123;
    let map = hash_map(n as u32 + 1);
    for key in 0..n {
        put(&map, key, key * 7 + 1);
    }
    let mut read: Vec<(u64, u64)> = lookup_all(map.as_fd())
        .expect("the batch read")
        .expect("this kernel reads hash maps in batches (5.6 and later)");
    read.sort_unstable();
    assert_eq!(read.len() as u64, n);
    for (i, (key, value)) in read.into_iter().enumerate() {
        assert_eq!((key, value), (i as u64, i as u64 * 7 + 1));
    }
}

#[test]
fn an_empty_map_reads_as_no_entries() {
    let map = hash_map(16);
    let read: Vec<(u64, u64)> = lookup_all(map.as_fd()).unwrap().unwrap();
    assert!(read.is_empty());
}

#[test]
fn only_an_unsupported_command_falls_back_to_iterating() {
    let error = |code| io::Error::from_raw_os_error(code);
    assert!(is_unsupported(&error(libc::EINVAL), true));
    assert!(is_unsupported(&error(ENOTSUPP), true));
    assert!(!is_unsupported(&error(libc::EINVAL), false));
    assert!(is_unsupported(&error(libc::ENOSPC), false));
    assert!(!is_unsupported(&error(libc::EPERM), true));
    assert!(!is_unsupported(&error(libc::EFAULT), true));
}
