//! Byte positions of the `plugins` array in a conflist's text.
//!
//! The installer edits the text in place instead of re-serialising a parsed document: every
//! byte outside the one entry it adds or removes stays as the CNI (or the operator) wrote it
//! (key order, indentation, number formatting), so an uninstall gives back the original file
//! byte for byte. The text is always validated with serde_json first; this scanner only has to
//! find boundaries in JSON that is known to be well formed.

use std::ops::Range;

/// Where the `plugins` array and its elements are in the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginsLayout {
    /// The byte range of each element, in order.
    pub elements: Vec<Range<usize>>,
    /// The byte offset of the array's closing `]`.
    pub close: usize,
}

/// Finds the top-level `plugins` array of the JSON object `text` (the last one, if the key is
/// repeated, as serde_json keeps the last). `None` if there is none or the text is not a
/// well-formed JSON object.
pub fn plugins_layout(text: &str) -> Option<PluginsLayout> {
    let bytes = text.as_bytes();
    let mut pos = skip_ws(bytes, 0);
    if bytes.get(pos) != Some(&b'{') {
        return None;
    }
    pos = skip_ws(bytes, pos + 1);
    let mut found = None;
    if bytes.get(pos) == Some(&b'}') {
        return None;
    }
    loop {
        let key_end = string_end(bytes, pos)?;
        let key: String = serde_json::from_str(&text[pos..key_end]).ok()?;
        pos = skip_ws(bytes, key_end);
        if bytes.get(pos) != Some(&b':') {
            return None;
        }
        pos = skip_ws(bytes, pos + 1);
        let value_end = value_end(bytes, pos)?;
        if key == "plugins" && bytes[pos] == b'[' {
            found = Some(array_layout(bytes, pos)?);
        }
        pos = skip_ws(bytes, value_end);
        match bytes.get(pos)? {
            b',' => pos = skip_ws(bytes, pos + 1),
            b'}' => return found,
            _ => return None,
        }
    }
}

/// The value of `key` in the JSON object that `object` (a byte range of `text`) holds: its
/// byte range (the last, if the key is repeated). `None` if there is no such member or the
/// range is not a well-formed object.
pub fn member(text: &str, object: std::ops::Range<usize>, key: &str) -> Option<Range<usize>> {
    let bytes = &text.as_bytes()[..object.end];
    let mut pos = skip_ws(bytes, object.start);
    if bytes.get(pos) != Some(&b'{') {
        return None;
    }
    pos = skip_ws(bytes, pos + 1);
    if bytes.get(pos) == Some(&b'}') {
        return None;
    }
    let mut found = None;
    loop {
        let key_end = string_end(bytes, pos)?;
        let name: String = serde_json::from_str(&text[pos..key_end]).ok()?;
        pos = skip_ws(bytes, key_end);
        if bytes.get(pos) != Some(&b':') {
            return None;
        }
        pos = skip_ws(bytes, pos + 1);
        let value_end = value_end(bytes, pos)?;
        if name == key {
            found = Some(pos..value_end);
        }
        pos = skip_ws(bytes, value_end);
        match bytes.get(pos)? {
            b',' => pos = skip_ws(bytes, pos + 1),
            b'}' => return found,
            _ => return None,
        }
    }
}

fn array_layout(bytes: &[u8], open: usize) -> Option<PluginsLayout> {
    let mut elements = Vec::new();
    let mut pos = skip_ws(bytes, open + 1);
    if bytes.get(pos) == Some(&b']') {
        return Some(PluginsLayout {
            elements,
            close: pos,
        });
    }
    loop {
        let end = value_end(bytes, pos)?;
        elements.push(pos..end);
        pos = skip_ws(bytes, end);
        match bytes.get(pos)? {
            b',' => pos = skip_ws(bytes, pos + 1),
            b']' => {
                return Some(PluginsLayout {
                    elements,
                    close: pos,
                })
            }
            _ => return None,
        }
    }
}

fn skip_ws(bytes: &[u8], mut pos: usize) -> usize {
    while bytes
        .get(pos)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        pos += 1;
    }
    pos
}

/// The end (exclusive) of the string starting at `pos` (which must be its opening quote).
fn string_end(bytes: &[u8], pos: usize) -> Option<usize> {
    if bytes.get(pos) != Some(&b'"') {
        return None;
    }
    let mut i = pos + 1;
    loop {
        match bytes.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
}

/// The end (exclusive) of the value starting at `pos`.
fn value_end(bytes: &[u8], pos: usize) -> Option<usize> {
    match bytes.get(pos)? {
        b'"' => string_end(bytes, pos),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = pos;
            loop {
                match bytes.get(i)? {
                    b'"' => {
                        i = string_end(bytes, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        // A number, true, false or null: runs until a delimiter.
        _ => {
            let mut i = pos;
            while bytes
                .get(i)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                i += 1;
            }
            Some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements(text: &str) -> Vec<&str> {
        let layout = plugins_layout(text).expect("a plugins array");
        layout.elements.iter().map(|r| &text[r.clone()]).collect()
    }

    #[test]
    fn finds_every_element_whatever_it_contains() {
        let text = r#"{"name": "x", "plugins": [ {"type": "a", "s": "]}\"{["}, {"type": "b", "n": [1, {"c": null}]} ], "z": 1}"#;
        assert_eq!(
            elements(text),
            [
                r#"{"type": "a", "s": "]}\"{["}"#,
                r#"{"type": "b", "n": [1, {"c": null}]}"#
            ]
        );
        let layout = plugins_layout(text).unwrap();
        assert_eq!(&text[layout.close..layout.close + 1], "]");
    }

    #[test]
    fn ignores_nested_plugins_keys_and_keeps_the_last_top_level_one() {
        let text = r#"{"meta": {"plugins": [1]}, "plugins": [2], "plugins": [3, 4]}"#;
        assert_eq!(elements(text), ["3", "4"]);
    }

    #[test]
    fn an_escaped_key_is_still_the_plugins_key() {
        assert_eq!(elements(r#"{"plugin\u0073": [true]}"#), ["true"]);
    }

    #[test]
    fn no_plugins_array_is_none() {
        assert_eq!(plugins_layout(r#"{"type": "bridge"}"#), None);
        assert_eq!(plugins_layout(r#"{"plugins": {"type": "bridge"}}"#), None);
        assert_eq!(plugins_layout("[1]"), None);
        assert_eq!(plugins_layout("{}"), None);
        assert_eq!(plugins_layout(""), None);
    }

    #[test]
    fn an_empty_array_has_no_elements() {
        let layout = plugins_layout("{\"plugins\": [ \n ]}").unwrap();
        assert!(layout.elements.is_empty());
        assert_eq!(layout.close, 16);
    }
}
