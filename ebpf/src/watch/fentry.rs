//! The trampolines: fentry programs on the kernel functions every bpf() command and every
//! write, open and mapping of a map goes through. Their arguments are the kernel's (typed by
//! its BTF, the same on every architecture with trampolines), read from kernel memory: the
//! attributes the kernel copied, the key it copied. Other system calls pay nothing.
//!
//! - `security_bpf(cmd, attr, ...)`: every command, native and compat; the attachment
//!   commands are reported with their target, read at `union bpf_attr`'s ABI offsets.
//! - `security_bpf_map(map, fmode)`: every new descriptor of a map, by any path (a pin by an
//!   absolute or relative path, `BPF_F_PATH_FD`, a hard link, another mount of the bpffs, an
//!   id): reported for ipq's maps.
//! - `bpf_map_update_value(map, file, key, value, flags)`: every update by bpf(), single and
//!   batch, with the kernel's copy of the key: reported for ipq's maps. (older kernels pass `struct fd`
//!   by value as the second parameter, two slots of the context: the key's slot is the BTF's.)
//! - `htab_map_delete_elem(map, key)` and the hash map's lookup-and-delete paths: deletes of
//!   `IPQ_ADDRS` (ipq's one hash map; its arrays cannot lose an entry).
//! - `bpf_map_mmap(file, vma)`: a memory mapping of ipq's mmapable map, whose writes no call
//!   announces: reported with the kernel's count of writable mappings before it.
//!
//! Map identity is the map's `id`, read at the offset in `struct bpf_map` the agent found in
//! the kernel's BTF ([`IPQ_MAP_ID_OFFSET`]); other tools' map writes pay that read and a few
//! compares. The agent's own calls are left out ([`super::is_agent`]), except its mappings,
//! whose count the agent needs.

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::FEntryContext, EbpfContext as _};
use ipq_common::watch::{BpfCall, BpfCmd, WATCH_KEY_BYTES};

use super::{global, is_agent, is_ipq_map, reserve};

/// Offsets in the kernel's structures, from its BTF, set at load.
#[unsafe(no_mangle)]
static IPQ_MAP_ID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static IPQ_MAP_WRITECNT_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static IPQ_FILE_PRIVATE_DATA_OFFSET: u32 = 0;
/// The context slot of `bpf_map_update_value`'s key (`ipq_common::watch::GLOBAL_UPDATE_KEY_SLOT`):
/// 3 where `struct fd` came by value before it (older kernels), else 2.
#[unsafe(no_mangle)]
static IPQ_UPDATE_KEY_SLOT: u32 = 2;

/// `bpf_map_update_value`'s key, at the slot the kernel's BTF gave. Both slots are read, each
/// at its constant offset, and the value chosen after: the verifier refuses a context read at
/// a computed offset, which is what LLVM makes of a branch between two plain reads.
#[inline(always)]
pub fn update_key(ctx: &FEntryContext) -> u64 {
    let args = ctx.as_ptr() as *const u64;
    // SAFETY: the trampoline's context holds the function's arguments, 5 or 6 slots of u64
    // (see `IPQ_UPDATE_KEY_SLOT`); volatile, so that the two reads stay two.
    let (at_2, at_3) = unsafe {
        (
            core::ptr::read_volatile(args.add(2)),
            core::ptr::read_volatile(args.add(3)),
        )
    };
    if global(&IPQ_UPDATE_KEY_SLOT) == 3 {
        at_3
    } else {
        at_2
    }
}

/// `struct bpf_map *`'s id, read from kernel memory (0 where it cannot be).
#[inline(always)]
fn map_id(map: u64) -> u32 {
    let at = map.wrapping_add(u64::from(global(&IPQ_MAP_ID_OFFSET)));
    // SAFETY: a read of kernel memory by the helper, which fails rather than faults.
    unsafe { bpf_probe_read_kernel(at as *const u32) }.unwrap_or(0)
}

