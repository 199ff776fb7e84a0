//! The real Prometheus tools against the real agent: `promtool check metrics` on a scrape, and
//! a Prometheus server (Debian package `prometheus`) scraping the agent from inside a test's
//! network namespace, queried through its HTTP API.

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _};

use crate::{
    lab::poll,
    netns::{unique, NetNs},
};

const PROMTOOL: &str = "/usr/bin/promtool";
const PROMETHEUS: &str = "/usr/bin/prometheus";
const CURL: &str = "/usr/bin/curl";

/// How long Prometheus may take from exec to `/-/ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn require_tool(path: &str, package: &str) -> anyhow::Result<()> {
    if !Path::new(path).is_file() {
        bail!("{path} is missing: install the Debian package {package} (cargo xtask setup does)");
    }
    Ok(())
}

/// What `promtool check metrics` said about an exposition: whether it passed and everything it
/// printed (problems go to either stream depending on the version).
#[derive(Debug)]
pub struct PromtoolVerdict {
    pub passed: bool,
    pub output: String,
}

/// Pipes `exposition` (the text format) into `promtool check metrics`.
pub fn promtool_check_metrics(exposition: &str) -> anyhow::Result<PromtoolVerdict> {
    require_tool(PROMTOOL, "prometheus")?;
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting promtool check metrics")?;
    child
        .stdin
        .take()
        .context("promtool's stdin")?
        .write_all(exposition.as_bytes())
        .context("writing the exposition to promtool")?;
    let out = child.wait_with_output().context("waiting for promtool")?;
    Ok(PromtoolVerdict {
        passed: out.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}

/// A scratch directory (config, TSDB, log), removed on drop.
#[derive(Debug)]
struct ScratchDir(PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            eprintln!("cleanup: removing {}: {e}", self.0.display());
        }
    }
}

/// One series of an instant-query result: its labels (`__name__` included) and value.
#[derive(Clone, Debug, PartialEq)]
pub struct QuerySample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A Prometheus server running inside one network namespace, killed and its data removed on
/// drop (the process is killed before its directory goes).
pub struct Prometheus<'n> {
    ns: &'n NetNs,
    child: Option<Child>,
    listen: String,
    log: PathBuf,
    _dir: ScratchDir,
}

impl<'n> Prometheus<'n> {
    /// Starts Prometheus in `ns`, listening on `listen` there and scraping `target` (also as
    /// seen from `ns`) every second as job `job`; waits until it is ready.
    pub fn start(ns: &'n NetNs, listen: &str, job: &str, target: &str) -> anyhow::Result<Self> {
        Self::start_with_rules(ns, listen, job, target, &[])
    }

