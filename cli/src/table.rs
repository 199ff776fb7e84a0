//! Aligned plain-text layouts: column tables and key/value lists.

/// Columns separated by two spaces, each as wide as its widest cell; no trailing blanks.
#[derive(Debug)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len(), "one cell per column");
        self.rows.push(cells);
    }

    /// Every line, each prefixed with `indent` and ended with a newline.
    pub fn render(&self, indent: &str) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.header).chain(&self.rows) {
            let mut text = String::from(indent);
            for (i, (cell, width)) in line.iter().zip(&widths).enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                text.push_str(cell);
                let pad = width - cell.chars().count();
                text.extend(std::iter::repeat_n(' ', pad));
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `key:  value` lines with the values aligned. A key's leading blanks (an indented sub-field)
/// are kept, and count towards the alignment.
pub fn key_values(pairs: &[(String, String)]) -> String {
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count() + 1)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (key, value) in pairs {
        let label = format!("{key}:");
        let line = format!("{label:width$}  {value}");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut table = Table::new(["A", "LONGER", "C"]);
        table.row(vec!["wide cell".into(), "x".into(), "".into()]);
        table.row(vec!["y".into(), "z".into(), "last".into()]);
        assert_eq!(
            table.render("  "),
            "  A          LONGER  C\n  wide cell  x\n  y          z       last\n"
        );
    }

    #[test]
    fn values_are_aligned_after_the_longest_key() {
        let pairs = [
            ("Address".to_owned(), "10.0.0.1".to_owned()),
            ("  Pod".to_owned(), "default/web".to_owned()),
            ("Until".to_owned(), String::new()),
        ];
        assert_eq!(
            key_values(&pairs),
            "Address:  10.0.0.1\n  Pod:    default/web\nUntil:\n"
        );
    }
}
