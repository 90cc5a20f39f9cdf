//! Server-side printing: `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` turns objects
//! into rows with the columns kubectl shows for each kind (priority 1 columns appear with
//! `-o wide`). Also PartialObjectMetadata, the metadata-only form.

use chrono::{DateTime, Utc};
use rkube_core::json::int_at as i;
use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use crate::resources::Resource;

/// What the client asked the response to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Object,
    Table,
    Metadata,
}

pub fn form(accept: &str) -> Form {
    // The first acceptable media type wins, as in content negotiation.
    for part in accept.split(',') {
        if part.contains("as=Table") && part.contains("g=meta.k8s.io") {
            if part.contains("v=v1") && !part.contains("v=v1beta1") {
                return Form::Table;
            }
            continue;
        }
        if part.contains("as=PartialObjectMetadata")
            && part.contains("v=v1")
            && !part.contains("v=v1beta1")
        {
            return Form::Metadata;
        }
        if part.trim().starts_with("application/json") || part.contains("*/*") {
            return Form::Object;
        }
    }
    Form::Object
}

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

fn age(v: Option<&Value>, now: DateTime<Utc>) -> String {
    v.and_then(Value::as_str)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| human_duration((now - t.with_timezone(&Utc)).num_seconds()))
        .unwrap_or_else(|| "<unknown>".into())
}

fn or_none(v: String) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v
    }
}

fn arr<'a>(o: &'a Value, ptr: &str) -> &'a [Value] {
    o.pointer(ptr)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn containers_images(o: &Value, ptr: &str) -> (String, String) {
    let cs = arr(o, ptr);
    let names: Vec<&str> = cs.iter().map(|c| s(c, "/name")).collect();
    let images: Vec<&str> = cs.iter().map(|c| s(c, "/image")).collect();
    (names.join(","), images.join(","))
}

