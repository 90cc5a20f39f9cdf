//! Kubernetes' protobuf request bodies (`application/vnd.kubernetes.protobuf`), which kubectl's
//! typed commands send (`create namespace|configmap|secret|deployment|service|role|rolebinding|
//! clusterrole|clusterrolebinding|token|priorityclass|quota|ingress|job|cronjob`, `autoscale`, `auth can-i`,
//! `auth whoami`),
//! decoded into the JSON the rest of the server works on.
//!
//! The envelope is the magic `k8s\0` followed by a `runtime.Unknown` (typeMeta = 1 {apiVersion
//! = 1, kind = 2}, raw = 2); `raw` is the object's message. Messages are described by the table
//! in `schema.rs` — field numbers, JSON names and types as Kubernetes' generated.proto defines
//! them — for the kinds and fields those commands use. A field the table does not describe is
//! refused with 415 and a sentence naming it, never dropped.
//!
//! `wire.rs` reads the wire format (varints, length-delimited fields, map entries);
//! `message.rs` turns a message into JSON by its entry in `schema.rs`; this file unwraps the
//! envelope and words the errors.

mod message;
mod schema;
mod wire;

use serde_json::{json, Value};

use crate::error::ApiError;
use message::message;
use wire::{bytes_of, fields, string};

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

    /// A packed repeated field: one length-delimited field holding the varints.
    fn field_packed(num: u32, values: &[i64]) -> Vec<u8> {
        let mut packed = Vec::new();
        for v in values {
            varint(*v as u64, &mut packed);
        }
        field_bytes(num, &packed)
    }

    /// An unpacked repeated field: a varint field per element (Kubernetes' Go types).
    fn field_unpacked(num: u32, values: &[i64]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| field_int(num, *v as u64))
            .collect()
    }

    #[test]
    fn repeated_numbers_decode_packed_and_unpacked() {
        type Encode = fn(u32, &[i64]) -> Vec<u8>;
        let cases: [(&str, Encode, &[i64], Value); 6] = [
            ("unpacked", field_unpacked, &[1, 2, 42], json!([1, 2, 42])),
            ("packed", field_packed, &[1, 2, 42], json!([1, 2, 42])),
            (
                "unpacked, negative int32",
                field_unpacked,
                &[-1, 255],
                json!([-1, 255]),
            ),
            (
                "packed, negative int32",
                field_packed,
                &[-1, 255],
                json!([-1, 255]),
            ),
            ("unpacked, one", field_unpacked, &[3], json!([3])),
            ("packed, none", field_packed, &[], Value::Null),
        ];
        for (what, encode, values, want) in cases {
            // kubectl create job: a pod failure policy rule on exit codes, and a pod whose
            // security context has supplemental groups.
            let on_exit_codes = [
                field_bytes(1, b"main"),
                field_bytes(2, b"In"),
                encode(3, values),
            ]
            .concat();
            let rule = [field_bytes(1, b"FailJob"), field_bytes(2, &on_exit_codes)].concat();
            let condition = [field_bytes(1, b"DisruptionTarget"), field_bytes(2, b"True")].concat();
            let ignore = [field_bytes(1, b"Ignore"), field_bytes(3, &condition)].concat();
            let policy = [field_bytes(1, &rule), field_bytes(1, &ignore)].concat();
            let security = encode(4, values);
            let container = [field_bytes(1, b"c"), field_bytes(2, b"busybox")].concat();
            let pod_spec = [field_bytes(2, &container), field_bytes(14, &security)].concat();
            let success = field_bytes(1, &[field_bytes(1, b"0-2"), field_int(2, 2)].concat());
            let spec = [
                field_bytes(6, &field_bytes(2, &pod_spec)),
                field_bytes(11, &policy),
                field_bytes(16, &success),
            ]
            .concat();
            let body = envelope(
                "batch/v1",
                "Job",
                &[
                    field_bytes(1, &field_bytes(1, b"pi")),
                    field_bytes(2, &spec),
                ]
                .concat(),
            );
            let v = decode(&body).unwrap();
            let rules = &v["spec"]["podFailurePolicy"]["rules"];
            assert_eq!(rules[0]["onExitCodes"]["values"], want, "{what}");
            assert_eq!(rules[0]["onExitCodes"]["containerName"], "main", "{what}");
            assert_eq!(
                rules[1],
                json!({"action": "Ignore",
                       "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}),
                "{what}"
            );
            let groups = &v["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"];
            assert_eq!(groups, &want, "{what}");
            assert_eq!(
                v["spec"]["successPolicy"],
                json!({"rules": [{"succeededIndexes": "0-2", "succeededCount": 2}]}),
                "{what}"
            );
        }
    }

    #[test]
    fn an_ingress_rule_s_http_is_inline() {
        // kubectl create ingress web --rule=example.com/api=web:80 --class=nginx
        let port = field_int(2, 80);
        let service = [field_bytes(1, b"web"), field_bytes(2, &port)].concat();
        let backend = field_bytes(4, &service);
        let path = [
            field_bytes(1, b"/api"),
            field_bytes(2, &backend),
            field_bytes(3, b"Exact"),
        ]
        .concat();
        let http = field_bytes(1, &field_bytes(1, &path));
        let rule = [field_bytes(1, b"example.com"), field_bytes(2, &http)].concat();
        let spec = [field_bytes(3, &rule), field_bytes(4, b"nginx")].concat();
        let raw = [
            field_bytes(1, &field_bytes(1, b"web")),
            field_bytes(2, &spec),
            field_bytes(3, b""),
        ]
        .concat();
        let v = decode(&envelope("networking.k8s.io/v1", "Ingress", &raw)).unwrap();
        assert_eq!(
            v["spec"],
            json!({"ingressClassName": "nginx", "rules": [{"host": "example.com", "http": {"paths": [
                {"path": "/api", "pathType": "Exact",
                 "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]})
        );
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
