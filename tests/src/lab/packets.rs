//! Traffic through the lab: UDP bursts and pings counted at the receiver, senders bound to an
//! address or a device, crafted frames on the wire.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    time::Duration,
};

use anyhow::bail;

use crate::netns::{unique, NetNs};

use super::*;

/// Sends `n` small UDP datagrams from `from` to `dst` (which lives in `to`) and returns how many
/// arrived. The receiver is bound before the first send; the count stops at `n` or after
/// 500 ms of silence, which is ample on veths where delivery is synchronous (also under
/// emulation, so this wait is not scaled: it is spent in full on every dropped burst).
pub fn udp_burst(from: &NetNs, to: &NetNs, dst: IpAddr, n: usize) -> usize {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    // A socket stays in the namespace it was made in, whichever thread uses it later.
    let rx = to
        .run(|| UdpSocket::bind((any, 0)))
        .unwrap_or_else(|e| panic!("binding a UDP receiver in {}: {e}", to.name()));
    let port = rx.local_addr().expect("bound").port();
    let tag = format!("ipq-test {}", unique("burst"));
    from.run(|| {
        let tx = UdpSocket::bind((any, 0)).expect("binding the UDP sender");
        for i in 0..n {
            tx.send_to(format!("{tag} {i}").as_bytes(), (dst, port))
                .unwrap_or_else(|e| panic!("sending to {dst}:{port} from {}: {e}", from.name()));
        }
    });
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("setting a timeout");
    let mut received = 0;
    let mut buf = [0u8; 256];
    while received < n {
        match rx.recv_from(&mut buf) {
            // Only our own datagrams count.
            Ok((len, _)) if buf[..len].starts_with(tag.as_bytes()) => received += 1,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("receiving in {}: {e}", to.name()),
        }
    }
    received
}

