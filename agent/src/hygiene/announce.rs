//! Announcing a reused address's new holder on its L2 segment: a gratuitous ARP (IPv4, an ARP
//! announcement as RFC 5227 spells it) or an unsolicited neighbour advertisement with the
//! override flag (IPv6, RFC 4861 §7.2.6), carrying the holder's MAC, sent through an
//! AF_PACKET socket so that peers which still resolve the address to the old holder's MAC
//! correct their caches at once instead of when they expire.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::Instant,
};

const ETH_P_ARP: u16 = 0x0806;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_ICMPV6: u8 = 58;
const ND_NEIGHBOR_ADVERT: u8 = 136;
/// The override flag of a neighbour advertisement: replace whatever the cache says.
const NA_FLAG_OVERRIDE: u32 = 0x2000_0000;
const ND_OPT_TARGET_LL_ADDR: u8 = 2;
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The frame that announces `addr` at `mac`.
pub fn frame(addr: IpAddr, mac: [u8; 6]) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => gratuitous_arp(a, mac),
        IpAddr::V6(a) => unsolicited_na(a, mac),
    }
}

fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(14 + payload.len());
    frame.extend_from_slice(&dst);
    frame.extend_from_slice(&src);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// An ARP request with the address as both sender and target, broadcast.
fn gratuitous_arp(addr: Ipv4Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut arp = Vec::with_capacity(28);
    arp.extend_from_slice(&1u16.to_be_bytes()); // Ethernet
    arp.extend_from_slice(&0x0800u16.to_be_bytes()); // IPv4
    arp.extend_from_slice(&[6, 4]);
    arp.extend_from_slice(&1u16.to_be_bytes()); // request
    arp.extend_from_slice(&mac);
    arp.extend_from_slice(&addr.octets());
    arp.extend_from_slice(&[0; 6]);
    arp.extend_from_slice(&addr.octets());
    ethernet([0xff; 6], mac, ETH_P_ARP, &arp)
}

/// An unsolicited neighbour advertisement (override set, solicited clear) to all nodes.
fn unsolicited_na(addr: Ipv6Addr, mac: [u8; 6]) -> Vec<u8> {
    let mut icmp = Vec::with_capacity(32);
    icmp.extend_from_slice(&[ND_NEIGHBOR_ADVERT, 0, 0, 0]);
    icmp.extend_from_slice(&NA_FLAG_OVERRIDE.to_be_bytes());
    icmp.extend_from_slice(&addr.octets());
    icmp.extend_from_slice(&[ND_OPT_TARGET_LL_ADDR, 1]);
    icmp.extend_from_slice(&mac);
    let sum = icmpv6_checksum(addr, ALL_NODES, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut ip = Vec::with_capacity(40 + icmp.len());
    ip.extend_from_slice(&[0x60, 0, 0, 0]);
    ip.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[IPPROTO_ICMPV6, 255]);
    ip.extend_from_slice(&addr.octets());
    ip.extend_from_slice(&ALL_NODES.octets());
    ip.extend_from_slice(&icmp);
    let mut dst = [0x33, 0x33, 0, 0, 0, 0];
    dst[2..].copy_from_slice(&ALL_NODES.octets()[12..]);
    ethernet(dst, mac, ETH_P_IPV6, &ip)
}

fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, body: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + body.len());
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(body.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, IPPROTO_ICMPV6]);
    pseudo.extend_from_slice(body);
    let mut sum: u32 = pseudo
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A send-only AF_PACKET socket.
pub struct Announcer {
    fd: OwnedFd,
    bucket: TokenBucket,
}

impl Announcer {
    pub fn open(per_second: u32) -> io::Result<Self> {
        // Protocol 0: the socket only sends.
        // SAFETY: plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: a fresh fd nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            bucket: TokenBucket::new(per_second),
        })
    }

    /// Whether the rate limit lets one more announcement go now.
    pub fn may_send(&mut self) -> bool {
        self.bucket.take(Instant::now())
    }

    /// Sends `frame` out of `ifindex`.
    pub fn send(&self, ifindex: u32, frame: &[u8]) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: valid buffers of the given lengths.
        let sent = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if sent != frame.len() as isize {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// At most `rate` per second on average, bursts of up to `rate`.
struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn new(per_second: u32) -> Self {
        let rate = f64::from(per_second.max(1));
        Self {
            rate,
            tokens: rate,
            last: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last);
        self.last = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.rate);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MAC: [u8; 6] = [0x02, 0x77, 0, 0, 0x0b, 0x02];

    #[test]
    fn a_gratuitous_arp_names_the_address_as_sender_and_target() {
        let f = frame("10.77.0.2".parse().unwrap(), MAC);
        assert_eq!(f.len(), 42);
        assert_eq!(&f[..6], &[0xff; 6]);
        assert_eq!(&f[6..12], &MAC);
        assert_eq!(&f[12..14], &[0x08, 0x06]);
        assert_eq!(&f[20..22], &[0, 1], "an ARP request");
        assert_eq!(&f[22..28], &MAC, "sender MAC");
        assert_eq!(&f[28..32], &[10, 77, 0, 2], "sender address");
        assert_eq!(&f[38..42], &[10, 77, 0, 2], "target address");
    }

    #[test]
    fn an_unsolicited_na_overrides_and_its_checksum_verifies() {
        let addr: Ipv6Addr = "fd77::2".parse().unwrap();
        let f = frame(IpAddr::V6(addr), MAC);
        assert_eq!(&f[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        let ip = &f[14..];
        assert_eq!(ip[6], IPPROTO_ICMPV6);
        assert_eq!(ip[7], 255, "hop limit 255, or receivers drop it");
        let icmp = &ip[40..];
        assert_eq!(icmp[0], ND_NEIGHBOR_ADVERT);
        assert_eq!(icmp[4] & 0x60, 0x20, "override set, solicited clear");
        assert_eq!(&icmp[8..24], &addr.octets());
        assert_eq!(&icmp[26..32], &MAC);
        assert_eq!(icmpv6_checksum(addr, ALL_NODES, icmp), 0, "checksum");
    }

    #[test]
    fn the_bucket_lets_a_burst_through_then_the_rate() {
        let mut bucket = TokenBucket::new(2);
        let t0 = bucket.last;
        assert!(bucket.take(t0));
        assert!(bucket.take(t0));
        assert!(!bucket.take(t0), "burst of 2 spent");
        assert!(bucket.take(t0 + Duration::from_millis(500)));
        assert!(!bucket.take(t0 + Duration::from_millis(600)));
    }
}
