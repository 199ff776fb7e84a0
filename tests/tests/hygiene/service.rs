//! The Service scenario's parts: a client pod streaming UDP to a virtual IP that the node
//! DNATs to pod A (as kube-proxy's nftables mode does), and `conntrack -L` as the independent
//! witness of what is left.

use std::{
    io::ErrorKind,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use ipq_tests::{lab::POD_A_V4, lab::POD_A_V6, netns::NetNs};

use crate::support::{ip, run};

pub(crate) const POD_C_V4: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 4);
pub(crate) const POD_C_V6: Ipv6Addr = Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, 4);
pub(crate) const VIP_V4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub(crate) const VIP_V6: Ipv6Addr = Ipv6Addr::new(0xfd96, 0, 0, 0, 0, 0, 0, 0x10);
/// One port per family, so that the v4 and v6 listeners of one pod never share a port.
pub(crate) const PORT_V4: u16 = 5300;
pub(crate) const PORT_V6: u16 = 5306;

/// A client pod wired as the lab's pods are (ptp style), but resolving its gateway itself.
pub(crate) fn wire_client(node: &NetNs, pod: &NetNs) -> anyhow::Result<()> {
    ip(
        node,
        &format!(
            "link add vethpc type veth peer name eth0 netns {}",
            pod.name()
        ),
    )?;
    ip(node, "addr add 10.77.0.1/32 dev vethpc")?;
    ip(node, "addr add fe80::1/64 dev vethpc nodad")?;
    ip(node, "link set vethpc up")?;
    ip(pod, &format!("addr add {POD_C_V4}/32 dev eth0"))?;
    ip(pod, &format!("addr add {POD_C_V6}/128 dev eth0 nodad"))?;
    ip(pod, "link set eth0 up")?;
    ip(pod, "route add 10.77.0.1 dev eth0 scope link")?;
    ip(pod, "route add default via 10.77.0.1 dev eth0")?;
    ip(pod, "-6 route add default via fe80::1 dev eth0")?;
    ip(node, &format!("route add {POD_C_V4}/32 dev vethpc"))?;
    ip(node, &format!("-6 route add {POD_C_V6}/128 dev vethpc"))?;
    Ok(())
}

/// The Service: VIP:port over UDP, DNATed to pod A, as kube-proxy's nftables mode does it.
pub(crate) fn add_service(node: &NetNs) -> anyhow::Result<()> {
    run(node, "nft", &["add", "table", "inet", "ipqsvc"])?;
    run(
        node,
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "ipqsvc",
            "pre",
            "{ type nat hook prerouting priority -100; }",
        ],
    )?;
    // kube-proxy's own `ct state` rules keep conntrack on in the node whatever the Service's
    // endpoints; without one, removing the last DNAT rule would switch conntrack off and hide
    // the stale entries from the traffic.
    run(
        node,
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "ipqsvc",
            "track",
            "{ type filter hook forward priority 0; }",
        ],
    )?;
    run(
        node,
        "nft",
        &[
            "add",
            "rule",
            "inet",
            "ipqsvc",
            "track",
            "ct",
            "state",
            "established",
            "accept",
        ],
    )?;
    let rules = [
        format!("ip daddr {VIP_V4} udp dport {PORT_V4} dnat ip to {POD_A_V4}:{PORT_V4}"),
        format!("ip6 daddr {VIP_V6} udp dport {PORT_V6} dnat ip6 to [{POD_A_V6}]:{PORT_V6}"),
    ];
    for rule in rules {
        let mut args = vec!["add", "rule", "inet", "ipqsvc", "pre"];
        args.extend(rule.split_whitespace());
        run(node, "nft", &args)?;
    }
    Ok(())
}

/// Pod A's endpoint leaves the Service: the DNAT is gone, as kube-proxy removes it.
pub(crate) fn remove_backend(node: &NetNs) -> anyhow::Result<()> {
    run(node, "nft", &["flush", "chain", "inet", "ipqsvc", "pre"])?;
    Ok(())
}

/// `conntrack -L` lines (both families) that carry `addr` in any tuple.
pub(crate) fn conntrack_entries_of(node: &NetNs, addr: IpAddr) -> anyhow::Result<Vec<String>> {
    let family = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
    let out = run(node, "conntrack", &["-L", "-f", family])?;
    let needle = format!("={addr} ");
    Ok(out
        .lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_owned)
        .collect())
}

/// A steady UDP stream from pod C to a VIP, one datagram every 5 ms from one source port.
pub(crate) struct Stream {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Stream {
    pub(crate) fn start(client: &NetNs, vip: IpAddr, port: u16) -> Stream {
        let any: IpAddr = if vip.is_ipv4() {
            Ipv4Addr::UNSPECIFIED.into()
        } else {
            Ipv6Addr::UNSPECIFIED.into()
        };
        let socket = client
            .run(|| UdpSocket::bind((any, 0)))
            .expect("binding the client's socket");
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (stop2, sent2) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                // Sends fail while the VIP has no route (ICMP errors); the stream goes on.
                if socket
                    .send_to(format!("svc {n}").as_bytes(), (vip, port))
                    .is_ok()
                {
                    sent2.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Stream {
            stop,
            sent,
            thread: Some(thread),
        }
    }

    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A UDP socket in a pod on `port`, counting the stream's datagrams.
pub(crate) struct Listener(UdpSocket);

impl Listener {
    pub(crate) fn bind(pod: &NetNs, v6: bool, port: u16) -> anyhow::Result<Listener> {
        let any: IpAddr = if v6 {
            Ipv6Addr::UNSPECIFIED.into()
        } else {
            Ipv4Addr::UNSPECIFIED.into()
        };
        let socket = pod
            .run(|| UdpSocket::bind((any, port)))
            .with_context(|| format!("binding UDP port {port} in {}", pod.name()))?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        Ok(Listener(socket))
    }

    /// The stream's datagrams received during `window`.
    pub(crate) fn count(&self, window: Duration) -> anyhow::Result<usize> {
        let end = Instant::now() + window;
        let mut got = 0;
        let mut buf = [0u8; 64];
        while Instant::now() < end {
            match self.0.recv_from(&mut buf) {
                Ok((len, _)) if buf[..len].starts_with(b"svc ") => got += 1,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(e) => bail!("receiving: {e}"),
            }
        }
        Ok(got)
    }
}
