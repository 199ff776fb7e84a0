//! What another tool does to ipq's datapath with raw `bpf()` calls from the test's own process
//! (not the agent's): a link detached or updated through its pin, a program put ahead of
//! ipq's, an entry of one of its maps rewritten. Nothing in the kernel announces these.

use std::{ffi::CString, os::unix::ffi::OsStrExt as _, path::Path};

pub const BPF_PROG_LOAD: libc::c_long = 5;
pub const BPF_OBJ_PIN: libc::c_long = 6;
pub const BPF_OBJ_GET: libc::c_long = 7;
pub const BPF_LINK_CREATE: libc::c_long = 28;
pub const BPF_LINK_UPDATE: libc::c_long = 29;
pub const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
const BPF_F_BEFORE: u32 = 1 << 3;

pub fn bpf(cmd: libc::c_long, attr: &[u8; 64]) -> std::io::Result<i32> {
    // SAFETY: `attr` outlives the call and the pointers in it point to live buffers.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len()) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc as i32)
    }
}

/// `BPF_OBJ_GET` of `path`: a descriptor of the pinned object.
pub fn obj_get(path: &Path) -> std::io::Result<i32> {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let mut attr = [0u8; 64];
    attr[0..8].copy_from_slice(&(c_path.as_ptr() as u64).to_ne_bytes());
    bpf(BPF_OBJ_GET, &attr)
}

/// `bpftool link detach pinned <path>`: the link stays, its program leaves the hook.
pub fn detach_through_pin(path: &Path) {
    let fd = obj_get(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    let detached = bpf(BPF_LINK_DETACH, &attr);
    // SAFETY: our own fd from BPF_OBJ_GET.
    unsafe { libc::close(fd) };
    detached.unwrap_or_else(|e| panic!("detaching {}: {e}", path.display()));
}

/// A foreign program (`TCX_PASS`) loaded on its own: its descriptor.
pub fn foreign_program() -> i32 {
    program_returning(0, "foreign")
}

/// A SCHED_CLS program named `name` (at most 15 bytes) that returns `code` for every packet:
/// `TC_ACT_UNSPEC`/`TCX_NEXT` (-1) hands it on, `TC_ACT_OK`/`TCX_PASS` (0) ends processing.
/// Its descriptor.
pub fn program_returning(code: i32, name: &str) -> i32 {
    // r0 = code (BPF_ALU64 | BPF_MOV | BPF_K, sign-extended); exit
    load_sched_cls(&[mov_r0(code), EXIT], name)
}

/// A SCHED_CLS program that hands every packet on (`TCX_NEXT`, `TC_ACT_UNSPEC`) but ends
/// processing (`TCX_PASS`, `TC_ACT_OK`) for a UDP datagram to or from port `port` over IPv4
/// without options: a co-tenant whose verdict depends on a field of ipq's probe (its port,
/// 0x4951), so a probe of it says "ends processing" while every other packet is handed on.
pub fn program_passing_port(port: u16, name: &str) -> i32 {
    // Where the source port of such a datagram starts: Ethernet and IPv4 headers.
    const PORTS_AT: i16 = 14 + 20;
    // The port as a 2-byte load reads it on a little-endian machine.
    let wire = i32::from(u16::from_ne_bytes(port.to_be_bytes()));
    let insns = [
        // r2 = skb->data, r3 = skb->data_end (struct __sk_buff offsets 76 and 80)
        insn(0x61, 2 | (1 << 4), 76, 0),
        insn(0x61, 3 | (1 << 4), 80, 0),
        // r4 = r2 + PORTS_AT + 4; if r4 > r3 goto next (+4: jumps count from the next one)
        insn(0xbf, 4 | (2 << 4), 0, 0),
        insn(0x07, 4, 0, i32::from(PORTS_AT) + 4),
        insn(0x2d, 4 | (3 << 4), 4, 0),
        // r5 = *(u16 *)(r2 + PORTS_AT + 2) (the destination port); if r5 == port goto pass
        insn(0x69, 5 | (2 << 4), PORTS_AT + 2, 0),
        insn(0x15, 5, 4, wire),
        // r5 = *(u16 *)(r2 + PORTS_AT) (the source port); if r5 == port goto pass
        insn(0x69, 5 | (2 << 4), PORTS_AT, 0),
        insn(0x15, 5, 2, wire),
        // next: r0 = -1; exit
        mov_r0(-1),
        EXIT,
        // pass: r0 = 0; exit
        mov_r0(0),
        EXIT,
    ];
    load_sched_cls(&insns, name)
}

/// One `struct bpf_insn` (`regs`: dst in the low nibble, src in the high one).
fn insn(code: u8, regs: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut out = [0u8; 8];
    out[0] = code;
    out[1] = regs;
    out[2..4].copy_from_slice(&off.to_ne_bytes());
    out[4..8].copy_from_slice(&imm.to_ne_bytes());
    out
}

fn mov_r0(code: i32) -> [u8; 8] {
    insn(0xb7, 0, 0, code)
}

const EXIT: [u8; 8] = [0x95, 0, 0, 0, 0, 0, 0, 0];

fn load_sched_cls(insns: &[[u8; 8]], name: &str) -> i32 {
    assert!(name.len() < 16, "a program name has at most 15 bytes");
    let code: Vec<u8> = insns.iter().flatten().copied().collect();
    let license = b"GPL\0";
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..48 + name.len()].copy_from_slice(name.as_bytes());
    bpf(BPF_PROG_LOAD, &attr).unwrap_or_else(|e| panic!("loading program {name}: {e}"))
}

