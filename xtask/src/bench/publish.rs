//! The NodeQuarantine section (issue 30): how soon a change to a node's quarantine is visible
//! through the Kubernetes API, and how many writes a second that costs the API server, at a
//! steady churn of 50 and 200 listed changes a second (`visible_p50/p99_<rate>_per_s`,
//! `writes_<rate>_per_s`; `changes_<rate>_per_s` is the churn the driver achieved).
//!
//! Measured by `ipq-bench-publish`, a binary of the `ipq-tests` crate (xtask depends on no
//! workspace crate), against the cluster tier's control plane built from Go modules
//! (`cargo xtask setup --for cluster`) and the release `ipq-agent`. Each change is timed from
//! its API request to the first event of a watch on the object that shows it.
//!
//! Targets (issue 30), on the median of the trials: p99 ≤ 1 s, ≤ 4 writes a second whatever
//! the churn (the writer's 250 ms pace; the probe counts the writes over the churn's window
//! plus one interval, the window's own first write), and no failed write in any trial.
//!
//! Like every section it relies on `cargo xtask bench`'s setup (the whole of `cargo xtask
//! setup`, the cluster tier's Go build included: about 30 minutes the first time, seconds
//! after), which fails naming what it cannot install; the probe fails naming a component that
//! is missing all the same.

use std::collections::BTreeMap;

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

use super::{min_and_median, BenchOptions, Row, Target};
use crate::util;

const GROUP: &str = "publish";
const PROBE: &str = "ipq-bench-publish";
const RATES: [u32; 2] = [50, 200];
const SECONDS: u32 = 10;
const QUICK_SECONDS: u32 = 5;
const VISIBLE_P99_MS: f64 = 1000.0;
/// The writer's pace: one write per 250 ms at most.
const WRITES_PER_S: f64 = 4.0;

/// One line of the probe's output.
#[derive(Deserialize)]
struct Sample {
    name: String,
    rate: u32,
    unit: String,
    value: f64,
}

pub fn run(opts: &BenchOptions) -> Result<Vec<Row>> {
    // The cluster tier's components are there: `cargo xtask bench` runs the whole setup first
    // (`setup::ensure(Scope::All)`, which builds them, or fails saying what is missing, e.g. Go).
    super::release_binaries(&["ipq-agent"])?;
    util::run(&mut util::cargo([
        "build",
        "--quiet",
        "--package",
        "ipq-tests",
        "--bin",
        PROBE,
    ]))
    .context("building the publish probe")?;
    let root = util::workspace_root();
    let probe = root.join("target/debug").join(PROBE);
    let seconds = if opts.quick { QUICK_SECONDS } else { SECONDS };
    let rates: Vec<String> = RATES.iter().map(u32::to_string).collect();
    let mut command = util::cmd(
        &probe,
        [
            "--rates".to_owned(),
            rates.join(","),
            "--seconds".to_owned(),
            seconds.to_string(),
            "--trials".to_owned(),
            opts.trials.to_string(),
        ],
    );
    command.env("IPQ_AGENT_BINARY", root.join("target/release/ipq-agent"));
    let out = util::output(&mut command)?;
    let samples: Vec<Sample> = out
        .lines()
        .map(|line| serde_json::from_str(line).with_context(|| format!("probe line {line:?}")))
        .collect::<Result<_>>()?;
    if samples.is_empty() {
        bail!("{PROBE} measured nothing");
    }
    rows(&samples)
}

fn target(name: &str, median: f64, values: &[f64]) -> Option<Target> {
    let (text, met) = match name {
        "visible_p99" => (
            format!("≤ {VISIBLE_P99_MS:.0} ms (median)"),
            median <= VISIBLE_P99_MS,
        ),
        "writes" => (
            format!("≤ {WRITES_PER_S} /s (median)"),
            median <= WRITES_PER_S,
        ),
        "failed_writes" => (
            "0 in every trial".to_owned(),
            values.iter().all(|v| *v == 0.0),
        ),
        _ => return None,
    };
    Some(Target { text, met })
}

fn unit(unit: &str) -> Result<&'static str> {
    Ok(match unit {
        "ms" => "ms",
        "ops/s" => "ops/s",
        "n" => "n",
        other => bail!("{PROBE} printed an unknown unit {other:?}"),
    })
}

fn rows(samples: &[Sample]) -> Result<Vec<Row>> {
    let mut order: Vec<(u32, String, String)> = Vec::new();
    let mut values: BTreeMap<(u32, String, String), Vec<f64>> = BTreeMap::new();
    for s in samples {
        let key = (s.rate, s.name.clone(), s.unit.clone());
        if !values.contains_key(&key) {
            order.push(key.clone());
        }
        values.entry(key).or_default().push(s.value);
    }
    let mut rows = Vec::new();
    for key in order {
        let trials = &values[&key];
        let (min, median) =
            min_and_median(trials).with_context(|| format!("{PROBE}: no value for {key:?}"))?;
        let target = target(&key.1, median, trials);
        let (rate, name, unit_text) = key;
        rows.push(Row {
            group: GROUP,
            name: format!("{name}_{rate}_per_s"),
            size: None,
            unit: unit(&unit_text)?,
            min,
            median,
            target,
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_targets_are_judged_on_the_median_and_a_failed_write_misses() {
        let sample = |name: &str, unit: &str, value| Sample {
            name: name.into(),
            rate: 200,
            unit: unit.into(),
            value,
        };
        let rows = rows(&[
            sample("visible_p99", "ms", 400.0),
            sample("visible_p99", "ms", 1200.0),
            sample("visible_p99", "ms", 1300.0),
            sample("writes", "ops/s", 4.1),
            sample("failed_writes", "n", 0.0),
            sample("failed_writes", "n", 1.0),
            sample("failed_writes", "n", 0.0),
        ])
        .unwrap();
        assert_eq!(rows[0].name, "visible_p99_200_per_s");
        assert!(!rows[0].target.as_ref().unwrap().met, "median 1200 ms");
        assert!(!rows[1].target.as_ref().unwrap().met, "4.1 writes a second");
        assert!(
            !rows[2].target.as_ref().unwrap().met,
            "one trial's failed write"
        );
    }
}
