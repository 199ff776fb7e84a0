//! The co-tenant probe's sending side (`ipq_common::probe`): a marked UDP datagram of one of
//! an interface's addresses, put through one of its TC hooks as the kernel puts real packets
//! through it, and whether ipq's program (behind whatever runs ahead) counted it.
//!
//! - Egress: the frame is sent on the interface with an `AF_PACKET` socket (`CAP_NET_RAW`),
//!   which goes through its egress hook (clsact filters or TCX programs) as a routed packet
//!   does; the qdisc bypass is not asked for.
//! - Ingress: an XDP program of the agent's own (two instructions, `XDP_PASS`) is run with
//!   `BPF_PROG_TEST_RUN` and `BPF_F_TEST_XDP_LIVE_FRAMES` (Linux 5.18+) with the interface as
//!   `ingress_ifindex`: the kernel hands the frame to the stack as received there, through its
//!   ingress hook (`CAP_BPF` and `CAP_NET_ADMIN` load the program; running it needs nothing
//!   more). Where the kernel refuses, the ingress hook cannot be probed and says why.
//!
//! Both run the hook in the calling thread: when the system call returns, ipq's program has
//! counted the probe in `IPQ_PROBES` or never will. Probes go one at a time (a lock), so a
//! count that moved is this probe's. ipq's program drops what it counts. One that never gets
//! there is what the co-tenant did with it: dropped, redirected, or passed on. Passed on
//! egress, it reaches the workload's interface with a destination MAC that is not the
//! workload's, which its stack discards; passed on ingress, it is addressed to no MAC of the
//! node, and the stack discards it before routing.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    sync::{Mutex, OnceLock},
};

use ipq_common::{
    counters::Hook,
    probe::{ProbeMark, PROBE_PEER_V4, PROBE_PEER_V6, PROBE_PORT},
};

use super::tc_filter::Direction;
use crate::datapath::bpf_call::bpf;

/// What probing needs, set up once the datapath is loaded ([`install`]).
struct Setup {
    /// `IPQ_PROBES`, opened read-only from its pin.
    seen: OwnedFd,
    cookie: u32,
    /// The agent's XDP program that injects ingress probes, or why it did not load.
    injector: Result<OwnedFd, String>,
}

static SETUP: OnceLock<Result<Setup, String>> = OnceLock::new();
/// One probe at a time: the count that moves is the probe's own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Makes probing possible: `seen` is the pin of `IPQ_PROBES`, `cookie` what the programs
/// expect (already in `IPQ_CONFIG`). Once per process; a second call changes nothing.
pub fn install(seen: &Path, cookie: u32) {
    let _ = SETUP.get_or_init(|| {
        let seen = obj_get_read_only(seen)
            .map_err(|e| format!("opening {} read-only: {e}", seen.display()))?;
        let injector = load_injector().map_err(|e| {
            format!("the agent's XDP program that injects ingress probes did not load: {e}")
        });
        Ok(Setup {
            seen,
            cookie,
            injector,
        })
    });
}

