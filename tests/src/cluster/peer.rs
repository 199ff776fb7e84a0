//! The witness at the peer: a raw ICMP socket in the peer's namespace that records every echo
//! request arriving, by source address and payload size. Pods ping the peer with a payload size
//! of their own (their "signature", as busybox's nc has no UDP), so a test can say which pod
//! reached the peer with which source address, and when.

use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Instant,
};

use anyhow::Context as _;

use crate::netns::NetNs;

/// One echo request as the peer got it.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub src: IpAddr,
    /// The ICMP payload's size (`ping -s`).
    pub size: usize,
    pub at: Instant,
}

/// A listener recording every echo request until dropped.
pub struct Witness {
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
}

const IPV4_HEADER: usize = 20;
const ICMP_HEADER: usize = 8;
const ECHO_REQUEST: u8 = 8;

fn raw_icmp_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Reads wake up every 100 ms so that the reader sees `stop`.
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: a valid fd and a timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

impl Witness {
    pub fn start(peer: &NetNs) -> anyhow::Result<Witness> {
        // The socket keeps the namespace it was made in.
        let socket = peer
            .run(raw_icmp_socket)
            .context("opening the peer's raw ICMP socket")?;
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log, stopped) = (Arc::clone(&arrivals), Arc::clone(&stop));
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stopped.load(Ordering::Relaxed) {
                // SAFETY: buf is valid for its length; the fd lives as long as this thread.
                let n = unsafe {
                    libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                };
                let Ok(n) = usize::try_from(n) else {
                    continue;
                };
                // A raw IPv4 socket gets the IP header (without options here) first.
                if n < IPV4_HEADER + ICMP_HEADER || buf[IPV4_HEADER] != ECHO_REQUEST {
                    continue;
                }
                let src = Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]);
                log.lock().expect("no panic holds the lock").push(Arrival {
                    src: IpAddr::V4(src),
                    size: n - IPV4_HEADER - ICMP_HEADER,
                    at: Instant::now(),
                });
            }
        });
        Ok(Witness { arrivals, stop })
    }

    /// When the echo requests from `src` (any source: None) with a payload of `size` bytes
    /// arrived after `since`.
    fn arrived(&self, src: Option<IpAddr>, size: usize, since: Instant) -> Vec<Instant> {
        self.arrivals
            .lock()
            .expect("no panic holds the lock")
            .iter()
            .filter(|a| src.is_none_or(|src| a.src == src) && a.size == size && a.at >= since)
            .map(|a| a.at)
            .collect()
    }

    /// When the first echo request from `src` with a payload of `size` bytes arrived after
    /// `since`.
    pub fn first(&self, src: IpAddr, size: usize, since: Instant) -> Option<Instant> {
        self.arrived(Some(src), size, since).into_iter().min()
    }

    /// When the last echo request from `src` with a payload of `size` bytes arrived after
    /// `since`.
    pub fn last(&self, src: IpAddr, size: usize, since: Instant) -> Option<Instant> {
        self.arrived(Some(src), size, since).into_iter().max()
    }

    /// The echo requests from `src` with a payload of `size` bytes, arrived after `since`.
    pub fn count(&self, src: IpAddr, size: usize, since: Instant) -> usize {
        self.arrived(Some(src), size, since).len()
    }

    /// The echo requests with a payload of `size` bytes from any source, arrived after
    /// `since`: for pods whose source address a masquerade rewrites on the way (flannel's
    /// `--ip-masq` gives the node's), told apart by their size alone.
    pub fn count_sized(&self, size: usize, since: Instant) -> usize {
        self.arrived(None, size, since).len()
    }
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
