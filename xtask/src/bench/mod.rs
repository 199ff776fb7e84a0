//! `cargo xtask bench`: ipq's benchmark. Not a test: it gates nothing in `cargo xtask test`
//! and never runs there. It runs as root, in network namespaces of its own, and cleans up.
//!
//! Every section measures its figures in interleaved trials and returns rows with the min and
//! the median over them; this module prints the table, and writes `target/bench/bench.json`
//! and `target/bench/latency.svg` (datapath latency against registry size).
//!
//! The machine this was written on is noisy (2 shared vCPUs, 10–35 % spread): judge on minima
//! and on ratios taken within one run, never on one absolute figure across runs.

mod conntrack;
mod control;
mod datapath;
mod pod_ns;
mod publish;
mod repair;
mod svg;
mod watcher;

use std::{fs, path::PathBuf};

use anyhow::{Context as _, Result};

use crate::util;

/// What the user asked `cargo xtask bench` for.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Fewer trials and smaller sizes: a smoke run (`--quick`).
    pub quick: bool,
    /// Registry sizes to measure at: 1, 1000, 16384, 65536 by default.
    pub sizes: Vec<u32>,
    /// Interleaved trials per figure (min and median are taken over them).
    pub trials: u32,
}

/// One measured figure.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub group: &'static str, // "datapath" | "control" | "conntrack" | "repair"
    pub name: String,        // e.g. "tc_ingress_pass_v4", "route_burst_p99"
    pub size: Option<u32>,   // registry size, where it matters
    pub unit: &'static str,  // "ns" | "ms" | "ops/s" | "%" | "MB" | "x" | "pps"
    pub min: f64,
    pub median: f64,
    pub target: Option<Target>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Target {
    pub text: String, // e.g. "≤ 1.25× empty", "≤ 100 ms"
    pub met: bool,
}

