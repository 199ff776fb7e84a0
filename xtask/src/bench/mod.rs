//! `cargo xtask bench`: a minimal stand-in for the perf helper's module (which replaces this
//! one at merge), with the shared types of the bench contract and only the conntrack section.

mod conntrack;

use anyhow::Result;

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

/// Runs every section and prints its rows.
pub fn run(opts: &BenchOptions) -> Result<()> {
    println!(
        "cargo xtask bench: quick {}, {} trials, registry sizes {:?}",
        opts.quick, opts.trials, opts.sizes
    );
    let rows = conntrack::run(opts)?;
    println!(
        "{:<10} {:<36} {:>8} {:>6} {:>10} {:>10}  target",
        "GROUP", "NAME", "SIZE", "UNIT", "MIN", "MEDIAN"
    );
    for row in &rows {
        let target = row.target.as_ref().map_or_else(String::new, |t| {
            format!("{} {}", t.text, if t.met { "met" } else { "NOT MET" })
        });
        println!(
            "{:<10} {:<36} {:>8} {:>6} {:>10.3} {:>10.3}  {target}",
            row.group,
            row.name,
            row.size.map_or_else(|| "-".to_owned(), |s| s.to_string()),
            row.unit,
            row.min,
            row.median
        );
    }
    println!("{}", serde_json::to_string_pretty(&rows)?);
    Ok(())
}

/// The minimum and the median of `values` (which must not be empty).
pub fn min_median(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[0], values[values.len() / 2])
}
