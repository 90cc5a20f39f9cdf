//! The cells of an object's row, by kind, with the Age column filled wherever the kind's
//! printer puts it.

use chrono::{DateTime, Utc};
use rkube_core::json::int_at as i;
use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use super::columns::columns;
use super::format::{age, arr, containers_images, human_duration, or_none, selector_string};
use super::rows::{node_row, pod_row, service_row};
use super::stored::stored_row;
use crate::resources::Resource;

fn event_object(o: &Value) -> String {
    let kind = s(o, "/involvedObject/kind").to_lowercase();
    format!("{kind}/{}", s(o, "/involvedObject/name"))
}

fn quota_pairs(o: &Value, prefix: &str, select: impl Fn(&str) -> bool) -> String {
    let hard = o
        .pointer("/status/hard")
        .or(o.pointer("/spec/hard"))
        .and_then(Value::as_object);
    let used = o.pointer("/status/used").and_then(Value::as_object);
    let mut keys: Vec<&String> = hard
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| select(k))
        .collect();
    keys.sort();
    let _ = prefix;
    keys.iter()
        .map(|k| {
            let h = hard
                .and_then(|h| h.get(*k))
                .and_then(Value::as_str)
                .unwrap_or("");
            let u = used
                .and_then(|u| u.get(*k))
                .and_then(Value::as_str)
                .unwrap_or("0");
            format!("{k}: {u}/{h}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The cells of one object's row, in [`columns`] order.
pub(super) fn cells(res: &Resource, o: &Value, now: DateTime<Utc>) -> Vec<Value> {
    let name = json!(s(o, "/metadata/name"));
    let created = o.pointer("/metadata/creationTimestamp");
    let a = json!(age(created, now));
    let mut row: Vec<Value> = match (res.group, res.kind) {
        ("", "Pod") => {
            let mut r = vec![name];
            r.extend(pod_row(o));
            r
        }
        ("apps", "Deployment") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    i(o, "/status/readyReplicas"),
                    i(o, "/spec/replicas")
                )),
                json!(i(o, "/status/updatedReplicas")),
                json!(i(o, "/status/availableReplicas")),
                Value::Null,
                json!(c),
                json!(im),
                json!(selector_string(o.pointer("/spec/selector"))),
            ]
        }
        ("apps", "ReplicaSet") | ("", "ReplicationController") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            vec![
                name,
                json!(i(o, "/spec/replicas")),
                json!(i(o, "/status/replicas")),
                json!(i(o, "/status/readyReplicas")),
                Value::Null,
                json!(c),
                json!(im),
                json!(selector_string(o.pointer("/spec/selector"))),
            ]
        }
        ("apps", "DaemonSet") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            vec![
                name,
                json!(i(o, "/status/desiredNumberScheduled")),
                json!(i(o, "/status/currentNumberScheduled")),
                json!(i(o, "/status/numberReady")),
                json!(i(o, "/status/updatedNumberScheduled")),
                json!(i(o, "/status/numberAvailable")),
                json!(selector_string(
                    o.pointer("/spec/template/spec/nodeSelector")
                )),
                Value::Null,
                json!(c),
                json!(im),
                json!(selector_string(o.pointer("/spec/selector"))),
            ]
        }
        ("apps", "StatefulSet") => {
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            let ready = format!(
                "{}/{}",
                i(o, "/status/readyReplicas"),
                i(o, "/spec/replicas")
            );
            vec![name, json!(ready), Value::Null, json!(c), json!(im)]
        }
        ("apps", "ControllerRevision") => {
            // kubectl names the controller by its lower-case kind.group and name.
            let controller = arr(o, "/metadata/ownerReferences")
                .iter()
                .find(|r| r.get("controller") == Some(&json!(true)))
                .map_or("<none>".to_string(), |r| {
                    let group = s(r, "/apiVersion").rsplit_once('/').map_or("", |(g, _)| g);
                    let kind = s(r, "/kind").to_lowercase();
                    let kind = if group.is_empty() {
                        kind
                    } else {
                        format!("{kind}.{group}")
                    };
                    format!("{kind}/{}", s(r, "/name"))
                });
            vec![
                name,
                json!(controller),
                json!(i(o, "/revision")),
                Value::Null,
            ]
        }
        ("", "Service") => {
            let mut r = vec![name];
            r.extend(service_row(o));
            r
        }
        ("", "Node") => {
            let mut r = vec![name];
            r.extend(node_row(o));
            r
        }
        ("", "Namespace") => vec![name, json!(s(o, "/status/phase")), Value::Null],
        ("", "ConfigMap") => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len())
                + o.get("binaryData")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len());
            vec![name, json!(n), Value::Null]
        }
        ("", "Secret") => {
            let n = o
                .get("data")
                .and_then(Value::as_object)
                .map_or(0, |m| m.len());
            vec![name, json!(s(o, "/type")), json!(n), Value::Null]
        }
        ("", "ServiceAccount") => vec![name, json!(arr(o, "/secrets").len()), Value::Null],
        ("", "Endpoints") => {
            let mut eps = Vec::new();
            for subset in arr(o, "/subsets") {
                for addr in arr(subset, "/addresses") {
                    for p in arr(subset, "/ports") {
                        eps.push(format!("{}:{}", s(addr, "/ip"), i(p, "/port")));
                    }
                }
            }
            vec![name, json!(or_none(eps.join(","))), Value::Null]
        }
        ("discovery.k8s.io", "EndpointSlice") => {
            let ports: Vec<String> = arr(o, "/ports")
                .iter()
                .map(|p| match p.get("port").and_then(Value::as_i64) {
                    Some(n) => n.to_string(),
                    None => "<unset>".into(),
                })
                .collect();
            let addrs: Vec<String> = arr(o, "/endpoints")
                .iter()
                .flat_map(|e| arr(e, "/addresses"))
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect();
            // kubectl's printer: the first three, then how many more.
            let shown = if addrs.len() > 3 {
                format!("{} + {} more...", addrs[..3].join(","), addrs.len() - 3)
            } else {
                addrs.join(",")
            };
            vec![
                name,
                json!(s(o, "/addressType")),
                json!(if ports.is_empty() {
                    "<unset>".to_string()
                } else {
                    ports.join(",")
                }),
                json!(if shown.is_empty() {
                    "<unset>".to_string()
                } else {
                    shown
                }),
                Value::Null,
            ]
        }
        ("", "Event") | ("events.k8s.io", "Event") => {
            let last = o
                .pointer("/lastTimestamp")
                .filter(|v| !v.is_null())
                .or(o.pointer("/eventTime"))
                .or(created);
            vec![
                json!(age(last, now)),
                json!(s(o, "/type")),
                json!(s(o, "/reason")),
                json!(event_object(o)),
                json!(s(o, "/message")),
            ]
        }
        ("", "ResourceQuota") => {
            let req = quota_pairs(o, "", |k| !k.starts_with("limits."));
            let lim = quota_pairs(o, "", |k| k.starts_with("limits."));
            vec![name, Value::Null, json!(req), json!(lim)]
        }
        ("coordination.k8s.io", "Lease") => {
            vec![name, json!(s(o, "/spec/holderIdentity")), Value::Null]
        }
        ("scheduling.k8s.io", "PriorityClass") => vec![
            name,
            json!(i(o, "/value")),
            json!(o.get("globalDefault") == Some(&json!(true))),
            Value::Null,
            json!(s(o, "/preemptionPolicy")),
        ],
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => {
            let subjects = arr(o, "/subjects");
            let of = |k: &str| {
                subjects
                    .iter()
                    .filter(|x| s(x, "/kind") == k)
                    .map(|x| {
                        if k == "ServiceAccount" {
                            format!("{}/{}", s(x, "/namespace"), s(x, "/name"))
                        } else {
                            s(x, "/name").to_string()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            vec![
                name,
                json!(format!(
                    "{}/{}",
                    s(o, "/roleRef/kind"),
                    s(o, "/roleRef/name")
                )),
                Value::Null,
                json!(of("User")),
                json!(of("Group")),
                json!(of("ServiceAccount")),
            ]
        }
        ("certificates.k8s.io", "CertificateSigningRequest") => {
            let mut conds: Vec<String> = arr(o, "/status/conditions")
                .iter()
                .filter(|c| s(c, "/status") == "True")
                .map(|c| s(c, "/type").to_string())
                .collect();
            if conds.is_empty() {
                conds.push("Pending".into());
            } else if !s(o, "/status/certificate").is_empty() {
                conds.push("Issued".into());
            }
            let duration = match o.pointer("/spec/expirationSeconds").and_then(Value::as_i64) {
                Some(secs) => human_duration(secs),
                None => "<none>".into(),
            };
            vec![
                name,
                Value::Null,
                json!(s(o, "/spec/signerName")),
                json!(s(o, "/spec/username")),
                json!(duration),
                json!(conds.join(",")),
            ]
        }
        ("rbac.authorization.k8s.io", _) | ("", "LimitRange") => {
            vec![name, json!(s(o, "/metadata/creationTimestamp"))]
        }
        ("policy", "PodDisruptionBudget") => {
            // kubectl prints an unset bound as N/A, a count as a number, a percentage as text.
            let bound = |ptr: &str| match o.pointer(ptr) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(p)) => p.clone(),
                _ => "N/A".to_string(),
            };
            vec![
                name,
                json!(bound("/spec/minAvailable")),
                json!(bound("/spec/maxUnavailable")),
                json!(i(o, "/status/disruptionsAllowed")),
                Value::Null,
            ]
        }
        ("", "PodTemplate") => {
            let (c, im) = containers_images(o, "/template/spec/containers");
            let labels = o
                .pointer("/template/metadata/labels")
                .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()));
            vec![name, json!(c), json!(im), json!(selector_string(labels))]
        }
        ("", "ComponentStatus") => {
            let healthy = arr(o, "/conditions")
                .iter()
                .find(|c| s(c, "/type") == "Healthy");
            let status = match healthy.map(|c| s(c, "/status")) {
                None => "Unknown",
                Some("True") => "Healthy",
                Some(_) => "Unhealthy",
            };
            vec![
                name,
                json!(status),
                json!(healthy.map_or("", |c| s(c, "/message"))),
                json!(healthy.map_or("", |c| s(c, "/error"))),
            ]
        }
        ("autoscaling", "HorizontalPodAutoscaler") => std::iter::once(name)
            .chain(super::autoscaling::row(o))
            .collect(),
        ("batch", kind) => match super::batch::batch_row(kind, o, now) {
            Some(rest) => std::iter::once(name).chain(rest).collect(),
            None => vec![name, Value::Null],
        },
        ("", "PersistentVolume") => std::iter::once(name)
            .chain(super::storage::volume_row(o))
            .collect(),
        ("", "PersistentVolumeClaim") => std::iter::once(name)
            .chain(super::storage::claim_row(o))
            .collect(),
        ("storage.k8s.io", "StorageClass") => super::storage::class_row(o),
        (group, kind) => match stored_row(group, kind, o) {
            Some(rest) => std::iter::once(name).chain(rest).collect(),
            None => vec![name, Value::Null],
        },
    };
    // The Age column is filled here, wherever the kind's printer puts it.
    if let Some(pos) = columns(res).iter().position(|(n, _, _)| *n == "Age") {
        if let Some(cell) = row.get_mut(pos) {
            *cell = a;
        }
    }
    row
}
