//! Answers written as JSON the way kube-apiserver writes them (Go's `encoding/json`): compact,
//! object keys sorted, and `<`, `>`, `&`, U+2028 and U+2029 inside strings escaped as
//! `\u003c`, `\u003e`, `\u0026`, `\u2028` and `\u2029`.
//!
//! Clients compare some answers byte for byte: `kubectl rollout undo` holds a
//! ControllerRevision's `data` as the raw bytes it read and skips the rollback when they equal
//! the patch it makes itself from the workload's template with `encoding/json`, so a template
//! holding `&` (a shell command) must reach it escaped as Go escapes it.

use std::io;

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

/// serde_json's compact output with Go's HTML-safe string escapes.
struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let bytes = fragment.as_bytes();
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escaped = match c {
                '<' => "\\u003c",
                '>' => "\\u003e",
                '&' => "\\u0026",
                '\u{2028}' => "\\u2028",
                '\u{2029}' => "\\u2029",
                _ => continue,
            };
            writer.write_all(&bytes[start..i])?;
            writer.write_all(escaped.as_bytes())?;
            start = i + c.len_utf8();
        }
        writer.write_all(&bytes[start..])
    }

    // The rest is compact output: the trait's defaults are serde_json's CompactFormatter.
}

/// `value` as kube-apiserver would write it.
pub fn to_vec(value: &impl Serialize) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    value.serialize(&mut Serializer::with_formatter(&mut out, GoFormatter))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_escaped_as_go_escapes_them() {
        let cases = [
            (json!("sleep 1 & wait"), r#""sleep 1 \u0026 wait""#),
            (json!("<b>"), r#""\u003cb\u003e""#),
            (json!("a\u{2028}b\u{2029}"), r#""a\u2028b\u2029""#),
            (json!("tab\there \"q\" é"), r#""tab\there \"q\" é""#),
            (
                json!({"z": 1, "a&": [true, null, 1.5]}),
                // Keys keep their order (Kubernetes' field order was set when it was stored).
                r#"{"z":1,"a\u0026":[true,null,1.5]}"#,
            ),
        ];
        for (value, want) in cases {
            assert_eq!(String::from_utf8(to_vec(&value).unwrap()).unwrap(), want);
        }
    }
}
