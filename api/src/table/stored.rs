//! The rows of the kinds rkube stores for other programs to act on (an ingress controller, a
//! network plugin, CSI drivers), as kubectl's printers write them.

use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use super::format::{arr, or_none};

/// The cells after the name (the Age cell left null for the caller), or None for a kind
/// these rows don't cover.
pub(super) fn stored_row(group: &str, kind: &str, o: &Value) -> Option<Vec<Value>> {
    let flag =
        |ptr: &str, default: bool| o.pointer(ptr).and_then(Value::as_bool).unwrap_or(default);
    Some(match (group, kind) {
        ("networking.k8s.io", "Ingress") => vec![
            json!(or_none(s(o, "/spec/ingressClassName").to_string())),
            json!(ingress_hosts(arr(o, "/spec/rules"))),
            json!(ingress_address(o)),
            json!(if arr(o, "/spec/tls").is_empty() {
                "80"
            } else {
                "80, 443"
            }),
            Value::Null,
        ],
        ("networking.k8s.io", "IngressClass") => {
            let parameters = match o.pointer("/spec/parameters") {
                None => "<none>".to_string(),
                Some(p) => {
                    let mut kind = s(p, "/kind").to_string();
                    if let Some(g) = p.get("apiGroup").and_then(Value::as_str) {
                        kind = format!("{kind}.{g}");
                    }
                    format!("{kind}/{}", s(p, "/name"))
                }
            };
            vec![
                json!(s(o, "/spec/controller")),
                json!(parameters),
                Value::Null,
            ]
        }
        ("networking.k8s.io", "NetworkPolicy") => vec![
            json!(super::format::selector_string(
                o.pointer("/spec/podSelector")
                    .filter(|p| p.as_object().is_some_and(|m| !m.is_empty()))
            )),
            Value::Null,
        ],
        ("node.k8s.io", "RuntimeClass") => vec![json!(s(o, "/handler")), Value::Null],
        ("storage.k8s.io", "CSIDriver") => {
            let audiences: Vec<&str> = arr(o, "/spec/tokenRequests")
                .iter()
                .map(|t| s(t, "/audience"))
                .collect();
            let modes: Vec<&str> = arr(o, "/spec/volumeLifecycleModes")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            vec![
                json!(flag("/spec/attachRequired", true)),
                json!(flag("/spec/podInfoOnMount", false)),
                json!(flag("/spec/storageCapacity", false)),
                json!(if audiences.is_empty() {
                    "<unset>".to_string()
                } else {
                    audiences.join(",")
                }),
                json!(flag("/spec/requiresRepublish", false)),
                json!(or_none(modes.join(","))),
                Value::Null,
            ]
        }
        ("storage.k8s.io", "CSINode") => vec![json!(arr(o, "/spec/drivers").len()), Value::Null],
        ("storage.k8s.io", "CSIStorageCapacity") => vec![
            json!(s(o, "/storageClassName")),
            json!(match o.get("capacity").and_then(Value::as_str) {
                Some(c) => c.to_string(),
                None => "<unset>".to_string(),
            }),
        ],
        ("storage.k8s.io", "VolumeAttachment") => vec![
            json!(s(o, "/spec/attacher")),
            json!(s(o, "/spec/source/persistentVolumeName")),
            json!(s(o, "/spec/nodeName")),
            json!(flag("/status/attached", false)),
            Value::Null,
        ],
        _ => return None,
    })
}

/// The hosts of an Ingress's rules: the first three named, `*` when none names one.
fn ingress_hosts(rules: &[Value]) -> String {
    const MAX: usize = 3;
    let mut hosts: Vec<&str> = Vec::new();
    let mut more = false;
    for r in rules {
        more = more || hosts.len() == MAX;
        if !more && !s(r, "/host").is_empty() {
            hosts.push(s(r, "/host"));
        }
    }
    if hosts.is_empty() {
        return "*".into();
    }
    let list = hosts.join(",");
    if more {
        format!("{list} + {} more...", rules.len() - MAX)
    } else {
        list
    }
}