    /// [`start`](Self::start), with these rule files loaded (and evaluated every second).
    pub fn start_with_rules(
        ns: &'n NetNs,
        listen: &str,
        job: &str,
        target: &str,
        rule_files: &[&Path],
    ) -> anyhow::Result<Self> {
        require_tool(PROMETHEUS, "prometheus")?;
        require_tool(CURL, "curl")?;
        let dir = ScratchDir(std::env::temp_dir().join(unique("ipq-prometheus")));
        fs::create_dir(&dir.0).with_context(|| format!("creating {}", dir.0.display()))?;
        let config = dir.0.join("prometheus.yml");
        // scrape_timeout must not exceed scrape_interval (its default, 10 s, would).
        let rules: String = rule_files
            .iter()
            .map(|f| format!("  - {}\n", f.display()))
            .collect();
        let rules = if rules.is_empty() {
            String::new()
        } else {
            format!("rule_files:\n{rules}")
        };
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 {rules}scrape_configs:\n  - job_name: {job}\n    static_configs:\n      \
                 - targets: ['{target}']\n"
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let log = dir.0.join("prometheus.log");
        let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = ns.command(PROMETHEUS);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .arg(format!(
                "--web.console.templates={}",
                dir.0.join("consoles").display()
            ))
            .arg(format!(
                "--web.console.libraries={}",
                dir.0.join("console_libraries").display()
            ))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        // As for the agent: if the test process dies without unwinding, Prometheus dies too.
        crate::wait::die_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
        let mut prometheus = Prometheus {
            ns,
            child: Some(child),
            listen: listen.to_owned(),
            log,
            _dir: dir,
        };
        prometheus.wait_ready()?;
        Ok(prometheus)
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let url = format!("http://{}/-/ready", self.listen);
        let result = poll("Prometheus to be ready", READY_TIMEOUT, || {
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().transpose()) {
                self.child = None;
                bail!("prometheus exited ({})", status?);
            }
            Ok(self.get(&url, &[]).ok().map(|_| ()))
        });
        result.with_context(|| format!("prometheus log:\n{}", self.log()))
    }

    /// Everything Prometheus logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(unreadable: {e})"))
    }

    /// `GET url` with `--data-urlencode` pairs, from inside the namespace; the body of a 2xx.
    fn get(&self, url: &str, params: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut cmd = self.ns.command(CURL);
        cmd.args([
            "--silent",
            "--show-error",
            "--fail",
            "--max-time",
            "5",
            "-G",
        ]);
        for (key, value) in params {
            cmd.arg("--data-urlencode").arg(format!("{key}={value}"));
        }
        cmd.arg(url);
        crate::netns::output_of(&mut cmd)
    }

    /// The names of the rule groups Prometheus has loaded (`/api/v1/rules`).
    pub fn rule_groups(&self) -> anyhow::Result<Vec<String>> {
        let url = format!("http://{}/api/v1/rules", self.listen);
        let body: serde_json::Value = serde_json::from_str(&self.get(&url, &[])?)?;
        Ok(body["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// An instant query through `/api/v1/query`: every series of the resulting vector.
    pub fn query(&self, promql: &str) -> anyhow::Result<Vec<QuerySample>> {
        let url = format!("http://{}/api/v1/query", self.listen);
        let body = self.get(&url, &[("query", promql)])?;
        parse_vector(&body).with_context(|| format!("query {promql:?} answered {body}"))
    }
}

/// The samples of a `/api/v1/query` answer whose result is an instant vector.
fn parse_vector(body: &str) -> anyhow::Result<Vec<QuerySample>> {
    let answer: serde_json::Value = serde_json::from_str(body).context("not JSON")?;
    if answer["status"] != "success" {
        bail!("status is not success");
    }
    if answer["data"]["resultType"] != "vector" {
        bail!("the result is not an instant vector");
    }
    let results = answer["data"]["result"]
        .as_array()
        .context("no data.result array")?;
    results
        .iter()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .context("a result without metric labels")?
                .iter()
                .map(|(k, v)| Ok((k.clone(), v.as_str().context("a non-string label")?.into())))
                .collect::<anyhow::Result<_>>()?;
            // "value": [<unix time>, "<value as a string>"]
            let value = r["value"][1]
                .as_str()
                .context("a result without a value")?
                .parse()
                .context("a value that is not a number")?;
            Ok(QuerySample { labels, value })
        })
        .collect()
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signals our own child, which has not been reaped yet.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "----- {} -----\n{}----- end -----",
                self.log.display(),
                self.log()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_vector;

    #[test]
    fn an_instant_vector_answer_parses_into_labelled_samples() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"ipq_conflicts_total","job":"ipq","kind":"early_reuse"},
             "value":[1700000000.123,"2"]},
            {"metric":{"__name__":"ipq_conflicts_total","job":"ipq","kind":"remote_claim"},
             "value":[1700000000.123,"0"]}]}}"#;
        let samples = parse_vector(body).expect("parses");
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].labels["kind"], "early_reuse");
        assert_eq!(samples[0].value, 2.0);
        assert_eq!(samples[1].labels["job"], "ipq");
        assert_eq!(samples[1].value, 0.0);
        assert!(parse_vector(r#"{"status":"error","error":"bad"}"#).is_err());
        assert!(
            parse_vector(r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#)
                .is_err()
        );
    }
}