/// Whether a probe of `address` put through `direction` of `ifindex` reached ipq's program
/// there; `Err` says why no probe could be put through.
pub fn reaches_ipq(ifindex: u32, direction: Direction, address: IpAddr) -> Result<bool, String> {
    let setup = match SETUP.get() {
        Some(Ok(setup)) => setup,
        Some(Err(why)) => return Err(why.clone()),
        None => return Err("the agent has not loaded its datapath".to_owned()),
    };
    let hook = match direction {
        Direction::Ingress => Hook::TcIngress,
        Direction::Egress => Hook::TcEgress,
    };
    let frame = frame(
        address,
        direction,
        ProbeMark {
            cookie: setup.cookie,
            ifindex,
            hook: hook as u32,
            _reserved: 0,
        },
    );
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for _ in 0..TRIES {
        if put_through(setup, ifindex, direction, hook, &frame)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Probes sent before one that never reached ipq's program counts: the kernel may lose a
/// frame of its own accord (a live frame whose skb it cannot allocate is dropped without an
/// error), and one loss must not make a co-tenant a bypass.
const TRIES: usize = 3;

/// One probe: whether ipq's program counted it.
fn put_through(
    setup: &Setup,
    ifindex: u32,
    direction: Direction,
    hook: Hook,
    frame: &[u8],
) -> Result<bool, String> {
    let before = count(&setup.seen, hook).map_err(|e| format!("reading IPQ_PROBES: {e}"))?;
    match direction {
        Direction::Egress => send(ifindex, frame).map_err(|e| {
            format!("sending a probe on the interface (an AF_PACKET socket, CAP_NET_RAW): {e}")
        })?,
        Direction::Ingress => {
            let injector = setup.injector.as_ref().map_err(Clone::clone)?;
            inject(injector, ifindex, frame).map_err(|e| match e.raw_os_error() {
                Some(libc::EINVAL) => "the kernel cannot inject a frame as received on the \
                                       interface (BPF_F_TEST_XDP_LIVE_FRAMES, Linux 5.18+)"
                    .to_owned(),
                _ => format!("injecting a probe as received on the interface: {e}"),
            })?;
        }
    }
    let after = count(&setup.seen, hook).map_err(|e| format!("reading IPQ_PROBES: {e}"))?;
    Ok(after != before)
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_F_RDONLY: u32 = 1 << 3;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
const BPF_PROG_TYPE_XDP: u32 = 6;
const XDP_PASS: i32 = 2;

fn owned(fd: i32) -> OwnedFd {
    // SAFETY: a new fd the kernel just returned, owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn obj_get_read_only(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut name = path.as_os_str().as_bytes().to_vec();
    name.push(0);
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
    attr[12..16].copy_from_slice(&BPF_F_RDONLY.to_ne_bytes());
    bpf(BPF_OBJ_GET, &attr).map(owned)
}

/// The count of `hook`'s probes.
fn count(map: &OwnedFd, hook: Hook) -> io::Result<u64> {
    let key = hook as u32;
    let mut value = 0u64;
    let mut attr = [0u8; 32];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(std::ptr::from_ref(&key) as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(std::ptr::from_mut(&mut value) as u64).to_ne_bytes());
    bpf(BPF_MAP_LOOKUP_ELEM, &attr)?;
    Ok(value)
}

/// `r0 = XDP_PASS; exit`: every frame it is run on goes on to the stack.
fn load_injector() -> io::Result<OwnedFd> {
    let mut code = Vec::with_capacity(16);
    // BPF_ALU64 | BPF_MOV | BPF_K, dst r0.
    code.extend_from_slice(&[0xb7, 0, 0, 0]);
    code.extend_from_slice(&XDP_PASS.to_ne_bytes());
    // BPF_JMP | BPF_EXIT.
    code.extend_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(code.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..58].copy_from_slice(b"ipq_inject");
    bpf(BPF_PROG_LOAD, &attr).map(owned)
}

/// Runs the injector on `frame` as received on `ifindex`, live: the frame goes on to the stack.
fn inject(injector: &OwnedFd, ifindex: u32, frame: &[u8]) -> io::Result<()> {
    // struct xdp_md { data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex }: the kernel wants data_end to be the frame's length.
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    // struct { prog_fd, retval, data_size_in, data_size_out, data_in, data_out, repeat,
    // duration, ctx_size_in, ctx_size_out, ctx_in, ctx_out, flags, cpu, batch_size }
    let mut attr = [0u8; 80];
    attr[0..4].copy_from_slice(&(injector.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    attr[16..24].copy_from_slice(&(frame.as_ptr() as u64).to_ne_bytes());
    attr[32..36].copy_from_slice(&1u32.to_ne_bytes());
    attr[40..44].copy_from_slice(&(ctx.len() as u32).to_ne_bytes());
    attr[48..56].copy_from_slice(&(ctx.as_ptr() as u64).to_ne_bytes());
    attr[64..68].copy_from_slice(&BPF_F_TEST_XDP_LIVE_FRAMES.to_ne_bytes());
    bpf(BPF_PROG_TEST_RUN, &attr).map(drop)
}

/// Sends `frame` on `ifindex` through its egress hook.
fn send(ifindex: u32, frame: &[u8]) -> io::Result<()> {
    // Protocol 0: the socket receives nothing.
    // SAFETY: plain system calls on a socket this function owns; the address and frame outlive
    // them.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let socket = owned(fd);
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_ifindex = ifindex as i32;
    to.sll_halen = 6;
    let sent = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            std::ptr::from_ref(&to).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    if sent < 0 {
        let e = io::Error::last_os_error();
        // The transmit path dropped the frame (`NET_XMIT_DROP`, as ENOBUFS): what ipq's
        // program does with every probe it sees, and what a co-tenant that drops does. The
        // count says which.
        if e.raw_os_error() != Some(libc::ENOBUFS) {
            return Err(e);
        }
    }
    Ok(())
}

/// A probe of `address` as the hook sees its traffic: from it on ingress (the workload sends),
/// to it on egress (the workload receives), the other end the probe's peer. Locally
/// administered MACs that are neither the workload's nor the node's: a probe that gets past
/// ipq is discarded by the stack that receives it.
pub fn frame(address: IpAddr, direction: Direction, mark: ProbeMark) -> Vec<u8> {
    const POD_MAC: [u8; 6] = [0x02, 0x49, 0x51, 0, 0, 0x01];
    const HOST_MAC: [u8; 6] = [0x02, 0x49, 0x51, 0, 0, 0x02];
    let (dst_mac, src_mac) = match direction {
        Direction::Ingress => (HOST_MAC, POD_MAC),
        Direction::Egress => (POD_MAC, HOST_MAC),
    };
    let mut payload = Vec::with_capacity(16);
    for word in [mark.cookie, mark.ifindex, mark.hook, mark._reserved] {
        payload.extend_from_slice(&word.to_ne_bytes());
    }
    let udp_len = 8 + payload.len();
    let mut frame = Vec::with_capacity(14 + 40 + udp_len);
    frame.extend_from_slice(&dst_mac);
    frame.extend_from_slice(&src_mac);
    match address {
        IpAddr::V4(v4) => {
            let peer = Ipv4Addr::from(PROBE_PEER_V4);
            let (src, dst) = match direction {
                Direction::Ingress => (v4, peer),
                Direction::Egress => (peer, v4),
            };
            frame.extend_from_slice(&0x0800u16.to_be_bytes());
            let mut ip = [0u8; 20];
            ip[0] = 0x45;
            ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            ip[8] = 64;
            ip[9] = 17;
            ip[12..16].copy_from_slice(&src.octets());
            ip[16..20].copy_from_slice(&dst.octets());
            let sum = checksum(&ip, 0);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
            frame.extend_from_slice(&ip);
            // UDP over IPv4 may go without a checksum (0).
            frame.extend_from_slice(&udp(udp_len, &payload, 0));
        }
        IpAddr::V6(v6) => {
            let peer = Ipv6Addr::from(PROBE_PEER_V6);
            let (src, dst) = match direction {
                Direction::Ingress => (v6, peer),
                Direction::Egress => (peer, v6),
            };
            frame.extend_from_slice(&0x86ddu16.to_be_bytes());
            let mut ip = [0u8; 40];
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&src.octets());
            ip[24..40].copy_from_slice(&dst.octets());
            frame.extend_from_slice(&ip);
            // The pseudo-header's sum: addresses, length, next header.
            let mut pseudo = Vec::with_capacity(40);
            pseudo.extend_from_slice(&src.octets());
            pseudo.extend_from_slice(&dst.octets());
            pseudo.extend_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
            let mut datagram = udp(udp_len, &payload, 0);
            let sum = checksum(&datagram, sum_words(&pseudo));
            datagram[6..8].copy_from_slice(&(if sum == 0 { 0xffff } else { sum }).to_be_bytes());
            frame.extend_from_slice(&datagram);
        }
    }
    frame
}

fn udp(len: usize, payload: &[u8], sum: u16) -> Vec<u8> {
    let mut datagram = Vec::with_capacity(len);
    datagram.extend_from_slice(&PROBE_PORT.to_be_bytes());
    datagram.extend_from_slice(&PROBE_PORT.to_be_bytes());
    datagram.extend_from_slice(&(len as u16).to_be_bytes());
    datagram.extend_from_slice(&sum.to_be_bytes());
    datagram.extend_from_slice(payload);
    datagram
}

/// The one's complement sum of `bytes` as 16-bit words (unfolded), added to `start`.
fn sum_words(bytes: &[u8]) -> u32 {
    bytes
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum()
}

/// The Internet checksum of `bytes`, with `start` (a pseudo-header's sum) added.
fn checksum(bytes: &[u8], start: u32) -> u16 {
    let mut sum = start + sum_words(bytes);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use ipq_common::probe::{PROBE_MARK_OFFSET_V4, PROBE_MARK_OFFSET_V6};

    use super::*;

    const MARK: ProbeMark = ProbeMark {
        cookie: 0x1234_5678,
        ifindex: 7,
        hook: 1,
        _reserved: 0,
    };

    #[test]
    fn an_ipv4_probe_has_a_valid_header_checksum_and_its_mark_where_the_program_reads_it() {
        let sent = frame("10.1.0.2".parse().unwrap(), Direction::Ingress, MARK);
        assert_eq!(checksum(&sent[14..34], 0), 0, "{sent:02x?}");
        assert_eq!(&sent[26..30], &[10, 1, 0, 2], "source on ingress");
        assert_eq!(&sent[30..34], &PROBE_PEER_V4, "the peer on ingress");
        let received = frame("10.1.0.2".parse().unwrap(), Direction::Egress, MARK);
        assert_eq!(&received[30..34], &[10, 1, 0, 2], "destination on egress");
        assert_eq!(
            &received[PROBE_MARK_OFFSET_V4..PROBE_MARK_OFFSET_V4 + 4],
            &MARK.cookie.to_ne_bytes()
        );
        assert_eq!(&received[36..38], &PROBE_PORT.to_be_bytes());
    }

    #[test]
    fn an_ipv6_probe_has_a_valid_udp_checksum_and_its_mark_where_the_program_reads_it() {
        let address: Ipv6Addr = "fd00::2".parse().unwrap();
        let frame = frame(IpAddr::V6(address), Direction::Egress, MARK);
        let datagram = &frame[54..];
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&frame[22..54]);
        pseudo.extend_from_slice(&(datagram.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 17]);
        assert_eq!(checksum(datagram, sum_words(&pseudo)), 0);
        assert_eq!(&frame[22..38], &PROBE_PEER_V6, "the peer on egress");
        assert_eq!(
            &frame[PROBE_MARK_OFFSET_V6 + 4..PROBE_MARK_OFFSET_V6 + 8],
            &7u32.to_ne_bytes()
        );
    }
}
