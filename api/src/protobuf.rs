//! Kubernetes' protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl's
//! typed commands send (`create namespace|configmap|secret|deployment|service|role|rolebinding|
//! clusterrole|clusterrolebinding|token|priorityclass|quota`, `auth can-i`, `auth whoami`),
//! decoded into the JSON the rest of the server works on.
//!
//! The envelope is the magic `k8s\0` followed by a `runtime.Unknown` (typeMeta = 1 {apiVersion
//! = 1, kind = 2}, raw = 2); `raw` is the object's message. Messages are described by the table
//! below — field numbers, JSON names and types as Kubernetes' generated.proto defines them — for
//! the kinds and fields those commands use. A field the table does not describe is refused with
//! 415 and a sentence naming it, never dropped.

use base64::Engine;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

#[derive(Clone, Copy)]
enum Ty {
    Str,
    Int,
    Bool,
    Msg(&'static str),
    /// map<string, string>
    MapStr,
    /// map<string, bytes> (base64 in JSON)
    MapBytes,
    /// map<string, Quantity>
    MapQuantity,
    Time,
    IntOrString,
    /// Read and dropped: the status of an object being created or replaced, which the server
    /// sets itself.
    Ignored,
}

struct F {
    num: u32,
    name: &'static str,
    ty: Ty,
    repeated: bool,
    /// A pointer field in Kubernetes' Go types: present means set, even to zero. Other scalar
    /// fields are always on the wire, and their zero value means unset (omitted in JSON).
    pointer: bool,
}

const fn f(num: u32, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: false,
        pointer: false,
    }
}

const fn p(num: u32, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: false,
        pointer: true,
    }
}

const fn r(num: u32, name: &'static str, ty: Ty) -> F {
    F {
        num,
        name,
        ty,
        repeated: true,
        pointer: false,
    }
}

use Ty::*;

