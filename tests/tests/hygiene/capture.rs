//! A witness outside the agent: an AF_PACKET socket in a peer's namespace that records the
//! announcements (gratuitous ARP, unsolicited neighbour advertisements) arriving on one of its
//! interfaces, so that a test sees what went on the wire, not what the agent counted.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use ipq_tests::{lab::ifindex, netns::NetNs};

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_ICMPV6: u8 = 58;
const ND_NEIGHBOR_ADVERT: u8 = 136;
const ND_OPT_TARGET_LL_ADDR: u8 = 2;
const PACKET_OUTGOING: u8 = 4;

/// One announcement seen on the wire: `addr` is at `mac`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Announcement {
    pub(crate) addr: IpAddr,
    pub(crate) mac: String,
}

/// Receives every frame arriving on one interface of one namespace.
pub(crate) struct Capture {
    fd: OwnedFd,
}

impl Capture {
    /// Starts capturing on `ifname` in `ns`; frames that arrive before this are not seen.
    pub(crate) fn open(ns: &NetNs, ifname: &str) -> anyhow::Result<Capture> {
        let index = ifindex(ns, ifname)?;
        ns.run(|| -> anyhow::Result<Capture> {
            // SAFETY: plain socket creation.
            let fd = unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                    i32::from(ETH_P_ALL.to_be()),
                )
            };
            if fd < 0 {
                bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
            }
            // SAFETY: a fresh fd nobody else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: sockaddr_ll is plain old data.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_protocol = ETH_P_ALL.to_be();
            addr.sll_ifindex = index as i32;
            // SAFETY: a valid sockaddr_ll of the given length.
            let bound = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if bound != 0 {
                bail!("binding to {ifname}: {}", std::io::Error::last_os_error());
            }
            Ok(Capture { fd })
        })
        .with_context(|| format!("capturing on {ifname} in {}", ns.name()))
    }

    /// The announcements that arrived so far and during the next `window`.
    pub(crate) fn announcements(&self, window: Duration) -> anyhow::Result<Vec<Announcement>> {
        let end = Instant::now() + window;
        let mut seen = Vec::new();
        let mut buf = [0u8; 2048];
        loop {
            // SAFETY: sockaddr_ll is plain old data.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: valid buffers of the given lengths.
            let len = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    0,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if len < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    bail!("receiving: {e}");
                }
                if Instant::now() >= end {
                    return Ok(seen);
                }
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            if from.sll_pkttype == PACKET_OUTGOING {
                continue;
            }
            if let Some(a) = parse(&buf[..len as usize]) {
                seen.push(a);
            }
        }
    }
}

fn mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// A gratuitous ARP (sender and target address the same) or a neighbour advertisement with
/// a target link-layer address option; anything else is `None`.
fn parse(frame: &[u8]) -> Option<Announcement> {
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let body = frame.get(14..)?;
    match ethertype {
        ETH_P_ARP => {
            let arp = body.get(..28)?;
            let (sender_mac, sender, target) = (&arp[8..14], &arp[14..18], &arp[24..28]);
            (sender == target).then(|| Announcement {
                addr: IpAddr::V4(Ipv4Addr::new(sender[0], sender[1], sender[2], sender[3])),
                mac: mac(sender_mac),
            })
        }
        ETH_P_IPV6 => {
            let (ip, icmp) = (body.get(..40)?, body.get(40..)?);
            if ip[6] != IPPROTO_ICMPV6 || *icmp.first()? != ND_NEIGHBOR_ADVERT {
                return None;
            }
            let target: [u8; 16] = icmp.get(8..24)?.try_into().ok()?;
            let option = icmp.get(24..32)?;
            (option[0] == ND_OPT_TARGET_LL_ADDR).then(|| Announcement {
                addr: IpAddr::V6(Ipv6Addr::from(target)),
                mac: mac(&option[2..8]),
            })
        }
        _ => None,
    }
}
