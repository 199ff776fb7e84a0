//! Echoing what a user gave back in an error, bounded: a config value or a request field of
//! megabytes must not become a log line or an error message of megabytes. Here, not in the
//! agent, because the agent and the CNI plugins (which link no agent) both echo.

use std::fmt;

/// The longest echo, in characters, before it is cut.
pub const MAX_ECHO_CHARS: usize = 64;

/// `text` as it is when short; else its first [`MAX_ECHO_CHARS`] characters, an ellipsis and
/// the whole length in bytes (`aaaa… (5242880 bytes)`).
pub struct Echo<'a>(pub &'a str);

impl fmt::Display for Echo<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.char_indices().nth(MAX_ECHO_CHARS) {
            None => f.write_str(self.0),
            Some((cut, _)) => write!(f, "{}… ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

/// [`Echo`] as an owned string.
pub fn echo(text: &str) -> String {
    Echo(text).to_string()
}

/// Every line of a multi-line message (a TOML error with its excerpt and caret) cut like
/// [`Echo`], so the message keeps its shape.
pub fn echo_lines(text: &str) -> String {
    text.lines()
        .map(|line| Echo(line).to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_are_kept_and_long_ones_cut_with_their_length() {
        assert_eq!(echo("enforce"), "enforce");
        let exact = "x".repeat(MAX_ECHO_CHARS);
        assert_eq!(echo(&exact), exact);
        let long = "y".repeat(5 << 20);
        let cut = echo(&long);
        assert_eq!(cut, format!("{}… (5242880 bytes)", "y".repeat(64)));
        // Cut on a character boundary.
        let wide = "é".repeat(100);
        assert_eq!(echo(&wide), format!("{}… (200 bytes)", "é".repeat(64)));
        let lines = echo_lines(&format!("line 1\n{long}\n  ^"));
        assert_eq!(lines.lines().count(), 3);
        assert!(lines.len() < 200, "{lines}");
    }
}
