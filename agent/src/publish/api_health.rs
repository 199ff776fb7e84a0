//! Whether the API server answers, as every client of it in the agent sees it, and the moment
//! it is back after an outage. A failure to reach it (connect, TLS, timeout) marks it down; any
//! call that succeeds marks it up again, and so does a probe of `/readyz` the agent makes while
//! it is down (every ~0.5 s, jittered, one cheap GET per node). The writers wait on
//! [`ApiHealth::returns`] and write within a second of the API server's return instead of on
//! their backoff, which has grown to tens of seconds by the end of an outage.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use log::{debug, info};
use tokio::sync::{watch, Notify};

use super::{backoff::Backoff, client::CachedClient, FailureReason, WriteError};

/// Between two probes while the API server is down, before jitter (up to half of it more).
pub const PROBE_EVERY: Duration = Duration::from_millis(400);
/// How long a probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How far the writers spread their first call after a return: a thousand nodes do not write
/// in the same millisecond.
pub const RETURN_SPREAD: Duration = Duration::from_millis(200);

/// Shared by the agent's API clients; cheap to clone.
#[derive(Clone)]
pub struct ApiHealth {
    inner: Arc<Inner>,
}

struct Inner {
    down: AtomicBool,
    /// Bumped at each return.
    returns: watch::Sender<u64>,
    /// Wakes the prober when the API server goes down.
    went_down: Notify,
}

impl Default for ApiHealth {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiHealth {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                down: AtomicBool::new(false),
                returns: watch::channel(0).0,
                went_down: Notify::new(),
            }),
        }
    }

    /// A call succeeded: the API server answers. A return when it was down.
    pub fn answered(&self) {
        if self.inner.down.swap(false, Ordering::SeqCst) {
            self.inner.returns.send_modify(|n| *n += 1);
        }
    }

    /// A call did not reach the API server.
    pub fn unreachable(&self) {
        if !self.inner.down.swap(true, Ordering::SeqCst) {
            self.inner.went_down.notify_one();
        }
    }

    pub fn is_down(&self) -> bool {
        self.inner.down.load(Ordering::SeqCst)
    }

    /// Changes at each return of the API server.
    pub fn returns(&self) -> watch::Receiver<u64> {
        self.inner.returns.subscribe()
    }

    /// Probes `/readyz` while the API server is down, until the agent ends.
    pub fn spawn_prober(&self, kubeconfig: Option<PathBuf>) {
        let health = self.clone();
        tokio::spawn(async move { health.probe(kubeconfig).await });
    }

    async fn probe(self, kubeconfig: Option<PathBuf>) {
        let mut jitter = Backoff::new(PROBE_EVERY, PROBE_EVERY);
        let mut clients = CachedClient::new(kubeconfig, PROBE_TIMEOUT);
        loop {
            if !self.is_down() {
                self.inner.went_down.notified().await;
                continue;
            }
            tokio::time::sleep(jitter.next_delay()).await;
            let Ok(client) = clients.get().await else {
                continue;
            };
            let request = match http::Request::get("/readyz").body(Vec::new()) {
                Ok(request) => request,
                Err(_) => continue,
            };
            match client.request_text(request).await {
                Ok(text) if text.starts_with("ok") => {
                    info!("the API server answers again: catching up");
                    self.answered();
                }
                Ok(text) => debug!("API server not ready yet: {text}"),
                Err(e) => {
                    debug!("API server probe: {e}");
                    // A connection the outage left half-open is not reused.
                    clients.after_failure(&WriteError {
                        reason: FailureReason::Unreachable,
                        message: e.to_string(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_return_is_announced_once_per_outage() {
        let health = ApiHealth::new();
        let mut returns = health.returns();
        health.answered();
        assert!(!returns.has_changed().unwrap(), "up already: no return");
        health.unreachable();
        health.unreachable();
        assert!(health.is_down());
        health.answered();
        assert!(returns.has_changed().unwrap());
        returns.mark_unchanged();
        health.answered();
        assert!(!returns.has_changed().unwrap());
    }
}