/// `ping -c n` from inside `from`; returns how many replies came back. Panics if ping did not
/// send exactly `n` requests, since callers compare counters with `n`.
pub fn ping(from: &NetNs, dst: IpAddr, n: u32) -> u32 {
    let out = from
        .command("ping")
        .args(["-n", "-q", "-c", &n.to_string(), "-i", "0.02", "-W", "1"])
        .arg(dst.to_string())
        .output()
        .unwrap_or_else(|e| panic!("running ping (cargo xtask setup installs iputils-ping): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // "5 packets transmitted, 5 received, 0% packet loss, time 81ms"
    let summary = stdout
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| {
            panic!(
                "no summary from ping {dst} in {}: {stdout}{}",
                from.name(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let count = |what: &str| -> u32 {
        summary
            .split(',')
            .find(|part| part.contains(what))
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no '{what}' count in {summary:?}"))
    };
    let transmitted = count("transmitted");
    assert_eq!(
        transmitted, n,
        "ping {dst} sent {transmitted} requests, not {n}"
    );
    count("received")
}

/// `"02:77:00:00:0a:01"` → its six bytes.
pub fn mac_bytes(mac: &str) -> [u8; 6] {
    let mut bytes = [0u8; 6];
    let parts: Vec<u8> = mac
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).unwrap_or_else(|e| panic!("bad MAC {mac:?}: {e}")))
        .collect();
    assert_eq!(parts.len(), 6, "bad MAC {mac:?}");
    bytes.copy_from_slice(&parts);
    bytes
}

/// How the sender of [`udp_burst_with`] is set up.
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpSender<'a> {
    /// Source address to bind to (else the kernel picks one).
    pub bind: Option<IpAddr>,
    /// Interface to bind to (SO_BINDTODEVICE), for a node socket that must leave through one
    /// pod's veth.
    pub device: Option<&'a str>,
}

/// What a pod gets through with `addr`, `n` datagrams each way: (sent from `addr` in `pod` to
/// `peer` in the peer's namespace, sent from the node through `veth`, the pod's host side, to
/// `addr` in `pod`). A fenced address gets (0, 0).
pub fn pod_traffic(
    lab: &Lab,
    pod: &NetNs,
    veth: &str,
    addr: IpAddr,
    peer: IpAddr,
    n: usize,
) -> (usize, usize) {
    let out = udp_burst_with(
        pod,
        UdpSender {
            bind: Some(addr),
            device: None,
        },
        &lab.peer,
        peer,
        n,
    );
    let inbound = udp_burst_with(
        &lab.node,
        UdpSender {
            bind: None,
            device: Some(veth),
        },
        pod,
        addr,
        n,
    );
    (out, inbound)
}

/// [`pod_traffic`] of pod a (behind vethpa).
pub fn pod_a_traffic(lab: &Lab, addr: IpAddr, peer: IpAddr, n: usize) -> (usize, usize) {
    pod_traffic(lab, &lab.pod_a, "vethpa", addr, peer, n)
}

/// Binds `socket` to interface `dev` (SO_BINDTODEVICE).
pub fn bind_to_device(socket: &UdpSocket, dev: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a valid socket and a buffer of the given length.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_BINDTODEVICE,
            dev.as_ptr().cast(),
            dev.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// As [`udp_burst`], with the sender bound as `sender` says. Returns how many of the `n`
/// datagrams arrived; panics if the kernel refuses a send.
pub fn udp_burst_with(
    from: &NetNs,
    sender: UdpSender<'_>,
    to: &NetNs,
    dst: IpAddr,
    n: usize,
) -> usize {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let rx = to
        .run(|| UdpSocket::bind((any, 0)))
        .unwrap_or_else(|e| panic!("binding a UDP receiver in {}: {e}", to.name()));
    let port = rx.local_addr().expect("bound").port();
    let tag = format!("ipq-test {}", unique("burst"));
    from.run(|| {
        let tx = UdpSocket::bind((sender.bind.unwrap_or(any), 0)).unwrap_or_else(|e| {
            panic!(
                "binding the UDP sender to {:?} in {}: {e}",
                sender.bind,
                from.name()
            )
        });
        if let Some(dev) = sender.device {
            bind_to_device(&tx, dev)
                .unwrap_or_else(|e| panic!("SO_BINDTODEVICE {dev} in {}: {e}", from.name()));
        }
        for i in 0..n {
            // A send the kernel refuses (no route...) is a broken setup, not a drop: a packet
            // the datapath drops still leaves the socket successfully.
            tx.send_to(format!("{tag} {i}").as_bytes(), (dst, port))
                .unwrap_or_else(|e| {
                    panic!(
                        "sending to {dst}:{port} from {} ({sender:?}): {e}",
                        from.name()
                    )
                });
        }
    });
    rx.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("setting a timeout");
    let mut received = 0;
    let mut buf = [0u8; 256];
    while received < n {
        match rx.recv_from(&mut buf) {
            Ok((len, _)) if buf[..len].starts_with(tag.as_bytes()) => received += 1,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("receiving in {}: {e}", to.name()),
        }
    }
    received
}

/// Sends each of `frames` (whole Ethernet frames) out of `ifname` in `ns` through an AF_PACKET
/// raw socket: gratuitous ARP, unsolicited neighbour advertisements, anything no tool is
/// needed for.
pub fn send_frames(ns: &NetNs, ifname: &str, frames: &[Vec<u8>]) -> anyhow::Result<()> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let index = ifindex(ns, ifname)?;
    ns.run(|| -> anyhow::Result<()> {
        // Protocol 0: this socket only sends, it receives nothing.
        // SAFETY: plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            bail!("AF_PACKET socket: {}", std::io::Error::last_os_error());
        }
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        for frame in frames {
            // SAFETY: sockaddr_ll is plain old data.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = libc::AF_PACKET as u16;
            addr.sll_ifindex = index as i32;
            addr.sll_halen = 6;
            addr.sll_addr[..6].copy_from_slice(&frame[..6]);
            // SAFETY: valid buffers of the given lengths.
            let sent = unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    frame.as_ptr().cast(),
                    frame.len(),
                    0,
                    (&addr as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
                )
            };
            if sent != frame.len() as isize {
                bail!(
                    "sending a {}-byte frame on {ifname}: {}",
                    frame.len(),
                    std::io::Error::last_os_error()
                );
            }
        }
        Ok(())
    })
}
