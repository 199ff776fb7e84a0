//! Datagrams sent all along while something changes under them (a restart, a change of
//! attach mechanism): the fenced pod a sends v4 and v6 to the peer, pod b sends v4 the same
//! way. Not one of pod a's may arrive; pod b's prove that traffic ran meanwhile.

use std::{
    net::{IpAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use crate::lab::{Lab, PEER_V4, PEER_V6, POD_A_V4, POD_A_V6, POD_B_V4};

struct Flow {
    src: IpAddr,
    sender: JoinHandle<u64>,
    receiver: JoinHandle<u64>,
}

/// What one flow sent and what of it arrived.
#[derive(Clone, Copy, Debug)]
pub struct FlowCount {
    pub src: IpAddr,
    pub sent: u64,
    pub got: u64,
}

/// The running flows; [`Flows::stop_and_check`] ends them and checks what arrived.
pub struct Flows {
    stop: Arc<AtomicBool>,
    flows: Vec<Flow>,
}

impl Flows {
    /// Starts one datagram every 2 ms per flow.
    pub fn start(lab: &Lab) -> Flows {
        let stop = Arc::new(AtomicBool::new(false));
        let mut flows = Vec::new();
        for (pod, src, peer) in [
            (&lab.pod_a, IpAddr::from(POD_A_V4), IpAddr::from(PEER_V4)),
            (&lab.pod_a, POD_A_V6.into(), PEER_V6.into()),
            (&lab.pod_b, POD_B_V4.into(), PEER_V4.into()),
        ] {
            let rx = lab
                .peer
                .run(|| UdpSocket::bind((peer, 0)))
                .expect("binding a receiver in the peer");
            rx.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            let port = rx.local_addr().unwrap().port();
            let tx = pod
                .run(|| UdpSocket::bind((src, 0)))
                .expect("binding a sender in a pod");
            let stop_tx = stop.clone();
            let fenced = src != IpAddr::from(POD_B_V4);
            let sender = thread::spawn(move || {
                let mut sent = 0u64;
                while !stop_tx.load(Ordering::Relaxed) {
                    match tx.send_to(b"ipq-flow", (peer, port)) {
                        Ok(_) => {}
                        // The fenced pod's neighbour discovery is dropped too, and its kernel
                        // may come to call the gateway unreachable: an attempt all the same.
                        Err(e)
                            if fenced
                                && matches!(
                                    e.raw_os_error(),
                                    Some(libc::ENETUNREACH | libc::EHOSTUNREACH)
                                ) => {}
                        Err(e) => panic!("{src} -> {peer}: send: {e}"),
                    }
                    sent += 1;
                    thread::sleep(Duration::from_millis(2));
                }
                sent
            });
            let stop_rx = stop.clone();
            let receiver = thread::spawn(move || {
                let mut got = 0u64;
                let mut buf = [0u8; 64];
                loop {
                    match rx.recv_from(&mut buf) {
                        Ok(_) => got += 1,
                        Err(_) if stop_rx.load(Ordering::Relaxed) => return got,
                        Err(_) => {}
                    }
                }
            });
            flows.push(Flow {
                src,
                sender,
                receiver,
            });
        }
        Flows { stop, flows }
    }

    /// Stops the flows; what each sent and what arrived (pod a's v4, pod a's v6, pod b's v4).
    pub fn stop(self) -> Vec<FlowCount> {
        self.stop.store(true, Ordering::Relaxed);
        self.flows
            .into_iter()
            .map(|flow| {
                let sent = flow.sender.join().expect("sender");
                thread::sleep(Duration::from_millis(150));
                let got = flow.receiver.join().expect("receiver");
                FlowCount {
                    src: flow.src,
                    sent,
                    got,
                }
            })
            .collect()
    }

    /// Stops the flows and asserts: none of pod a's datagrams arrived, more than half of pod
    /// b's did, and each flow sent more than `min_sent`.
    pub fn stop_and_check(self, min_sent: u64, during: &str) {
        for FlowCount { src, sent, got } in self.stop() {
            assert!(sent > min_sent, "{src}: only {sent} datagrams sent");
            if src == IpAddr::from(POD_B_V4) {
                assert!(got > sent / 2, "pod b: {got} of {sent} delivered {during}");
            } else {
                assert_eq!(got, 0, "fenced {src}: {got} of {sent} delivered {during}");
            }
        }
    }
}