/// The addresses an ingress controller published, cut to 16 characters as kubectl does.
fn ingress_address(o: &Value) -> String {
    const WIDTH: usize = 16;
    let addrs: Vec<&str> = arr(o, "/status/loadBalancer/ingress")
        .iter()
        .map(|i| match s(i, "/ip") {
            "" => s(i, "/hostname"),
            ip => ip,
        })
        .filter(|a| !a.is_empty())
        .collect();
    let joined = addrs.join(",");
    if joined.len() > WIDTH {
        let cut: String = joined.chars().take(WIDTH - 3).collect();
        format!("{cut}...")
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ingress_cells() {
        let ing = json!({"spec": {"ingressClassName": "nginx",
            "rules": [{"host": "a.example.com"}, {}, {"host": "c.example.com"}, {"host": "d.example.com"},
                      {"host": "e.example.com"}],
            "tls": [{"hosts": ["a.example.com"]}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "192.168.10.200"}, {"hostname": "lb.example.com"}]}}});
        let row = stored_row("networking.k8s.io", "Ingress", &ing).unwrap();
        assert_eq!(row[0], "nginx");
        assert_eq!(
            row[1],
            "a.example.com,c.example.com,d.example.com + 2 more..."
        );
        assert_eq!(row[2], "192.168.10.20...");
        assert_eq!(row[3], "80, 443");
        let bare = stored_row("networking.k8s.io", "Ingress", &json!({"spec": {}})).unwrap();
        assert_eq!(
            (bare[0].clone(), bare[1].clone(), bare[3].clone()),
            (json!("<none>"), json!("*"), json!("80"))
        );
    }

    #[test]
    fn policy_class_and_storage_cells() {
        // (group, kind, object, cells without the Age one)
        let cases = [
            (
                "networking.k8s.io",
                "NetworkPolicy",
                json!({"spec": {"podSelector": {}}}),
                vec![json!("<none>")],
            ),
            (
                "networking.k8s.io",
                "NetworkPolicy",
                json!({"spec": {"podSelector": {"matchLabels": {"app": "db"}}}}),
                vec![json!("app=db")],
            ),
            (
                "networking.k8s.io",
                "IngressClass",
                json!({"spec": {"controller": "k8s.io/ingress-nginx",
                "parameters": {"apiGroup": "k8s.example.com", "kind": "Params", "name": "p"}}}),
                vec![
                    json!("k8s.io/ingress-nginx"),
                    json!("Params.k8s.example.com/p"),
                ],
            ),
            (
                "node.k8s.io",
                "RuntimeClass",
                json!({"handler": "runc"}),
                vec![json!("runc")],
            ),
            (
                "storage.k8s.io",
                "CSINode",
                json!({"spec": {"drivers": [{}, {}]}}),
                vec![json!(2)],
            ),
            (
                "storage.k8s.io",
                "VolumeAttachment",
                json!({"spec": {"attacher": "a.io", "nodeName": "n1",
                "source": {"persistentVolumeName": "pv1"}}, "status": {"attached": true}}),
                vec![json!("a.io"), json!("pv1"), json!("n1"), json!(true)],
            ),
            (
                "storage.k8s.io",
                "CSIStorageCapacity",
                json!({"storageClassName": "fast"}),
                vec![json!("fast"), json!("<unset>")],
            ),
            (
                "storage.k8s.io",
                "CSIDriver",
                json!({"spec": {"volumeLifecycleModes": ["Persistent", "Ephemeral"]}}),
                vec![
                    json!(true),
                    json!(false),
                    json!(false),
                    json!("<unset>"),
                    json!(false),
                    json!("Persistent,Ephemeral"),
                ],
            ),
        ];
        for (group, kind, o, want) in cases {
            let row: Vec<Value> = stored_row(group, kind, &o)
                .unwrap()
                .into_iter()
                .filter(|c| !c.is_null())
                .collect();
            assert_eq!(row, want, "{kind}");
        }
    }
}