/// A section of the benchmark: its name (for `--only`) and its `run`.
type Section = (&'static str, fn(&BenchOptions) -> Result<Vec<Row>>);

/// Every section, in the order they run.
///
/// ── SECTIONS ── one line per `xtask/src/bench/<name>.rs`; each module exposes
/// `pub fn run(opts: &super::BenchOptions) -> anyhow::Result<Vec<super::Row>>`.
const SECTIONS: &[Section] = &[
    ("datapath", datapath::run),
    ("control", control::run),
    ("conntrack", conntrack::run),
    ("repair", repair::run),
    ("watcher", watcher::run),
    ("publish", publish::run),
];

pub const DEFAULT_SIZES: [u32; 4] = [1, 1000, 16384, 65536];
const QUICK_SIZES: [u32; 2] = [1, 1000];
const DEFAULT_TRIALS: u32 = 7;
const QUICK_TRIALS: u32 = 3;

/// `cargo xtask bench [--quick] [--sizes a,b] [--trials n] [--only section]`.
pub fn run(
    quick: bool,
    sizes: Option<Vec<u32>>,
    trials: Option<u32>,
    only: &[String],
) -> Result<()> {
    util::require_root(
        "cargo xtask bench",
        "it loads BPF programs, runs them with BPF_PROG_TEST_RUN and creates network namespaces",
    )?;
    for name in only {
        if !SECTIONS.iter().any(|(section, _)| section == name) {
            let known: Vec<&str> = SECTIONS.iter().map(|(s, _)| *s).collect();
            anyhow::bail!(
                "--only {name}: no such section (sections: {})",
                known.join(", ")
            );
        }
    }
    let mut sizes = sizes.unwrap_or_else(|| {
        if quick {
            QUICK_SIZES.to_vec()
        } else {
            DEFAULT_SIZES.to_vec()
        }
    });
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() || sizes.contains(&0) {
        anyhow::bail!("--sizes: give registry sizes of at least 1, e.g. --sizes 1,1000");
    }
    let trials = trials.unwrap_or(if quick { QUICK_TRIALS } else { DEFAULT_TRIALS });
    if trials == 0 {
        anyhow::bail!("--trials must be at least 1");
    }
    let opts = BenchOptions {
        quick,
        sizes,
        trials,
    };

    let mut rows = Vec::new();
    for (name, section) in SECTIONS {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        eprintln!("bench: {name} ...");
        rows.extend(section(&opts).with_context(|| format!("bench section {name}"))?);
    }

    print!("{}", table(&rows));
    let dir = util::workspace_root().join("target/bench");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = dir.join("bench.json");
    let report = serde_json::json!({
        "options": { "quick": opts.quick, "sizes": opts.sizes, "trials": opts.trials },
        "machine": machine(),
        "rows": rows,
    });
    write(&json, &serde_json::to_string_pretty(&report)?)?;
    let plot = dir.join("latency.svg");
    write(&plot, &svg::latency_plot(&rows))?;
    println!("\nwrote {} and {}", json.display(), plot.display());
    let missed = rows
        .iter()
        .filter(|r| r.target.as_ref().is_some_and(|t| !t.met))
        .count();
    if missed > 0 {
        println!("{missed} figure(s) missed their target (marked MISSED above)");
    }
    Ok(())
}

fn write(path: &PathBuf, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// What the numbers were taken on: they mean little without it.
fn machine() -> serde_json::Value {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    serde_json::json!({
        "cpus": cpus,
        "kernel": kernel.trim(),
        "loadavg": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
    })
}

/// Min over trials, and the median (the mean of the middle two for an even count).
/// Builds the release binaries the sections run and checks that `names` are there.
pub fn release_binaries(names: &[&str]) -> Result<()> {
    let release = util::workspace_root().join("target/release");
    util::run(&mut util::release_build_of_shipped_binaries())?;
    for name in names {
        if !release.join(name).is_file() {
            anyhow::bail!(
                "{} is missing after the build",
                release.join(name).display()
            );
        }
    }
    Ok(())
}

pub fn min_and_median(values: &[f64]) -> Option<(f64, f64)> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    Some((sorted[0], median))
}

/// A number as the table shows it: three significant digits or an integer.
fn number(value: f64) -> String {
    if value.abs() >= 1000.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// The printed table: one line per row, grouped as the sections returned them.
pub fn table(rows: &[Row]) -> String {
    let header = ["group", "figure", "size", "unit", "min", "median", "target"];
    let mut lines: Vec<[String; 7]> = vec![header.map(String::from)];
    for row in rows {
        let target = match &row.target {
            Some(t) if t.met => format!("{} ok", t.text),
            Some(t) => format!("{} MISSED", t.text),
            None => String::new(),
        };
        lines.push([
            row.group.to_owned(),
            row.name.clone(),
            row.size.map_or_else(String::new, |s| s.to_string()),
            row.unit.to_owned(),
            number(row.min),
            number(row.median),
            target,
        ]);
    }
    let mut widths = [0usize; 7];
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (cell, w))| {
                let pad = w - cell.chars().count();
                // Numbers right-aligned, words left-aligned.
                if (2..=5).contains(&i) && i != 3 {
                    format!("{}{cell}", " ".repeat(pad))
                } else {
                    format!("{cell}{}", " ".repeat(pad))
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_and_median_of_odd_and_even_counts() {
        assert_eq!(min_and_median(&[3.0, 1.0, 2.0]), Some((1.0, 2.0)));
        assert_eq!(min_and_median(&[4.0, 1.0, 3.0, 2.0]), Some((1.0, 2.5)));
        assert_eq!(min_and_median(&[]), None);
        assert_eq!(min_and_median(&[1.0, f64::NAN]), None);
    }

    #[test]
    fn the_table_marks_missed_targets() {
        let row = |name: &str, met| Row {
            group: "datapath",
            name: name.into(),
            size: Some(1000),
            unit: "x",
            min: 1.1,
            median: 1.2,
            target: Some(Target {
                text: "≤ 1.25× empty".into(),
                met,
            }),
        };
        let text = table(&[row("a", true), row("b", false)]);
        assert!(text.contains("≤ 1.25× empty ok"), "{text}");
        assert!(text.contains("≤ 1.25× empty MISSED"), "{text}");
        assert_eq!(text.lines().count(), 3, "{text}");
    }
}
