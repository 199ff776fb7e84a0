//! What both of the agent's listeners (the metrics port, open to the node's network, and the
//! API socket) do against clients that hold connections without using them, and against
//! running out of file descriptors:
//!
//! - a connection must send a complete request head within [`HEADER_TIMEOUT`], the first one
//!   and every later one on a kept-alive connection, else it is closed;
//! - each listener serves at most a fixed number of connections at once; one more is closed
//!   the moment it is accepted, so idle clients can never take the descriptors the agent needs
//!   for its journal, netlink and BPF;
//! - the metrics port, open to the node's network, serves at most
//!   [`METRICS_MAX_PER_PEER`] of those from any one peer address, so one peer cannot take every
//!   slot from the scrapers and probes;
//! - a failed `accept` (out of descriptors) backs off instead of spinning, and its log line is
//!   rate-limited;
//! - a client that shuts down its write side after its request still gets the answer;
//! - a client that stops reading its answers is closed once a write has waited
//!   [`WRITE_STALL_TIMEOUT`]: otherwise it would hold its slot for as long as it likes.

use std::{
    collections::HashMap,
    future::Future as _,
    io,
    net::IpAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use log::warn;
use prometheus::IntCounterVec;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};

/// How long a client may take to send a request head, including the wait for the first byte
/// of the next request on a kept-alive connection. Scrapers and the CLI send theirs at once.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections the metrics port serves at once: a Prometheus or two and the kubelet's probes.
pub const METRICS_MAX_CONNECTIONS: usize = 64;

/// Connections the metrics port serves at once from one peer address: a scraper and a probe
/// or two each; what is left stays for the others.
pub const METRICS_MAX_PER_PEER: usize = 8;

/// Connections the API socket serves at once to anyone allowed on it: bursts of CNI ADDs and
/// DELs, the CLI, event followers.
pub const API_MAX_CONNECTIONS: usize = 256;

/// Connections the API socket keeps, beyond [`API_MAX_CONNECTIONS`], for root peers only (the
/// root role: the CNI plugins, the kubelet's exec probes, `sudo ipq`): another user holding
/// every shared slot (event followers, say) never makes a pod's claim wait.
pub const API_ROOT_RESERVE: usize = 64;

/// How long one write may wait for a client to read: a follower of `/v1/events` or a scraper
/// reads as fast as the agent writes.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

const BACKOFF_MIN: Duration = Duration::from_millis(10);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// At most one log line per this period for each kind of repeated listener trouble.
pub const LOG_PERIOD: Duration = Duration::from_secs(10);

