//! `cargo xtask bench`: ipq's benchmark. Not a test: `cargo xtask test` never runs it and
//! never gates on timings. Runs as root, in network namespaces of its own, and cleans up.
//!
//! Minimal version of this module (the contract's types and the control-plane section only);
//! the full one, with the datapath section, the JSON and the SVG, replaces it at merge.

mod control;

use anyhow::Result;

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
    pub group: &'static str,
    pub name: String,
    pub size: Option<u32>,
    pub unit: &'static str,
    pub min: f64,
    pub median: f64,
    pub target: Option<Target>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Target {
    pub text: String,
    pub met: bool,
}

/// `cargo xtask bench [--quick] [--sizes a,b]`.
pub fn run(quick: bool, sizes: Option<Vec<u32>>, trials: Option<u32>) -> Result<()> {
    util::require_root(
        "cargo xtask bench",
        "it loads BPF programs and creates network namespaces",
    )?;
    let mut sizes = sizes.unwrap_or_else(|| {
        if quick {
            vec![1, 1000]
        } else {
            vec![1, 1000, 16384, 65536]
        }
    });
    sizes.sort_unstable();
    sizes.dedup();
    if sizes.is_empty() || sizes.contains(&0) {
        anyhow::bail!("--sizes: give registry sizes of at least 1, e.g. --sizes 1,1000");
    }
    let opts = BenchOptions {
        quick,
        sizes,
        trials: trials.unwrap_or(if quick { 1 } else { 3 }).max(1),
    };
    let rows = control::run(&opts)?;
    println!(
        "{:<10} {:<28} {:>7} {:>12} {:>12} {:<6}  target",
        "group", "figure", "size", "min", "median", "unit"
    );
    for row in &rows {
        let size = row.size.map_or_else(String::new, |s| s.to_string());
        let target = row.target.as_ref().map_or_else(String::new, |t| {
            format!("{} {}", t.text, if t.met { "met" } else { "MISSED" })
        });
        println!(
            "{:<10} {:<28} {:>7} {:>12.2} {:>12.2} {:<6}  {target}",
            row.group, row.name, size, row.min, row.median, row.unit
        );
    }
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}

/// Min and median of `values` (not empty).
pub fn min_median(values: &[f64]) -> (f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}
