//! Crafted frames from a fenced pod, sent through the real kernel to the real agent's programs.

use std::{
    net::Ipv6Addr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    time::{Duration, Instant},
};

use ipq_tests::{
    lab::{mac_bytes, send_frames, Lab, POD_A_V6, POD_B_V6},
    netns::NetNs,
    packets::{
        checksum, ethernet, ipv6, ndp, ETH_P_IPV6, ICMPV6_NA, IPPROTO_DSTOPTS, IPPROTO_HOPOPTS,
    },
};

const AGENT_ARGS: &[&str] = &["--workload", "vethp*", "--uplink", "up0"];
const FRAMES: usize = 10;
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// An unsolicited neighbour advertisement for `target` from link-local `src` and `mac`, to all
/// nodes, behind the extension header `ext` (its next-header byte is set here), with
/// `padding` bytes of unknown options after the target link-layer address option (which a
/// receiver ignores) and a valid ICMPv6 checksum: what the node's stack accepts and acts on.
fn na_behind(mac: [u8; 6], src: Ipv6Addr, target: Ipv6Addr, ext: &[u8], padding: usize) -> Vec<u8> {
    let mut icmp = ndp(ICMPV6_NA, target);
    icmp[8 + 16 + 2..8 + 16 + 8].copy_from_slice(&mac);
    // Unknown option type 200, in chunks of at most 255 units of 8 bytes.
    let mut left = padding / 8;
    while left > 0 {
        let units = left.min(255);
        let mut option = vec![0u8; units * 8];
        option[0] = 200;
        option[1] = units as u8;
        icmp.extend_from_slice(&option);
        left -= units;
    }
    let length = (icmp.len() as u32).to_be_bytes();
    let pseudo = [
        &src.octets()[..],
        &ALL_NODES.octets(),
        &length,
        &[0, 0, 0, 58],
        &icmp,
    ]
    .concat();
    let sum = checksum(&pseudo);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut body = ext.to_vec();
    body[0] = 58;
    body.extend_from_slice(&icmp);
    let mut frame = ethernet(
        ipq_tests::packets::Vlan::Untagged,
        ETH_P_IPV6,
        &ipv6(src, ALL_NODES, ext_protocol(ext), &body),
    )
    .bytes;
    frame[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    frame[6..12].copy_from_slice(&mac);
    frame
}

/// Hop-by-hop for the short headers, destination options for the long one (the header kinds
/// a stack accepts in front of ICMPv6); the length byte says which.
fn ext_protocol(ext: &[u8]) -> u8 {
    if ext.len() == 8 {
        IPPROTO_HOPOPTS
    } else {
        IPPROTO_DSTOPTS
    }
}

/// A hop-by-hop header: one PadN option of 4 bytes.
const HOP_BY_HOP: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];

/// A 64-byte destination-options header: one unknown option of 58 bytes whose type says
/// "skip it" (0x1e, an experimental type), then a PadN of 2. Linux refuses more than 7 bytes
/// of padding in a row, so the length has to come from an option.
fn long_dstopts() -> Vec<u8> {
    let mut header = vec![0u8; 64];
    header[1] = 7;
    header[2] = 0x1e;
    header[3] = 58;
    header[62] = 1;
    header[63] = 0;
    header
}

/// A raw ICMPv6 socket in `ns` bound to `dev`: it gets a copy of every ICMPv6 packet the
/// node's stack accepts there, so it counts what passed the TC ingress program.
fn icmpv6_listener(ns: &NetNs, dev: &str) -> OwnedFd {
    ns.run(|| {
        // SAFETY: plain socket creation; the fd is owned right away.
        let fd = unsafe { libc::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: valid option buffers of the given lengths.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_BINDTODEVICE,
                dev.as_ptr().cast(),
                dev.len() as libc::socklen_t,
            )
        };
        assert_eq!(
            rc,
            0,
            "binding to {dev}: {}",
            std::io::Error::last_os_error()
        );
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 200_000,
        };
        // SAFETY: as above.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "SO_RCVTIMEO: {}", std::io::Error::last_os_error());
        fd
    })
}

/// Neighbour advertisements for `target` the listener received, waiting up to a second.
fn advertisements_received(listener: &OwnedFd, target: Ipv6Addr) -> usize {
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut count = 0;
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        // SAFETY: a valid buffer of the given length.
        let n = unsafe { libc::recv(listener.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            continue; // the receive timeout: look again until the deadline
        }
        let message = &buf[..n as usize];
        if message.len() >= 24 && message[0] == ICMPV6_NA && message[8..24] == target.octets() {
            count += 1;
        }
    }
    count
}