/// Messages by name: (fields).
static MESSAGES: &[(&str, &[F])] = &[
    (
        "ObjectMeta",
        &[
            f(1, "name", Str),
            f(2, "generateName", Str),
            f(3, "namespace", Str),
            f(4, "selfLink", Str),
            f(5, "uid", Str),
            f(6, "resourceVersion", Str),
            f(7, "generation", Int),
            f(8, "creationTimestamp", Time),
            f(9, "deletionTimestamp", Time),
            p(10, "deletionGracePeriodSeconds", Int),
            f(11, "labels", MapStr),
            f(12, "annotations", MapStr),
            r(13, "ownerReferences", Msg("OwnerReference")),
            r(14, "finalizers", Str),
        ],
    ),
    (
        "OwnerReference",
        &[
            f(1, "kind", Str),
            f(3, "name", Str),
            f(4, "uid", Str),
            f(5, "apiVersion", Str),
            p(6, "controller", Bool),
            p(7, "blockOwnerDeletion", Bool),
        ],
    ),
    (
        "LabelSelector",
        &[
            f(1, "matchLabels", MapStr),
            r(2, "matchExpressions", Msg("LabelSelectorRequirement")),
        ],
    ),
    (
        "LabelSelectorRequirement",
        &[f(1, "key", Str), f(2, "operator", Str), r(3, "values", Str)],
    ),
    (
        "Namespace",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("NamespaceSpec")),
            f(3, "status", Ignored),
        ],
    ),
    ("NamespaceSpec", &[r(1, "finalizers", Str)]),
    (
        "ConfigMap",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "data", MapStr),
            f(3, "binaryData", MapBytes),
            p(4, "immutable", Bool),
        ],
    ),
    (
        "Secret",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "data", MapBytes),
            f(3, "type", Str),
            f(4, "stringData", MapStr),
            p(5, "immutable", Bool),
        ],
    ),
    (
        "ServiceAccount",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            p(4, "automountServiceAccountToken", Bool),
        ],
    ),
    (
        "Service",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("ServiceSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "ServiceSpec",
        &[
            r(1, "ports", Msg("ServicePort")),
            f(2, "selector", MapStr),
            f(3, "clusterIP", Str),
            f(4, "type", Str),
            r(5, "externalIPs", Str),
            f(7, "sessionAffinity", Str),
            f(8, "loadBalancerIP", Str),
            r(9, "loadBalancerSourceRanges", Str),
            f(10, "externalName", Str),
            f(11, "externalTrafficPolicy", Str),
            f(12, "healthCheckNodePort", Int),
            f(13, "publishNotReadyAddresses", Bool),
            p(17, "ipFamilyPolicy", Str),
            r(18, "clusterIPs", Str),
            r(19, "ipFamilies", Str),
            p(20, "allocateLoadBalancerNodePorts", Bool),
            p(21, "loadBalancerClass", Str),
            p(22, "internalTrafficPolicy", Str),
        ],
    ),
    (
        "ServicePort",
        &[
            f(1, "name", Str),
            f(2, "protocol", Str),
            f(3, "port", Int),
            f(4, "targetPort", IntOrString),
            f(5, "nodePort", Int),
            p(6, "appProtocol", Str),
        ],
    ),
    (
        "Deployment",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("DeploymentSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "DeploymentSpec",
        &[
            p(1, "replicas", Int),
            f(2, "selector", Msg("LabelSelector")),
            f(3, "template", Msg("PodTemplateSpec")),
            f(4, "strategy", Msg("DeploymentStrategy")),
            f(5, "minReadySeconds", Int),
            p(6, "revisionHistoryLimit", Int),
            f(7, "paused", Bool),
            p(9, "progressDeadlineSeconds", Int),
        ],
    ),
    (
        "DeploymentStrategy",
        &[
            f(1, "type", Str),
            f(2, "rollingUpdate", Msg("RollingUpdateDeployment")),
        ],
    ),
    (
        "RollingUpdateDeployment",
        &[
            f(1, "maxUnavailable", IntOrString),
            f(2, "maxSurge", IntOrString),
        ],
    ),
    (
        "PodTemplateSpec",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("PodSpec")),
        ],
    ),
    (
        "PodSpec",
        &[
            r(2, "containers", Msg("Container")),
            f(3, "restartPolicy", Str),
            p(4, "terminationGracePeriodSeconds", Int),
            p(5, "activeDeadlineSeconds", Int),
            f(6, "dnsPolicy", Str),
            f(7, "nodeSelector", MapStr),
            f(8, "serviceAccountName", Str),
            f(9, "serviceAccount", Str),
            f(10, "nodeName", Str),
            f(11, "hostNetwork", Bool),
            f(12, "hostPID", Bool),
            f(13, "hostIPC", Bool),
            f(16, "hostname", Str),
            f(17, "subdomain", Str),
            f(19, "schedulerName", Str),
            r(20, "initContainers", Msg("Container")),
            p(21, "automountServiceAccountToken", Bool),
            f(24, "priorityClassName", Str),
            p(25, "priority", Int),
            p(30, "enableServiceLinks", Bool),
            p(31, "preemptionPolicy", Str),
        ],
    ),
    (
        "Container",
        &[
            f(1, "name", Str),
            f(2, "image", Str),
            r(3, "command", Str),
            r(4, "args", Str),
            f(5, "workingDir", Str),
            r(6, "ports", Msg("ContainerPort")),
            r(7, "env", Msg("EnvVar")),
            f(8, "resources", Msg("ResourceRequirements")),
            f(13, "terminationMessagePath", Str),
            f(14, "imagePullPolicy", Str),
            f(16, "stdin", Bool),
            f(17, "stdinOnce", Bool),
            f(18, "tty", Bool),
            f(20, "terminationMessagePolicy", Str),
        ],
    ),
    (
        "ContainerPort",
        &[
            f(1, "name", Str),
            f(2, "hostPort", Int),
            f(3, "containerPort", Int),
            f(4, "protocol", Str),
            f(5, "hostIP", Str),
        ],
    ),
    ("EnvVar", &[f(1, "name", Str), f(2, "value", Str)]),
    (
        "ResourceRequirements",
        &[f(1, "limits", MapQuantity), f(2, "requests", MapQuantity)],
    ),
    (
        "PriorityClass",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "value", Int),
            f(3, "globalDefault", Bool),
            f(4, "description", Str),
            p(5, "preemptionPolicy", Str),
        ],
    ),
    (
        "ResourceQuota",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("ResourceQuotaSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "ResourceQuotaSpec",
        &[f(1, "hard", MapQuantity), r(2, "scopes", Str)],
    ),
    (
        "Role",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "rules", Msg("PolicyRule")),
        ],
    ),
    (
        "ClusterRole",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "rules", Msg("PolicyRule")),
            f(3, "aggregationRule", Msg("AggregationRule")),
        ],
    ),
    (
        "PolicyRule",
        &[
            r(1, "verbs", Str),
            r(2, "apiGroups", Str),
            r(3, "resources", Str),
            r(4, "resourceNames", Str),
            r(5, "nonResourceURLs", Str),
        ],
    ),
    (
        "AggregationRule",
        &[r(1, "clusterRoleSelectors", Msg("LabelSelector"))],
    ),
    (
        "RoleBinding",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "subjects", Msg("Subject")),
            f(3, "roleRef", Msg("RoleRef")),
        ],
    ),
    (
        "ClusterRoleBinding",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            r(2, "subjects", Msg("Subject")),
            f(3, "roleRef", Msg("RoleRef")),
        ],
    ),
    (
        "Subject",
        &[
            f(1, "kind", Str),
            f(2, "apiGroup", Str),
            f(3, "name", Str),
            f(4, "namespace", Str),
        ],
    ),
    (
        "RoleRef",
        &[f(1, "apiGroup", Str), f(2, "kind", Str), f(3, "name", Str)],
    ),
    (
        "SelfSubjectAccessReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SelfSubjectAccessReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "SubjectAccessReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SubjectAccessReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "LocalSubjectAccessReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SubjectAccessReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "SubjectAccessReviewSpec",
        &[
            f(1, "resourceAttributes", Msg("ResourceAttributes")),
            f(2, "nonResourceAttributes", Msg("NonResourceAttributes")),
            f(3, "user", Str),
            r(4, "groups", Str),
            f(6, "uid", Str),
        ],
    ),
    (
        "SelfSubjectReview",
        &[f(1, "metadata", Msg("ObjectMeta")), f(2, "status", Ignored)],
    ),
    (
        "TokenReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("TokenReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "TokenReviewSpec",
        &[f(1, "token", Str), r(2, "audiences", Str)],
    ),
    (
        "SelfSubjectAccessReviewSpec",
        &[
            f(1, "resourceAttributes", Msg("ResourceAttributes")),
            f(2, "nonResourceAttributes", Msg("NonResourceAttributes")),
        ],
    ),
    (
        "ResourceAttributes",
        &[
            f(1, "namespace", Str),
            f(2, "verb", Str),
            f(3, "group", Str),
            f(4, "version", Str),
            f(5, "resource", Str),
            f(6, "subresource", Str),
            f(7, "name", Str),
        ],
    ),
    (
        "NonResourceAttributes",
        &[f(1, "path", Str), f(2, "verb", Str)],
    ),
    (
        "SelfSubjectRulesReview",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("SelfSubjectRulesReviewSpec")),
            f(3, "status", Ignored),
        ],
    ),
    ("SelfSubjectRulesReviewSpec", &[f(1, "namespace", Str)]),
    (
        "TokenRequest",
        &[
            f(1, "metadata", Msg("ObjectMeta")),
            f(2, "spec", Msg("TokenRequestSpec")),
            f(3, "status", Ignored),
        ],
    ),
    (
        "TokenRequestSpec",
        &[
            r(1, "audiences", Str),
            p(4, "expirationSeconds", Int),
            f(3, "boundObjectRef", Msg("BoundObjectReference")),
        ],
    ),
    (
        "BoundObjectReference",
        &[
            f(1, "kind", Str),
            f(2, "apiVersion", Str),
            f(3, "name", Str),
            f(4, "uid", Str),
        ],
    ),
];

