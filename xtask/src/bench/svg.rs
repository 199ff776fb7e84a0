//! The SVG plot of `cargo xtask bench`: datapath latency (min over trials, ns) against the
//! registry size, one line per figure, on a logarithmic size axis. Plain SVG, no dependency.

use std::{collections::BTreeMap, fmt::Write as _};

use super::Row;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 480.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 260.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

pub fn latency_plot(rows: &[Row]) -> String {
    let mut lines: BTreeMap<&str, Vec<(u32, f64)>> = BTreeMap::new();
    for row in rows
        .iter()
        .filter(|r| r.group == "datapath" && r.unit == "ns")
    {
        if let Some(size) = row.size {
            lines.entry(&row.name).or_default().push((size, row.min));
        }
    }
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="18" font-size="13">ipq datapath: BPF_PROG_TEST_RUN ns per packet (min of trials) against registry size</text>"#
    );
    let sizes: Vec<u32> = lines.values().flatten().map(|(s, _)| *s).collect();
    let (Some(&lo), Some(&hi)) = (sizes.iter().min(), sizes.iter().max()) else {
        svg.push_str("<text x=\"60\" y=\"60\">no datapath figures measured</text>\n</svg>\n");
        return svg;
    };
    let y_max = lines
        .values()
        .flatten()
        .map(|(_, v)| *v)
        .fold(0.0f64, f64::max)
        * 1.1;
    let (lx_lo, lx_hi) = (
        f64::from(lo).log10(),
        f64::from(hi).log10().max(f64::from(lo).log10() + 1.0),
    );
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |size: u32| LEFT + (f64::from(size).log10() - lx_lo) / (lx_hi - lx_lo) * plot_w;
    let y = |ns: f64| TOP + plot_h - ns / y_max * plot_h;
    // Axes, size ticks, ns ticks.
    let _ = writeln!(
        svg,
        r#"<path d="M{LEFT},{TOP} V{} H{}" fill="none" stroke="black"/>"#,
        TOP + plot_h,
        LEFT + plot_w
    );
    let mut ticks: Vec<u32> = sizes.clone();
    ticks.sort_unstable();
    ticks.dedup();
    for size in ticks {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{size}</text>"#,
            x(size),
            TOP + plot_h + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">addresses in the registry (log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 10.0
    );
    for i in 0..=5 {
        let ns = y_max * f64::from(i) / 5.0;
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{ns:.0} ns</text>"#,
            LEFT - 4.0,
            y(ns) + 4.0
        );
    }
    for (i, (name, points)) in lines.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let dash = if i >= COLOURS.len() {
            r#" stroke-dasharray="5,3""#
        } else {
            ""
        };
        let path: Vec<String> = points
            .iter()
            .map(|(s, v)| format!("{:.1},{:.1}", x(*s), y(*v)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>"#,
            path.join(" ")
        );
        let legend_y = TOP + 14.0 * i as f64;
        let _ = writeln!(
            svg,
            r#"<line x1="{:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{colour}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{name}</text>"#,
            WIDTH - RIGHT + 15.0,
            WIDTH - RIGHT + 35.0,
            WIDTH - RIGHT + 40.0,
            legend_y + 4.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_figure_and_a_legend() {
        let row = |name: &str, size, min| Row {
            group: "datapath",
            name: name.into(),
            size: Some(size),
            unit: "ns",
            min,
            median: min,
            target: None,
        };
        let svg = latency_plot(&[row("a", 1, 30.0), row("a", 65536, 31.0), row("b", 1, 40.0)]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">a</text>") && svg.contains(">b</text>"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(latency_plot(&[]).contains("no datapath figures"));
    }
}