/// Injected: a fenced pod sends neighbour advertisements for its address with a hop-by-hop
/// header in front of ICMPv6 (issue 10 M4) / Holds: every one is dropped at TC ingress and
/// counted as fenced, none reaches the node's stack; an unfenced pod's same frames still pass.
#[test]
fn a_fenced_pods_advertisement_behind_hop_by_hop_is_dropped() {
    let lab = Lab::new().expect("building the lab");
    let agent = lab.start_agent(AGENT_ARGS).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    lab.maps().register_pod_b().expect("registering pod b");
    let link_local: Ipv6Addr = "fe80::77:ff:fe00:a02".parse().expect("valid");

    let cases = [
        (&lab.pod_a, "vethpa", "02:77:00:00:0a:02", POD_A_V6, 0),
        (&lab.pod_b, "vethpb", "02:77:00:00:0b:02", POD_B_V6, FRAMES),
    ];
    // The unfenced pod's frames reach the listener: the fenced pod's zero is the program's.
    for (pod, host_if, mac, target, want_received) in cases {
        let before = agent.scrape().expect("scraping /metrics");
        let listener = icmpv6_listener(&lab.node, host_if);
        let frame = na_behind(mac_bytes(mac), link_local, target, &HOP_BY_HOP, 0);
        send_frames(pod, "eth0", &vec![frame; FRAMES]).expect("sending the advertisements");
        let received = advertisements_received(&listener, target);
        assert_eq!(
            received, want_received,
            "{target}: {received}/{FRAMES} advertisements behind hop-by-hop reached the node"
        );
        let after = agent.scrape().expect("scraping /metrics");
        let dropped = after.changes_since(&before, "ipq_dropped_packets_total");
        let want: Vec<(String, f64)> = if want_received == 0 {
            vec![("hook=tc_ingress,reason=fenced".into(), FRAMES as f64)]
        } else {
            vec![]
        };
        assert_eq!(
            dropped.into_iter().collect::<Vec<_>>(),
            want,
            "{target}: drops counted\nlog:\n{}",
            agent.log()
        );
    }
}

/// Injected: a fenced pod sends 5 KB neighbour advertisements for its address behind a 64-byte
/// destination-options header, through a packet socket, whose skbs keep only the Ethernet
/// header linear / Holds: the TC program pulls the whole chain linear, finds the advertisement,
/// and drops every one; none reaches the node's stack.
#[test]
fn a_fenced_pods_advertisement_behind_a_chain_in_a_short_head_is_dropped() {
    let lab = Lab::new().expect("building the lab");
    // Frames of a page or more leave a packet socket with only the link header linear.
    lab.node
        .ip(&["link", "set", "vethpa", "mtu", "9000"])
        .expect("mtu");
    lab.pod_a
        .ip(&["link", "set", "eth0", "mtu", "9000"])
        .expect("mtu");
    let agent = lab.start_agent(AGENT_ARGS).expect("starting ipq-agent");
    lab.maps().fence_pod_a().expect("fencing pod a");
    let link_local: Ipv6Addr = "fe80::77:ff:fe00:a02".parse().expect("valid");

    let before = agent.scrape().expect("scraping /metrics");
    let listener = icmpv6_listener(&lab.node, "vethpa");
    let frame = na_behind(
        mac_bytes("02:77:00:00:0a:02"),
        link_local,
        POD_A_V6,
        &long_dstopts(),
        5000,
    );
    assert!(frame.len() > 4096, "the frame must be larger than a page");
    send_frames(&lab.pod_a, "eth0", &vec![frame; FRAMES]).expect("sending the advertisements");
    let received = advertisements_received(&listener, POD_A_V6);
    assert_eq!(
        received, 0,
        "{received}/{FRAMES} advertisements reached the node"
    );
    let after = agent.scrape().expect("scraping /metrics");
    assert_eq!(
        after
            .changes_since(&before, "ipq_dropped_packets_total")
            .into_iter()
            .collect::<Vec<_>>(),
        vec![("hook=tc_ingress,reason=fenced".to_owned(), FRAMES as f64)],
        "drops counted\nlog:\n{}",
        agent.log()
    );
}