fn unsupported(what: &str) -> ApiError {
    ApiError::new(
        415,
        "UnsupportedMediaType",
        format!("{what} is not supported in protobuf request bodies by this server; send the object as JSON (for example `kubectl create ... --dry-run=client -o json | kubectl create -f -`)"),
    )
}

fn bad(what: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the protobuf request body could not be decoded: {what}"
    ))
}

/// One wire-format field.
enum Wire<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ApiError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| bad("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ApiError> {
        if self.buf.len() < n {
            return Err(bad("truncated field"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<(u32, Wire<'a>)>, ApiError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let num = u32::try_from(key >> 3).map_err(|_| bad("field number out of range"))?;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Wire::Fixed
            }
            2 => {
                let len =
                    usize::try_from(self.varint()?).map_err(|_| bad("length out of range"))?;
                Wire::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Wire::Fixed
            }
            other => return Err(bad(&format!("wire type {other} is not used by Kubernetes"))),
        };
        Ok(Some((num, wire)))
    }
}

fn fields(buf: &[u8]) -> Result<Vec<(u32, Wire<'_>)>, ApiError> {
    let mut r = Reader { buf };
    let mut out = Vec::new();
    while let Some(field) = r.next()? {
        out.push(field);
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, ApiError> {
    String::from_utf8(b.to_vec()).map_err(|_| bad("a string field is not UTF-8"))
}

fn bytes_of<'a>(w: &Wire<'a>, what: &str) -> Result<&'a [u8], ApiError> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(bad(&format!("{what} is not length-delimited"))),
    }
}