/// Lets one log line through per period and counts what it held back.
#[derive(Debug)]
pub struct RateLimited {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)` when a line may be logged now, `n` being how many were held back since the
    /// last one; `None` when this one is held back.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < self.period)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

fn held_back(n: u64) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(" ({n} more since the last report)")
    }
}

/// One listener's guard: its connection slots, its accept back-off and its log limits.
pub struct Guard {
    name: &'static str,
    max: usize,
    slots: Arc<Semaphore>,
    /// Slots only privileged peers may take once `slots` are all taken.
    reserve: Option<Arc<Semaphore>>,
    /// At most this many connections per peer address, for a listener open to the network.
    per_peer: Option<usize>,
    peers: PeerCounts,
    backoff: Duration,
    accept_errors: RateLimited,
    refusals: RateLimited,
    peer_refusals: RateLimited,
    /// `ipq_connections_refused_total`, when the listener reports its refusals.
    refused: Option<IntCounterVec>,
}

/// Connections open per peer address. At most one entry per open connection (an address with
/// none has no entry), so it is as bounded as the listener's slots.
#[derive(Clone, Debug, Default)]
struct PeerCounts(Arc<Mutex<HashMap<IpAddr, usize>>>);

impl PeerCounts {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        // A panic while counting leaves correct counts (each update is one statement).
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A connection's hold on its listener: a slot, and its share of its peer's allowance.
#[derive(Debug)]
pub struct Admission {
    _slot: OwnedSemaphorePermit,
    peer: Option<(PeerCounts, IpAddr)>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let Some((counts, peer)) = self.peer.take() {
            let mut counts = counts.lock();
            if let Some(n) = counts.get_mut(&peer) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(&peer);
                }
            }
        }
    }
}

impl Guard {
    pub fn new(name: &'static str, max: usize) -> Self {
        Self {
            name,
            max,
            slots: Arc::new(Semaphore::new(max)),
            reserve: None,
            per_peer: None,
            peers: PeerCounts::default(),
            backoff: BACKOFF_MIN,
            accept_errors: RateLimited::new(LOG_PERIOD),
            refusals: RateLimited::new(LOG_PERIOD),
            peer_refusals: RateLimited::new(LOG_PERIOD),
            refused: None,
        }
    }

    /// Counts every connection closed at accept in `counter` (labels: listener, reason); the
    /// log lines about them are rate-limited, the count is not.
    pub fn counting_refusals(self, counter: IntCounterVec) -> Self {
        Self {
            refused: Some(counter),
            ..self
        }
    }

    fn count_refusal(&self, reason: &str) {
        if let Some(counter) = &self.refused {
            counter
                .with_label_values(&[self.name.to_ascii_lowercase().as_str(), reason])
                .inc();
        }
    }

    /// A guard that also keeps `reserved` slots for privileged peers ([`Guard::admit_reserving`]).
    pub fn with_reserve(self, reserved: usize) -> Self {
        Self {
            reserve: Some(Arc::new(Semaphore::new(reserved))),
            ..self
        }
    }

    /// A slot for the connection just accepted, held for its lifetime: a shared one, else,
    /// for a `privileged` peer, a reserved one; `None` when none is left for this peer, and the
    /// caller closes the connection at once.
    pub fn admit_reserving(&mut self, privileged: bool) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            self.backoff = BACKOFF_MIN;
            return Some(permit);
        }
        if privileged {
            if let Some(Ok(permit)) = self.reserve.clone().map(Semaphore::try_acquire_owned) {
                self.backoff = BACKOFF_MIN;
                return Some(permit);
            }
        }
        self.admit()
    }

    /// A guard that also serves at most `per_peer` connections from any one peer address.
    pub fn with_peer_limit(name: &'static str, max: usize, per_peer: usize) -> Self {
        Self {
            per_peer: Some(per_peer),
            ..Self::new(name, max)
        }
    }

    /// A slot for the connection just accepted from `peer`, held for its lifetime; `None` when
    /// `peer` already has its allowance open or every slot is taken, and the caller closes
    /// the connection at once. (A peer over its allowance takes no slot from the others.)
    pub fn admit_from(&mut self, peer: IpAddr) -> Option<Admission> {
        let peer = peer.to_canonical();
        let Some(per_peer) = self.per_peer else {
            return self.admit().map(|slot| Admission {
                _slot: slot,
                peer: None,
            });
        };
        let open = self.peers.lock().get(&peer).copied().unwrap_or(0);
        if open >= per_peer {
            self.backoff = BACKOFF_MIN;
            self.count_refusal("peer_limit");
            if let Some(n) = self.peer_refusals.allow(Instant::now()) {
                warn!(
                    "{}: {per_peer} connections open from {peer}, the most one peer gets: \
                     closing its new ones until some finish or time out{}",
                    self.name,
                    held_back(n)
                );
            }
            return None;
        }
        let slot = self.admit()?;
        *self.peers.lock().entry(peer).or_insert(0) += 1;
        Some(Admission {
            _slot: slot,
            peer: Some((self.peers.clone(), peer)),
        })
    }

    /// Peer addresses with a connection open; for tests.
    #[cfg(test)]
    fn peers_open(&self) -> usize {
        self.peers.lock().len()
    }

    /// After `accept` failed: logs (rate-limited) and waits, longer after each failure in a
    /// row, so a listener out of descriptors neither spins nor floods the log.
    pub async fn accept_failed(&mut self, error: &io::Error) {
        if let Some(n) = self.accept_errors.allow(Instant::now()) {
            warn!(
                "{}: accepting a connection failed: {error}; retrying with back-off{}",
                self.name,
                held_back(n)
            );
        }
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }

    /// A slot for the connection just accepted, held for its lifetime; `None` when every slot
    /// is taken, and the caller closes the connection at once.
    pub fn admit(&mut self) -> Option<OwnedSemaphorePermit> {
        self.backoff = BACKOFF_MIN;
        match self.slots.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                self.count_refusal("full");
                if let Some(n) = self.refusals.allow(Instant::now()) {
                    warn!(
                        "{}: {} connections open, the most it serves at once: closing new \
                         ones until some finish or time out{}",
                        self.name,
                        self.max,
                        held_back(n)
                    );
                }
                None
            }
        }
    }
}

/// The HTTP/1 settings both listeners serve with.
pub fn http1() -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        // `nc -N`, socat and others shut down their write side once the request is sent.
        .half_close(true);
    builder
}

/// A connection whose writes fail with `TimedOut` once one has waited `limit` for the peer to
/// read; reads pass through (the head timeout bounds those).
pub struct WriteDeadline<T> {
    inner: T,
    limit: Duration,
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteDeadline<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            waiting: None,
        }
    }

    /// Passes `result` on, failing it when the write has been pending for too long.
    fn bound<R>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if result.is_ready() {
            self.waiting = None;
            return result;
        }
        let limit = self.limit;
        let timer = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            self.waiting = None;
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer read nothing for {limit:?}"),
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteDeadline<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bound(cx, result)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.bound(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bound(cx, result)
    }
}

/// Raises the soft limit on open files to the hard limit: the agent's caps, not the
/// conventional soft 1024, are what bound its connections. Returns (old soft, new soft).
pub fn raise_fd_limit() -> io::Result<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-parameter.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let old = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: a valid in-parameter.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((old, limit.rlim_cur))
}

#[cfg(test)]
mod tests;
