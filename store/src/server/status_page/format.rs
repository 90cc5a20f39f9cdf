//! Numbers, sizes, durations and times as the page writes them, and text escaped for HTML.

use chrono::{DateTime, Utc};

/// Text for HTML content and attribute values.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn bytes(n: i64) -> String {
    let n = n.max(0) as f64;
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A short number: at most three significant digits, no trailing zeros.
pub(super) fn num(v: f64) -> String {
    let a = v.abs();
    let s = if a == 0.0 {
        return "0".into();
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

pub(super) fn secs(s: f64) -> String {
    if s < 1.0 {
        format!("{} ms", (s * 1000.0).round())
    } else if s < 120.0 {
        format!("{:.0} s", s)
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

pub(super) fn ago_secs(s: f64) -> String {
    if s < 1.0 {
        "just now".to_string()
    } else {
        format!("{} ago", secs(s))
    }
}

pub(super) fn ago(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    ago_secs((now - at).num_milliseconds().max(0) as f64 / 1000.0)
}

pub(super) fn clock(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if at.date_naive() == now.date_naive() {
        at.format("%H:%M:%S").to_string()
    } else {
        at.format("%Y-%m-%d %H:%M:%S").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::status_page::chart::nice_ceiling;

    #[test]
    fn numbers_read_short() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (0.25, "0.25"),
            (1.5, "1.5"),
            (12.34, "12.3"),
            (250.0, "250"),
        ];
        for (v, want) in cases {
            assert_eq!(num(*v), *want);
        }
        let ceilings: &[(f64, f64)] = &[
            (0.0, 1.0),
            (0.7, 1.0),
            (1.0, 1.0),
            (1.2, 2.0),
            (3.0, 5.0),
            (60.0, 100.0),
        ];
        for (v, want) in ceilings {
            assert_eq!(nice_ceiling(*v), *want, "{v}");
        }
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(secs(0.25), "250 ms");
        assert_eq!(secs(90.0), "90 s");
        assert_eq!(secs(600.0), "10 min");
    }
}