/// Fills a reserved record and submits it; the key, if any, read from kernel memory.
#[inline(always)]
fn report(cmd: BpfCmd, map_id: u32, target: u32, key: Option<u64>, own: bool) -> Option<()> {
    let tgid = (aya_ebpf::helpers::bpf_get_current_pid_tgid() >> 32) as u32;
    let mut entry = reserve()?;
    let call: *mut BpfCall = entry.as_mut_ptr();
    // SAFETY: the reserved record, written field by field before it is submitted; kernel
    // memory only through the helper (a failed read leaves the field zero).
    unsafe {
        (*call).cmd = cmd as u32;
        (*call).tgid = tgid;
        (*call).target = target;
        (*call).map_id = map_id;
        (*call).path[0] = u8::from(own);
        if let Some(key) = key {
            // The kernel's copy of the key: 16 bytes (an address of `IPQ_ADDRS`), or 4 (an
            // index of an array) where 16 cannot be read.
            if let Ok(bytes) = bpf_probe_read_kernel(key as *const [u8; WATCH_KEY_BYTES]) {
                core::ptr::addr_of_mut!((*call).path)
                    .cast::<[u8; WATCH_KEY_BYTES]>()
                    .write(bytes);
                (*call).target = WATCH_KEY_BYTES as u32;
            } else if let Ok(bytes) = bpf_probe_read_kernel(key as *const [u8; 4]) {
                core::ptr::addr_of_mut!((*call).path)
                    .cast::<[u8; 4]>()
                    .write(bytes);
                (*call).target = 4;
            } else {
                (*call).target = 0;
            }
        }
    }
    entry.submit(0);
    Some(())
}

/// `security_bpf(int cmd, union bpf_attr *attr, unsigned int size, ...)`.
pub fn security_bpf(ctx: &FEntryContext) -> Option<()> {
    let cmd: u64 = ctx.arg(0);
    let cmd = BpfCmd::from_repr(cmd as u32)?;
    if !matches!(
        cmd,
        BpfCmd::ProgAttach
            | BpfCmd::ProgDetach
            | BpfCmd::LinkCreate
            | BpfCmd::LinkUpdate
            | BpfCmd::LinkDetach
    ) || is_agent()
    {
        return None;
    }
    let attr: u64 = ctx.arg(1);
    // `prog_attach.target_ifindex` (attach, detach) is first; `link_create.target_ifindex`
    // follows its `prog_fd`; the link commands name only the caller's descriptor.
    let offset = match cmd {
        BpfCmd::ProgAttach | BpfCmd::ProgDetach => Some(0u64),
        BpfCmd::LinkCreate => Some(4),
        _ => None,
    };
    let target = offset.map_or(0, |offset| {
        // SAFETY: the kernel's copy of the attributes, read by the helper.
        unsafe { bpf_probe_read_kernel((attr + offset) as *const u32) }.unwrap_or(0)
    });
    report(cmd, 0, target, None, false)
}

/// `security_bpf_map(struct bpf_map *map, fmode_t fmode)`: a new descriptor of a map.
pub fn map_open(ctx: &FEntryContext) -> Option<()> {
    let id = map_id(ctx.arg(0));
    if !is_ipq_map(id) || is_agent() {
        return None;
    }
    report(BpfCmd::MapOpen, id, 0, None, false)
}

/// A write of one entry (`key`) of the map `map`, reported as `cmd` if the map is ipq's.
#[inline(always)]
pub fn map_write(cmd: BpfCmd, map: u64, key: Option<u64>) -> Option<()> {
    let id = map_id(map);
    if !is_ipq_map(id) || is_agent() {
        return None;
    }
    report(cmd, id, 0, key, false)
}

/// `bpf_map_mmap(struct file *filp, struct vm_area_struct *vma)`: reported for ipq's maps with
/// the kernel's count of the map's writable mappings before this one, the agent's own too.
pub fn map_mmap(ctx: &FEntryContext) -> Option<()> {
    let file: u64 = ctx.arg(0);
    let at = file.wrapping_add(u64::from(global(&IPQ_FILE_PRIVATE_DATA_OFFSET)));
    // SAFETY: kernel memory, read by the helper.
    let map = unsafe { bpf_probe_read_kernel(at as *const u64) }.ok()?;
    let id = map_id(map);
    if !is_ipq_map(id) {
        return None;
    }
    let at = map.wrapping_add(u64::from(global(&IPQ_MAP_WRITECNT_OFFSET)));
    // SAFETY: as above; `atomic64_t` is its counter.
    let writable = unsafe { bpf_probe_read_kernel(at as *const i64) }.unwrap_or(-1);
    let writable = u32::try_from(writable).unwrap_or(u32::MAX);
    report(BpfCmd::MapMmap, id, writable, None, is_agent())
}