fn selector_string(sel: Option<&Value>) -> String {
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

/// The READY, STATUS and RESTARTS columns as kubectl's pod printer derives them: init
/// containers first (`Init:1/2`, `Init:Error`, `Init:CrashLoopBackOff`; sidecars, init
/// containers that always restart, count as containers once started), then the containers,
/// last to first, the first waiting or terminated reason winning.
fn pod_row(p: &Value) -> Vec<Value> {
    let init_specs = arr(p, "/spec/initContainers");
    let sidecar = |name: &str| {
        init_specs
            .iter()
            .any(|c| s(c, "/name") == name && s(c, "/restartPolicy") == "Always")
    };
    let mut total = arr(p, "/spec/containers").len()
        + init_specs
            .iter()
            .filter(|c| s(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0;
    let mut restarts: i64 = 0;
    let mut sidecar_restarts: i64 = 0;
    let mut reason = s(p, "/status/phase").to_string();
    if !s(p, "/status/reason").is_empty() {
        reason = s(p, "/status/reason").to_string();
    }
    let exit_reason = |c: &Value, prefix: &str| -> String {
        let signal = i(c, "/state/terminated/signal");
        match c
            .pointer("/state/terminated/reason")
            .and_then(Value::as_str)
        {
            Some(r) if !r.is_empty() => format!("{prefix}{r}"),
            _ if signal != 0 => format!("{prefix}Signal:{signal}"),
            _ => format!("{prefix}ExitCode:{}", i(c, "/state/terminated/exitCode")),
        }
    };
    let mut initializing = false;
    for (n, c) in arr(p, "/status/initContainerStatuses").iter().enumerate() {
        restarts += i(c, "/restartCount");
        let is_sidecar = sidecar(s(c, "/name"));
        let started = c["started"] == json!(true);
        if is_sidecar && started {
            sidecar_restarts += i(c, "/restartCount");
        }
        let terminated = c.pointer("/state/terminated").is_some();
        let waiting = s(c, "/state/waiting/reason");
        if terminated && i(c, "/state/terminated/exitCode") == 0 {
            continue;
        }
        if is_sidecar && started {
            if c["ready"] == json!(true) {
                ready += 1;
            }
            continue;
        }
        reason = if terminated {
            exit_reason(c, "Init:")
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{n}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }
    let initialized = arr(p, "/status/conditions")
        .iter()
        .any(|c| s(c, "/type") == "Initialized" && s(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        let mut running = false;
        for c in arr(p, "/status/containerStatuses").iter().rev() {
            restarts += i(c, "/restartCount");
            let waiting = s(c, "/state/waiting/reason");
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if c.pointer("/state/terminated").is_some() {
                reason = exit_reason(c, "");
            } else if c["ready"] == json!(true) && c.pointer("/state/running").is_some() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            let pod_ready = arr(p, "/status/conditions")
                .iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    total = total.max(ready);
    if p.pointer("/metadata/deletionTimestamp").is_some() {
        reason = if s(p, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    let ip = or_none(s(p, "/status/podIP").to_string());
    let node = or_none(s(p, "/spec/nodeName").to_string());
    let nominated = or_none(s(p, "/status/nominatedNodeName").to_string());
    vec![
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        Value::Null,
        json!(ip),
        json!(node),
        json!(nominated),
        json!("<none>"),
    ]
}

fn service_row(o: &Value) -> Vec<Value> {
    let ty = s(o, "/spec/type");
    let ips = arr(o, "/status/loadBalancer/ingress");
    let mut external: Vec<String> = arr(o, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    external.extend(ips.iter().map(|i| {
        let ip = s(i, "/ip");
        if ip.is_empty() {
            s(i, "/hostname").to_string()
        } else {
            ip.to_string()
        }
    }));
    let external = match ty {
        "ExternalName" => s(o, "/spec/externalName").to_string(),
        "LoadBalancer" if external.is_empty() => "<pending>".into(),
        _ => or_none(external.join(",")),
    };
    let ports: Vec<String> = arr(o, "/spec/ports")
        .iter()
        .map(|p| {
            let port = i(p, "/port");
            let proto = s(p, "/protocol");
            match p.get("nodePort").and_then(Value::as_i64) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    let cluster_ip = or_none(s(o, "/spec/clusterIP").to_string());
    vec![
        json!(ty),
        json!(cluster_ip),
        json!(external),
        json!(or_none(ports.join(","))),
        Value::Null,
        json!(selector_string(o.pointer("/spec/selector"))),
    ]
}

fn node_row(o: &Value) -> Vec<Value> {
    let ready = arr(o, "/status/conditions")
        .iter()
        .find(|c| s(c, "/type") == "Ready");
    let mut status = match ready.map(|c| s(c, "/status")) {
        Some("True") => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if o.pointer("/spec/unschedulable") == Some(&json!(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
        .collect();
    let addr = |t: &str| {
        or_none(
            arr(o, "/status/addresses")
                .iter()
                .find(|a| s(a, "/type") == t)
                .map(|a| s(a, "/address").to_string())
                .unwrap_or_default(),
        )
    };
    vec![
        json!(status),
        json!(or_none(roles.join(","))),
        Value::Null,
        json!(s(o, "/status/nodeInfo/kubeletVersion")),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(or_none(s(o, "/status/nodeInfo/osImage").into())),
        json!(or_none(s(o, "/status/nodeInfo/kernelVersion").into())),
        json!(or_none(
            s(o, "/status/nodeInfo/containerRuntimeVersion").into()
        )),
    ]
}

fn event_object(o: &Value) -> String {
    let kind = s(o, "/involvedObject/kind").to_lowercase();
    format!("{kind}/{}", s(o, "/involvedObject/name"))
}

type Columns = &'static [(&'static str, &'static str, u8)];

/// The columns of a kind (name, type, priority), without the leading Name column when the
/// kind's printer does not start with it (events).
fn columns(res: &Resource) -> Columns {
    match (res.group, res.kind) {
        ("", "Pod") => &[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "string", 0),
            ("Age", "string", 0),
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
            ("Readiness Gates", "string", 1),
        ],
        ("apps", "Deployment") => &[
            ("Name", "string", 0),
            ("Ready", "string", 0),
            ("Up-to-date", "string", 0),
            ("Available", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        ("apps", "ReplicaSet") | ("", "ReplicationController") => &[
            ("Name", "string", 0),
            ("Desired", "integer", 0),
            ("Current", "integer", 0),
            ("Ready", "integer", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        ("", "Service") => &[
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Cluster-IP", "string", 0),
            ("External-IP", "string", 0),
            ("Port(s)", "string", 0),
            ("Age", "string", 0),
            ("Selector", "string", 1),
        ],
        ("certificates.k8s.io", "CertificateSigningRequest") => &[
            ("Name", "string", 0),
            ("Age", "date", 0),
            ("SignerName", "string", 0),
            ("Requestor", "string", 0),
            ("RequestedDuration", "string", 0),
            ("Condition", "string", 0),
        ],
        ("", "Node") => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Roles", "string", 0),
            ("Age", "string", 0),
            ("Version", "string", 0),
            ("Internal-IP", "string", 1),
            ("External-IP", "string", 1),
            ("OS-Image", "string", 1),
            ("Kernel-Version", "string", 1),
            ("Container-Runtime", "string", 1),
        ],
        ("", "Namespace") => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "ConfigMap") => &[
            ("Name", "string", 0),
            ("Data", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "Secret") => &[
            ("Name", "string", 0),
            ("Type", "string", 0),
            ("Data", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "ServiceAccount") => &[
            ("Name", "string", 0),
            ("Secrets", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "Endpoints") => &[
            ("Name", "string", 0),
            ("Endpoints", "string", 0),
            ("Age", "string", 0),
        ],
        ("discovery.k8s.io", "EndpointSlice") => &[
            ("Name", "string", 0),
            ("AddressType", "string", 0),
            ("Ports", "string", 0),
            ("Endpoints", "string", 0),
            ("Age", "string", 0),
        ],
        ("", "Event") | ("events.k8s.io", "Event") => &[
            ("Last Seen", "string", 0),
            ("Type", "string", 0),
            ("Reason", "string", 0),
            ("Object", "string", 0),
            ("Message", "string", 0),
        ],
        ("", "ResourceQuota") => &[
            ("Name", "string", 0),
            ("Age", "string", 0),
            ("Request", "string", 0),
            ("Limit", "string", 0),
        ],
        ("coordination.k8s.io", "Lease") => &[
            ("Name", "string", 0),
            ("Holder", "string", 0),
            ("Age", "string", 0),
        ],
        ("scheduling.k8s.io", "PriorityClass") => &[
            ("Name", "string", 0),
            ("Value", "integer", 0),
            ("Global-Default", "boolean", 0),
            ("Age", "string", 0),
            ("PreemptionPolicy", "string", 0),
        ],
        ("rbac.authorization.k8s.io", "RoleBinding" | "ClusterRoleBinding") => &[
            ("Name", "string", 0),
            ("Role", "string", 0),
            ("Age", "string", 0),
            ("Users", "string", 1),
            ("Groups", "string", 1),
            ("ServiceAccounts", "string", 1),
        ],
        ("rbac.authorization.k8s.io", _) | ("", "LimitRange") => {
            &[("Name", "string", 0), ("Created At", "date", 0)]
        }
        _ => &[("Name", "string", 0), ("Age", "string", 0)],
    }
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
fn cells(res: &Resource, o: &Value, now: DateTime<Utc>) -> Vec<Value> {
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
        _ => vec![name, Value::Null],
    };
    // The Age column is filled here, wherever the kind's printer puts it.
    if let Some(pos) = columns(res).iter().position(|(n, _, _)| *n == "Age") {
        if let Some(cell) = row.get_mut(pos) {
            *cell = a;
        }
    }
    row
}

/// `PartialObjectMetadata` of an object.
pub fn metadata_only(o: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// A Table of objects. `include` is the includeObject parameter: None, Object or Metadata
/// (the default).
pub fn table(res: &Resource, objects: &[Value], list_meta: Value, include: &str) -> Value {
    let now = Utc::now();
    let defs: Vec<Value> = columns(res)
        .iter()
        .map(|(name, ty, priority)| {
            json!({"name": name, "type": ty, "format": if *name == "Name" { "name" } else { "" },
                   "description": "", "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => metadata_only(o),
            };
            json!({"cells": cells(res, o, now), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_slices_show_their_type_ports_and_first_addresses() {
        let res = find("discovery.k8s.io", "v1", "endpointslices").unwrap();
        let slice = json!({"metadata": {"name": "web-x", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "addressType": "IPv4", "ports": [{"port": 8080}, {"port": 53}],
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]},
                          {"addresses": ["10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]});
        let t = table(res, &[slice], json!({}), "Metadata");
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "IPv4");
        assert_eq!(cells[2], "8080,53");
        assert_eq!(cells[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...");
    }

    #[test]
    fn pod_status_column_follows_kubectl_s_printer() {
        let status = |v: Value| pod_row(&v)[1].as_str().unwrap().to_string();
        let two_inits = json!({"spec": {"initContainers": [{"name": "a"}, {"name": "b"}],
                                        "containers": [{"name": "c"}]}});
        let mut p = two_inits.clone();
        p["status"] = json!({"phase": "Pending",
            "initContainerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                {"name": "b", "state": {"running": {}}}],
            "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]});
        assert_eq!(status(p), "Init:1/2");
        let mut p = two_inits.clone();
        p["status"] = json!({"phase": "Failed",
            "initContainerStatuses": [{"name": "a", "state": {"terminated": {"exitCode": 4, "reason": "Error"}}}],
            "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]});
        assert_eq!(status(p), "Init:Error");
        let mut p = two_inits;
        p["status"] = json!({"phase": "Pending",
            "initContainerStatuses": [{"name": "a", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]});
        assert_eq!(status(p), "Init:CrashLoopBackOff");
        let p = json!({"spec": {"containers": [{"name": "c"}, {"name": "d"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
              "containerStatuses": [
                {"name": "c", "ready": true, "restartCount": 2, "state": {"running": {}}},
                {"name": "d", "restartCount": 1, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        let row = pod_row(&p);
        assert_eq!(
            (row[0].clone(), row[1].clone(), row[2].clone()),
            (json!("1/2"), json!("NotReady"), json!(3))
        );
    }
    use crate::resources::find;

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

    #[test]
    fn pod_table_has_kubectl_columns() {
        let res = find("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "containerStatuses": [{"ready": true, "restartCount": 2, "state": {"running": {}}}]}});
        let t = table(res, &[pod], json!({}), "Metadata");
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "1/1");
        assert_eq!(cells[2], "Running");
        assert_eq!(cells[3], 2);
        assert!(
            cells[4].as_str().unwrap().ends_with('y') || cells[4].as_str().unwrap().contains('y')
        );
        assert_eq!(cells[5], "10.0.0.5");
        assert_eq!(cells[6], "n1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn accept_negotiation() {
        assert_eq!(form("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"), Form::Table);
        assert_eq!(form("application/json"), Form::Object);
        assert_eq!(
            form(
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
            ),
            Form::Metadata
        );
    }
}