/// `BPF_OBJ_PIN` of `fd` at `path` (on a bpf filesystem): what `tc ... bpf object-pinned`
/// takes.
pub fn obj_pin(fd: i32, path: &Path) {
    let c_path = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let mut attr = [0u8; 64];
    attr[0..8].copy_from_slice(&(c_path.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(fd as u32).to_ne_bytes());
    bpf(BPF_OBJ_PIN, &attr).unwrap_or_else(|e| panic!("pinning at {}: {e}", path.display()));
}

/// `prog` attached at the head of `ifindex`'s TCX ingress (`BPF_F_BEFORE`, no anchor): the
/// link's descriptor.
pub fn attach_first(prog: i32, ifindex: u32) -> std::io::Result<i32> {
    attach_tcx_first(prog, ifindex, true)
}

/// `prog` attached at the head of `ifindex`'s TCX ingress (`ingress`) or egress: the link's
/// descriptor.
pub fn attach_tcx_first(prog: i32, ifindex: u32, ingress: bool) -> std::io::Result<i32> {
    let mut attr = [0u8; 64];
    let attach_type = if ingress {
        BPF_TCX_INGRESS
    } else {
        BPF_TCX_EGRESS
    };
    attr[0..4].copy_from_slice(&(prog as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    attr[8..12].copy_from_slice(&attach_type.to_ne_bytes());
    attr[12..16].copy_from_slice(&BPF_F_BEFORE.to_ne_bytes());
    bpf(BPF_LINK_CREATE, &attr)
}

/// Another tool's TCX program put first on `ifindex`'s ingress, ahead of ipq's: it returns
/// `TCX_PASS`, which ends processing, so ipq's program never sees a packet. The returned
/// descriptors keep the program and its link alive.
pub fn foreign_program_first(ifindex: u32) -> (i32, i32) {
    let prog = foreign_program();
    let link = attach_first(prog, ifindex).expect("attaching the foreign program first");
    (prog, link)
}

pub const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
/// `BPF_MAP_UPDATE_ELEM`'s attribute size the helpers below pass: `map_fd`, its padding,
/// `key`, `value`, `flags`. (Only the compat entry, x86-64's, passes a size of its own.)
#[cfg(target_arch = "x86_64")]
const MAP_UPDATE_ATTR_BYTES: usize = 32;

/// `BPF_MAP_UPDATE_ELEM` of `key` to `value` in the map `map_fd`, the attribute laid out in
/// `attr` (which must outlive the call with `key` and `value`).
fn map_update_attr(map_fd: i32, key: &[u8], value: &[u8]) -> [u8; 64] {
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&(map_fd as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(value.as_ptr() as u64).to_ne_bytes());
    attr
}

/// `BPF_MAP_UPDATE_ELEM` of `key` to `value` in the map `map_fd`, a plain 64-bit `bpf()`.
pub fn map_update(map_fd: i32, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    bpf(BPF_MAP_UPDATE_ELEM, &map_update_attr(map_fd, key, value)).map(|_| ())
}

/// `BPF_MAP_UPDATE_ELEM` of `key` to `value` in the map `map_fd` through the 32-bit compat
/// entry (`int 0x80`, system call 357: what a 32-bit `bpftool` on a 64-bit kernel makes). The
/// attribute, key and value are copied below 4 GiB (`MAP_32BIT`), where 32-bit pointers reach.
#[cfg(target_arch = "x86_64")]
pub fn compat_map_update(map_fd: i32, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    const NR_BPF_32: u32 = 357;
    const PAGE: usize = 4096;
    assert!(MAP_UPDATE_ATTR_BYTES + key.len() + value.len() <= PAGE);
    // SAFETY: a fresh anonymous private page, unmapped below.
    let page = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_32BIT,
            -1,
            0,
        )
    };
    if page == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    assert!((page as u64) < 1 << 32, "MAP_32BIT gave {page:p}");
    // SAFETY: the page is ours and large enough (asserted above).
    let buf = unsafe { std::slice::from_raw_parts_mut(page.cast::<u8>(), PAGE) };
    let (key_at, value_at) = (64, 64 + key.len());
    buf[key_at..key_at + key.len()].copy_from_slice(key);
    buf[value_at..value_at + value.len()].copy_from_slice(value);
    let attr = map_update_attr(
        map_fd,
        &buf[key_at..key_at + key.len()],
        &buf[value_at..value_at + value.len()],
    );
    buf[..64].copy_from_slice(&attr);
    let rc: i32;
    // SAFETY: the compat system call reads the attribute, key and value in `page`; rbx (which
    // LLVM reserves) is swapped in and out around it; the compat entry may clobber r8-r11.
    unsafe {
        std::arch::asm!(
            "xchg rbx, {cmd}",
            "int 0x80",
            "xchg rbx, {cmd}",
            cmd = inout(reg) BPF_MAP_UPDATE_ELEM as u64 => _,
            inlateout("eax") NR_BPF_32 => rc,
            in("ecx") page as u32,
            in("edx") MAP_UPDATE_ATTR_BYTES as u32,
            out("r8") _,
            out("r9") _,
            out("r10") _,
            out("r11") _,
        );
        libc::munmap(page, PAGE);
    }
    if rc < 0 {
        Err(std::io::Error::from_raw_os_error(-rc))
    } else {
        Ok(())
    }
}

/// In a child process (forked, so that the test's own working directory stays), opens the pin
/// `name` by a path relative to `dir` (`chdir` into it first) and updates `key` to `value`
/// there: the pin's absolute path appears in no call. Returns the child's outcome.
pub fn map_update_by_relative_path(
    dir: &Path,
    name: &str,
    key: &[u8],
    value: &[u8],
) -> std::io::Result<()> {
    let c_dir = CString::new(dir.as_os_str().as_bytes()).expect("no NUL");
    let c_name = CString::new(name).expect("no NUL");
    let mut get = [0u8; 64];
    get[0..8].copy_from_slice(&(c_name.as_ptr() as u64).to_ne_bytes());
    let mut update = map_update_attr(-1, key, value);
    in_child(move || {
        // SAFETY: system calls on buffers prepared before the fork; nothing allocates.
        unsafe {
            if libc::chdir(c_dir.as_ptr()) != 0 {
                return false;
            }
            let fd = libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, get.as_ptr(), get.len());
            if fd < 0 {
                return false;
            }
            update[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                update.as_ptr(),
                update.len(),
            ) == 0
        }
    })
}

/// In a child forked after this process opened `map_fd`: updates `key` to `value` through
/// the inherited descriptor.
pub fn map_update_in_forked_child(map_fd: i32, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    let update = map_update_attr(map_fd, key, value);
    in_child(move || {
        // SAFETY: a system call on a buffer prepared before the fork.
        unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                update.as_ptr(),
                update.len(),
            ) == 0
        }
    })
}

/// Runs `work` in a forked child that exits with its outcome (it must not allocate: the test
/// process has other threads), and waits for it.
fn in_child(work: impl FnOnce() -> bool) -> std::io::Result<()> {
    // SAFETY: the child runs `work` (system calls only) and `_exit`s.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let ok = work();
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { *libc::__errno_location() }) };
    }
    if child < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    if unsafe { libc::waitpid(child, &mut status, 0) } != child {
        return Err(std::io::Error::last_os_error());
    }
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, errno) => Err(std::io::Error::from_raw_os_error(errno)),
        _ => Err(std::io::Error::other(format!(
            "the child ended with status {status}"
        ))),
    }
}