/// A map entry (key = 1, value = 2).
fn entry(b: &[u8]) -> Result<(String, Option<&[u8]>), ApiError> {
    let mut key = String::new();
    let mut value = None;
    for (num, w) in fields(b)? {
        match num {
            1 => key = string(bytes_of(&w, "a map key")?)?,
            2 => value = Some(bytes_of(&w, "a map value")?),
            _ => {}
        }
    }
    Ok((key, value))
}

fn time(b: &[u8]) -> Result<Value, ApiError> {
    let mut seconds: i64 = 0;
    for (num, w) in fields(b)? {
        if let (1, Wire::Varint(v)) = (num, w) {
            seconds = v as i64;
        }
    }
    let t =
        chrono::DateTime::from_timestamp(seconds, 0).ok_or_else(|| bad("a time out of range"))?;
    Ok(json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
}

fn quantity(b: &[u8]) -> Result<Value, ApiError> {
    for (num, w) in fields(b)? {
        if num == 1 {
            return Ok(json!(string(bytes_of(&w, "a quantity")?)?));
        }
    }
    Ok(json!("0"))
}

fn int_or_string(b: &[u8]) -> Result<Value, ApiError> {
    let (mut ty, mut int, mut s) = (0u64, 0i64, String::new());
    for (num, w) in fields(b)? {
        match (num, w) {
            (1, Wire::Varint(v)) => ty = v,
            (2, Wire::Varint(v)) => int = v as i32 as i64,
            (3, Wire::Bytes(b)) => s = string(b)?,
            _ => {}
        }
    }
    Ok(if ty == 1 { json!(s) } else { json!(int) })
}

fn message(name: &str, b: &[u8], depth: usize) -> Result<Value, ApiError> {
    if depth > 32 {
        return Err(bad("messages nested too deeply"));
    }
    let schema = MESSAGES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, f)| *f)
        .ok_or_else(|| unsupported(&format!("the message {name}")))?;
    let mut out = Map::new();
    for (num, w) in fields(b)? {
        let field = schema
            .iter()
            .find(|f| f.num == num)
            .ok_or_else(|| unsupported(&format!("field {num} of {name}")))?;
        let value = match (field.ty, &w) {
            (Ignored, _) => continue,
            (Str, Wire::Bytes(b)) if b.is_empty() && !field.pointer && !field.repeated => continue,
            (Int, Wire::Varint(0)) | (Bool, Wire::Varint(0))
                if !field.pointer && !field.repeated =>
            {
                continue
            }
            (Time, Wire::Bytes(b))
                if fields(b)?.iter().all(|(_, w)| matches!(w, Wire::Varint(0))) =>
            {
                continue
            }
            (Str, Wire::Bytes(b)) => json!(string(b)?),
            (Int, Wire::Varint(v)) => json!(*v as i64),
            (Bool, Wire::Varint(v)) => json!(*v != 0),
            (Msg(m), Wire::Bytes(b)) => message(m, b, depth + 1)?,
            (Time, Wire::Bytes(b)) => time(b)?,
            (IntOrString, Wire::Bytes(b)) => int_or_string(b)?,
            (MapStr | MapBytes | MapQuantity, Wire::Bytes(b)) => {
                let (k, v) = entry(b)?;
                let v = v.unwrap_or_default();
                let v = match field.ty {
                    MapStr => json!(string(v)?),
                    MapBytes => json!(base64::engine::general_purpose::STANDARD.encode(v)),
                    _ => quantity(v)?,
                };
                let map = out
                    .entry(field.name.to_string())
                    .or_insert_with(|| json!({}));
                if let Some(m) = map.as_object_mut() {
                    m.insert(k, v);
                }
                continue;
            }
            _ => {
                return Err(bad(&format!(
                    "field {} of {name} has the wrong wire type",
                    field.name
                )))
            }
        };
        if field.repeated {
            let list = out
                .entry(field.name.to_string())
                .or_insert_with(|| json!([]));
            if let Some(l) = list.as_array_mut() {
                l.push(value);
            }
        } else {
            out.insert(field.name.to_string(), value);
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf request body into the object's JSON, with apiVersion and kind from the
/// envelope.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body
        .strip_prefix(b"k8s\0")
        .ok_or_else(|| bad("it does not start with Kubernetes' magic bytes"))?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), None);
    for (num, w) in fields(rest)? {
        match num {
            1 => {
                for (n, tw) in fields(bytes_of(&w, "typeMeta")?)? {
                    match n {
                        1 => api_version = string(bytes_of(&tw, "apiVersion")?)?,
                        2 => kind = string(bytes_of(&tw, "kind")?)?,
                        _ => {}
                    }
                }
            }
            2 => raw = Some(bytes_of(&w, "raw")?),
            3 if !bytes_of(&w, "contentEncoding")?.is_empty() => {
                return Err(unsupported("a content encoding"));
            }
            _ => {}
        }
    }
    if kind.is_empty() {
        return Err(bad("the envelope names no kind"));
    }
    let mut object = message(&kind, raw.unwrap_or_default(), 0)?;
    if let Some(o) = object.as_object_mut() {
        o.insert("apiVersion".into(), json!(api_version));
        o.insert("kind".into(), json!(kind));
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn field_bytes(num: u32, b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        varint(u64::from(num) << 3 | 2, &mut out);
        varint(b.len() as u64, &mut out);
        out.extend_from_slice(b);
        out
    }

    fn field_int(num: u32, v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        varint(u64::from(num) << 3, &mut out);
        varint(v, &mut out);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = [
            field_bytes(1, api_version.as_bytes()),
            field_bytes(2, kind.as_bytes()),
        ]
        .concat();
        [
            b"k8s\0".to_vec(),
            field_bytes(1, &type_meta),
            field_bytes(2, raw),
        ]
        .concat()
    }

    #[test]
    fn deployment_with_ports_quantities_and_labels() {
        let meta = [
            field_bytes(1, b"web"),
            field_bytes(
                11,
                &[field_bytes(1, b"app"), field_bytes(2, b"web")].concat(),
            ),
        ]
        .concat();
        let port = field_int(3, 80);
        let limits = field_bytes(
            1,
            &[
                field_bytes(1, b"cpu"),
                field_bytes(2, &field_bytes(1, b"500m")),
            ]
            .concat(),
        );
        let container = [
            field_bytes(1, b"nginx"),
            field_bytes(2, b"nginx"),
            field_bytes(6, &port),
            field_bytes(8, &limits),
        ]
        .concat();
        let pod_spec = field_bytes(2, &container);
        let template = [
            field_bytes(
                1,
                &field_bytes(
                    11,
                    &[field_bytes(1, b"app"), field_bytes(2, b"web")].concat(),
                ),
            ),
            field_bytes(2, &pod_spec),
        ]
        .concat();
        let selector = field_bytes(
            1,
            &[field_bytes(1, b"app"), field_bytes(2, b"web")].concat(),
        );
        let ru = field_bytes(1, &[field_int(1, 1), field_bytes(3, b"25%")].concat());
        let spec = [
            field_int(1, 2),
            field_bytes(2, &selector),
            field_bytes(3, &template),
            field_bytes(4, &ru),
        ]
        .concat();
        let body = envelope(
            "apps/v1",
            "Deployment",
            &[field_bytes(1, &meta), field_bytes(2, &spec)].concat(),
        );
        let v = decode(&body).unwrap();
        assert_eq!(v["apiVersion"], "apps/v1");
        assert_eq!(v["kind"], "Deployment");
        assert_eq!(v["metadata"]["labels"]["app"], "web");
        assert_eq!(v["spec"]["replicas"], 2);
        assert_eq!(v["spec"]["selector"]["matchLabels"]["app"], "web");
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["name"], "nginx");
        assert_eq!(c["ports"][0]["containerPort"], 80);
        assert_eq!(c["resources"]["limits"]["cpu"], "500m");
    }

    #[test]
    fn access_reviews_decode_with_their_empty_status() {
        // kubectl auth can-i: metadata, spec.resourceAttributes, and an empty status.
        let attrs = [
            field_bytes(1, b"dev"),
            field_bytes(2, b"create"),
            field_bytes(5, b"pods"),
        ]
        .concat();
        let spec = field_bytes(1, &attrs);
        let raw = [
            field_bytes(1, b""),
            field_bytes(2, &spec),
            field_bytes(3, b""),
        ]
        .concat();
        let v = decode(&envelope(
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview",
            &raw,
        ))
        .unwrap();
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "dev", "verb": "create", "resource": "pods"})
        );
        assert!(v.get("status").is_none());
        // SubjectAccessReview names its subject.
        let spec = [
            field_bytes(1, &attrs),
            field_bytes(3, b"jane"),
            field_bytes(4, b"devs"),
        ]
        .concat();
        let raw = [field_bytes(2, &spec), field_bytes(3, b"")].concat();
        let v = decode(&envelope(
            "authorization.k8s.io/v1",
            "SubjectAccessReview",
            &raw,
        ))
        .unwrap();
        assert_eq!(v["spec"]["user"], "jane");
        assert_eq!(v["spec"]["groups"], json!(["devs"]));
    }

    #[test]
    fn secret_bytes_become_base64_and_unknown_fields_are_refused() {
        let data = field_bytes(
            2,
            &[field_bytes(1, b"password"), field_bytes(2, b"s3cret")].concat(),
        );
        let body = envelope(
            "v1",
            "Secret",
            &[
                field_bytes(1, &field_bytes(1, b"s")),
                data,
                field_bytes(3, b"Opaque"),
            ]
            .concat(),
        );
        let v = decode(&body).unwrap();
        assert_eq!(v["data"]["password"], "czNjcmV0");
        assert_eq!(v["type"], "Opaque");
        let odd = envelope("v1", "Secret", &field_int(99, 1));
        assert_eq!(decode(&odd).unwrap_err().code, 415);
        assert_eq!(decode(b"k8s\0\x0a\xff").unwrap_err().code, 400);
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
        let unknown_kind = envelope("v1", "PersistentVolume", &[]);
        assert_eq!(decode(&unknown_kind).unwrap_err().code, 415);
    }
}
