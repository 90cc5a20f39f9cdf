//! events.k8s.io/v1 Events are core/v1 Events seen another way, as in Kubernetes: one store
//! folder (/registry/events) holds them in the core form, and requests to events.k8s.io are
//! converted on the way in (bodies, patches, field selectors) and on the way out (objects, lists,
//! watch events). The two forms differ only in the names of top-level fields.

use serde_json::Value;

use crate::query::Query;

/// (events.k8s.io/v1 name, core/v1 name) of every field whose name differs.
const RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

const EVENTS_API_VERSION: &str = "events.k8s.io/v1";

fn rename(o: &mut serde_json::Map<String, Value>, to_core: bool) {
    for (new, core) in RENAMES {
        let (from, to) = if to_core { (new, core) } else { (core, new) };
        if let Some(v) = o.shift_remove(*from) {
            o.insert(to.to_string(), v);
        }
    }
}

/// An events.k8s.io/v1 Event (or a merge patch of one) in the core form.
pub fn to_core(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        rename(o, true);
        if o.contains_key("apiVersion") {
            o.insert("apiVersion".into(), Value::from("v1"));
        }
    }
}

/// A stored core Event in the events.k8s.io/v1 form.
pub fn from_core(v: &mut Value) {
    if let Some(o) = v.as_object_mut() {
        rename(o, false);
        o.insert("apiVersion".into(), Value::from(EVENTS_API_VERSION));
    }
}

/// A JSON patch's paths in the core form.
fn json_patch_to_core(ops: &mut Value) {
    let Some(ops) = ops.as_array_mut() else {
        return;
    };
    for op in ops {
        for field in ["path", "from"] {
            let Some(p) = op.get(field).and_then(Value::as_str) else {
                continue;
            };
            let first = p.trim_start_matches('/').split('/').next().unwrap_or("");
            if let Some((_, core)) = RENAMES.iter().find(|(new, _)| *new == first) {
                let rest = &p[1 + first.len()..];
                op[field] = Value::from(format!("/{core}{rest}"));
            }
        }
    }
}

/// Field selectors name events.k8s.io fields (`regarding.name`, `reportingController`); the
/// store's objects have the core names.
pub fn query_to_core(q: &Query) -> Query {
    q.map_value("fieldSelector", |sel| {
        sel.split(',')
            .map(|term| {
                let first = term.split(['.', '=', '!']).next().unwrap_or("");
                match RENAMES.iter().find(|(new, _)| *new == first) {
                    Some((_, core)) => format!("{core}{}", &term[first.len()..]),
                    None => term.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// events.k8s.io/v1 Events, served as the stored core Events.
pub static EVENTS: crate::view::View = crate::view::View {
    stored: ("", "v1", "events"),
    kind: "Event",
    stored_api_version: "v1",
    to_stored: to_core,
    json_patch_to_stored: json_patch_to_core,
    from_stored: from_core,
    query_to_stored: query_to_core,
};

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use serde_json::json;

    #[test]
    fn the_two_forms_convert_both_ways() {
        let new = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                         "metadata": {"name": "e1", "namespace": "default"},
                         "regarding": {"kind": "Pod", "name": "web"}, "note": "pulled",
                         "reason": "Pulled", "type": "Normal",
                         "reportingController": "kubelet", "reportingInstance": "n1",
                         "eventTime": "2026-12-03T00:00:00.000000Z", "action": "Pull"});
        let mut core = new.clone();
        to_core(&mut core);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "web");
        assert_eq!(core["message"], "pulled");
        assert_eq!(core["reportingComponent"], "kubelet");
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
        let mut back = core.clone();
        from_core(&mut back);
        assert_eq!(back, new);
    }

    #[test]
    fn patches_and_selectors_are_renamed() {
        let (b, ct) = EVENTS.body_to_stored(
            &Bytes::from(r#"[{"op":"replace","path":"/note","value":"x"},{"op":"add","path":"/regarding/name","value":"y"}]"#),
            "application/json-patch+json",
        )
        .unwrap();
        assert_eq!(ct, "application/json-patch+json");
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v[0]["path"], "/message");
        assert_eq!(v[1]["path"], "/involvedObject/name");
        assert!(
            EVENTS
                .body_to_stored(&Bytes::from("note: hi\n"), "application/merge-patch+json")
                .is_err(),
            "YAML is not a merge patch"
        );
        let q = query_to_core(&Query::parse(Some(
            "fieldSelector=regarding.name%3Dweb,reportingController%3Dkubelet,type%3DNormal",
        )));
        assert_eq!(
            q.get("fieldSelector"),
            Some("involvedObject.name=web,reportingComponent=kubelet,type=Normal")
        );
    }

    #[test]
    fn answers_are_converted_line_by_line() {
        let line = br#"{"type":"ADDED","object":{"kind":"Event","apiVersion":"v1","message":"m"}}
"#;
        let out = EVENTS.convert_bytes(line);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["object"]["note"], "m");
        assert_eq!(v["object"]["apiVersion"], "events.k8s.io/v1");
        assert!(out.ends_with(b"\n"));
        let list =
            br#"{"kind":"EventList","apiVersion":"v1","items":[{"kind":"Event","message":"a"}]}"#;
        let v: Value = serde_json::from_slice(&EVENTS.convert_bytes(list)).unwrap();
        assert_eq!(v["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v["items"][0]["note"], "a");
        let status = br#"{"kind":"Status","code":404}"#;
        assert_eq!(&EVENTS.convert_bytes(status)[..], &status[..]);
    }
}
