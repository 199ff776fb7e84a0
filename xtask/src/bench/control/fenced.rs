//! A fenced pod that keeps sending while the agent restarts: what gets through counts.
//!
//! The pod (its own namespace, veth `bwf` on the node, static neighbours both ways so that no
//! ARP is needed) sends UDP to the node. Its address is then claimed through the API by another
//! workload interface: under `fence-old` the pod is fenced, and its packets must be dropped
//! by the pinned programs whether or not an agent runs.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::Duration,
};

use anyhow::{bail, Result};

use super::node::{api, Node, Pod};

const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 1);
const POD_ADDR: Ipv4Addr = Ipv4Addr::new(10, 251, 0, 2);
const PORT: u16 = 9999;

pub struct Fenced {
    pod: Pod,
    receiver: UdpSocket,
    sender: UdpSocket,
}

impl Fenced {
    /// Wires the pod, checks that its traffic flows, fences it, and checks that it no longer
    /// does.
    pub fn new(node: &Node) -> Result<Fenced> {
        let pod = Pod::new()?;
        node.ip(&[
            "link",
            "add",
            "bwf",
            "address",
            "02:51:00:00:00:01",
            "type",
            "veth",
            "peer",
            "bqf",
            "address",
            "02:51:00:00:00:02",
            "netns",
            &pod.ns,
        ])?;
        node.ip(&["addr", "add", &format!("{NODE_ADDR}/32"), "dev", "bwf"])?;
        node.ip(&["link", "set", "bwf", "up"])?;
        node.ip(&["route", "add", &format!("{POD_ADDR}/32"), "dev", "bwf"])?;
        node.ip(&[
            "neigh",
            "add",
            &POD_ADDR.to_string(),
            "lladdr",
            "02:51:00:00:00:02",
            "dev",
            "bwf",
            "nud",
            "permanent",
        ])?;
        let in_pod =
            |args: &[&str]| crate::util::output(crate::util::cmd("ip", ["-n", &pod.ns]).args(args));
        in_pod(&["link", "set", "lo", "up"])?;
        in_pod(&["addr", "add", &format!("{POD_ADDR}/32"), "dev", "bqf"])?;
        in_pod(&["link", "set", "bqf", "up"])?;
        in_pod(&["route", "add", &format!("{NODE_ADDR}/32"), "dev", "bqf"])?;
        in_pod(&[
            "neigh",
            "add",
            &NODE_ADDR.to_string(),
            "lladdr",
            "02:51:00:00:00:01",
            "dev",
            "bqf",
            "nud",
            "permanent",
        ])?;
        let receiver = node.run(|| UdpSocket::bind(SocketAddrV4::new(NODE_ADDR, PORT)))?;
        receiver.set_nonblocking(true)?;
        let sender = pod.run(|| UdpSocket::bind(SocketAddrV4::new(POD_ADDR, 0)))?;
        let fenced = Fenced {
            pod,
            receiver,
            sender,
        };
        thread::sleep(Duration::from_secs(1));
        let delivered = fenced.burst(20)?;
        if delivered != 20 {
            bail!("the pod's traffic does not flow before it is fenced: {delivered} of 20");
        }
        let body = serde_json::json!({
            "addresses": [POD_ADDR],
            "holder": { "interface": "bw0", "container_id": "bench-new-holder" },
        })
        .to_string();
        let (status, answer) = api(&node.socket(), "POST", "/v1/claims", &body)?;
        if status != 200 {
            bail!("claiming the pod's address from bw0 answered {status}: {answer}");
        }
        let delivered = fenced.burst(20)?;
        if delivered != 0 {
            bail!("the fenced pod still gets {delivered} of 20 through");
        }
        Ok(fenced)
    }

    /// Sends `n` datagrams and counts those that arrive.
    fn burst(&self, n: u64) -> Result<u64> {
        self.drain();
        for _ in 0..n {
            self.sender
                .send_to(b"fenced?", SocketAddrV4::new(NODE_ADDR, PORT))?;
        }
        thread::sleep(Duration::from_millis(200));
        Ok(self.drain())
    }

    fn drain(&self) -> u64 {
        let mut buf = [0u8; 64];
        let mut got = 0;
        while self.receiver.recv(&mut buf).is_ok() {
            got += 1;
        }
        got
    }

    /// Sends one datagram a millisecond while `during` runs: (sent, delivered).
    pub fn while_running<T>(&self, during: impl FnOnce() -> T) -> (T, u64, u64) {
        self.drain();
        let stop = AtomicBool::new(false);
        let sent = AtomicU64::new(0);
        let received = Arc::new(AtomicU64::new(0));
        let result = thread::scope(|scope| {
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let to = SocketAddrV4::new(NODE_ADDR, PORT);
                    if self.sender.send_to(b"fenced?", to).is_ok() {
                        sent.fetch_add(1, Ordering::Relaxed);
                    }
                    thread::sleep(Duration::from_millis(1));
                }
            });
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    received.fetch_add(self.drain(), Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(5));
                }
            });
            let result = during();
            thread::sleep(Duration::from_millis(200));
            stop.store(true, Ordering::Relaxed);
            result
        });
        let delivered = received.load(Ordering::Relaxed) + self.drain();
        let _ = &self.pod;
        (result, sent.load(Ordering::Relaxed), delivered)
    }
}
