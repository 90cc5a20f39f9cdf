//! Cells as kubectl writes them: durations and ages, `<none>` for empty, label selectors,
//! container names and images; and `arr`, a list at a JSON pointer or none.

use chrono::{DateTime, Utc};
use rkube_core::json::str_at as s;
use serde_json::Value;

/// kubectl's human-readable durations (`5s`, `3m20s`, `4h`, `12d`).
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let m = s / 60;
    let h = s / 3600;
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        if s % 60 == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{}s", s % 60)
        }
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{}m", m % 60)
        }
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        if h % 24 == 0 {
            format!("{}d", h / 24)
        } else {
            format!("{}d{}h", h / 24, h % 24)
        }
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        let y = h / (24 * 365);
        let d = (h / 24) % 365;
        if d == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{d}d")
        }
    } else {
        format!("{}y", h / (24 * 365))
    }
}

pub(super) fn age(v: Option<&Value>, now: DateTime<Utc>) -> String {
    v.and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| human_duration((now - t.with_timezone(&Utc)).num_seconds()))
        .unwrap_or_else(|| "<unknown>".into())
}

pub(super) fn or_none(v: String) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v
    }
}

pub(super) fn arr<'a>(o: &'a Value, ptr: &str) -> &'a [Value] {
    o.pointer(ptr)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

pub(super) fn containers_images(o: &Value, ptr: &str) -> (String, String) {
    let cs = arr(o, ptr);
    let names: Vec<&str> = cs.iter().map(|c| s(c, "/name")).collect();
    let images: Vec<&str> = cs.iter().map(|c| s(c, "/image")).collect();
    (names.join(","), images.join(","))
}

pub(super) fn selector_string(sel: Option<&Value>) -> String {
    let Some(sel) = sel else {
        return "<none>".into();
    };
    let mut parts = Vec::new();
    let labels = sel
        .get("matchLabels")
        .or(if sel.get("matchExpressions").is_none() {
            Some(sel)
        } else {
            None
        });
    if let Some(m) = labels.and_then(Value::as_object) {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str().unwrap_or("")));
        }
    }
    for e in sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = s(e, "/key");
        let values: Vec<&str> = arr(e, "/values").iter().filter_map(Value::as_str).collect();
        parts.push(match s(e, "/operator") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_string(),
            "DoesNotExist" => format!("!{key}"),
            _ => continue,
        });
    }
    or_none(parts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_like_kubectl() {
        for (secs, want) in [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (4 * 3600, "4h"),
            (5 * 3600 + 60, "5h1m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600, "3d1h"),
            (20 * 86400, "20d"),
        ] {
            assert_eq!(human_duration(secs), want);
        }
    }
}
