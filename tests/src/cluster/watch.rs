//! `kubectl get <what> --watch -o json --output-watch-events` run beside a scenario: every
//! event the API server sends (the initial list as `ADDED`, then each change of each object in
//! order, none coalesced), recorded with when it arrived. For what a scenario must prove held
//! *throughout* (an object never emptied, never two nodes without their agent), from what was
//! recorded rather than from the moments the test happened to look.

use std::{
    fs,
    io::BufReader,
    process::{Child, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::Cluster;

/// One watch event as it arrived.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub at: Instant,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: String,
    pub object: Value,
}

impl Recorded {
    /// The object's `metadata.name`.
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or("")
    }
}

/// A `kubectl get --watch` running until dropped.
pub struct Watch {
    what: String,
    child: Child,
    events: Arc<Mutex<Vec<Recorded>>>,
    /// Why the reader stopped, once it has (kubectl's output ended or was not JSON).
    ended: Arc<Mutex<Option<String>>>,
    stderr: std::path::PathBuf,
}

impl Watch {
    /// Starts `kubectl <args> --watch -o json --output-watch-events` (`args`: e.g. `get
    /// nodequarantines`) on the first node; `name` names its stderr's file in the node's
    /// directory and the watch in errors. Returns once the initial list has arrived (at least
    /// one event: callers watch objects that exist).
    pub fn start(cluster: &Cluster, name: &str, args: &[&str]) -> anyhow::Result<Watch> {
        let mut all = args.to_vec();
        all.extend(["--watch", "-o", "json", "--output-watch-events"]);
        let stderr = cluster.host.dir().join(format!("{name}.stderr"));
        let mut cmd = cluster.kubectl().command(&all);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr).with_context(|| format!("{}", stderr.display()))?);
        let mut child = cmd.spawn().with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("kubectl's stdout is piped")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(Mutex::new(None));
        let (log, why) = (Arc::clone(&events), Arc::clone(&ended));
        thread::spawn(move || {
            let stream = serde_json::Deserializer::from_reader(BufReader::new(stdout));
            let mut reason = "kubectl's output ended".to_owned();
            for event in stream.into_iter::<Value>() {
                match event {
                    Ok(event) => log.lock().expect("no panic holds the lock").push(Recorded {
                        at: Instant::now(),
                        kind: event["type"].as_str().unwrap_or("").to_owned(),
                        object: event["object"].clone(),
                    }),
                    Err(e) => {
                        reason = format!("kubectl's output is not a watch event: {e}");
                        break;
                    }
                }
            }
            *why.lock().expect("no panic holds the lock") = Some(reason);
        });
        let watch = Watch {
            what: name.to_owned(),
            child,
            events,
            ended,
            stderr,
        };
        crate::lab::poll(
            &format!("{name}'s initial list"),
            Duration::from_secs(30),
            || {
                watch.check_running()?;
                Ok((!watch.events().is_empty()).then_some(()))
            },
        )?;
        Ok(watch)
    }

    /// The events recorded so far, in the order the API server sent them.
    pub fn events(&self) -> Vec<Recorded> {
        self.events.lock().expect("no panic holds the lock").clone()
    }

    /// Fails when the watch has ended (kubectl exited or its output broke off): what it
    /// recorded would not cover what came after.
    pub fn check_running(&self) -> anyhow::Result<()> {
        if let Some(reason) = self.ended.lock().expect("no panic holds the lock").as_ref() {
            bail!(
                "the watch {} ended ({reason}); kubectl's stderr: {}",
                self.what,
                fs::read_to_string(&self.stderr).unwrap_or_default().trim()
            );
        }
        Ok(())
    }

    /// Waits until the events recorded satisfy `done`, the watch running throughout.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Recorded]) -> bool,
    ) -> anyhow::Result<()> {
        crate::lab::poll(what, timeout, || {
            self.check_running()?;
            Ok(done(&self.events()).then_some(()))
        })
        .with_context(|| format!("{} recorded {} events", self.what, self.events().len()))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
