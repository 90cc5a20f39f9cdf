//! API errors as Kubernetes reports them: a `metav1.Status` with a reason and an HTTP code, with
//! the wording kubectl users know.

use rkube_store::error::{MvccError, StoreError};
use serde_json::Value;

/// One field that failed validation (a `StatusCause`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`...
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// `details`: the object's name, group and kind (the plural resource name), and causes.
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            name: None,
            group: None,
            kind: None,
            causes: vec![],
            retry_after: None,
        }
    }

    fn about(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.group = (!group.is_empty()).then(|| group.to_string());
        self.kind = Some(kind.to_string());
        self.name = Some(name.to_string());
        self
    }

    /// `pods "nginx" not found`
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    /// `pods "nginx" already exists`
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .about(group, plural, name)
    }

    /// Kubernetes' optimistic-concurrency conflict.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .about(group, plural, name)
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        ApiError::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per field: `Deployment.apps "web" is invalid: [spec.replicas: ...]`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {joined}"),
        )
        .about(group, kind, name);
        e.causes = causes;
        e
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, "Forbidden", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"),
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(503, "ServiceUnavailable", message);
        e.retry_after = Some(1);
        e
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        let mut e = ApiError::new(504, "Timeout", message);
        e.retry_after = Some(1);
        e
    }

    /// The metav1.Status body, with its fields in the order kube-apiserver writes them (the Go
    /// struct's: kind, apiVersion, metadata, status, message, reason, details, code), which
    /// clients that compare the bytes rely on.
    pub fn status_body(&self) -> StatusBody<'_> {
        let details = StatusDetails {
            name: self.name.as_deref(),
            group: self.group.as_deref(),
            kind: self.kind.as_deref(),
            causes: self
                .causes
                .iter()
                .map(|c| StatusCause {
                    reason: c.reason,
                    message: &c.message,
                    field: &c.field,
                })
                .collect(),
            retry_after_seconds: self.retry_after,
        };
        let empty = details.name.is_none()
            && details.group.is_none()
            && details.kind.is_none()
            && details.causes.is_empty()
            && details.retry_after_seconds.is_none();
        StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: EmptyMeta {},
            status: "Failure",
            message: &self.message,
            reason: self.reason,
            details: (!empty).then_some(details),
            code: self.code,
        }
    }

    /// The metav1.Status as JSON (for a watch's ERROR event and for callers that read it).
    pub fn status(&self) -> Value {
        serde_json::to_value(self.status_body()).unwrap_or(Value::Null)
    }
}

/// A `metav1.Status` as written to clients: see [`ApiError::status_body`].
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusBody<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: EmptyMeta,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<StatusDetails<'a>>,
    code: u16,
}

#[derive(Debug, serde::Serialize)]
struct EmptyMeta {}

/// `metav1.StatusDetails`, in its Go order.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusDetails<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<StatusCause<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u32>,
}

/// `metav1.StatusCause`, in its Go order.
#[derive(Debug, serde::Serialize)]
struct StatusCause<'a> {
    reason: &'static str,
    message: &'a str,
    /// Omitted when empty, as Go's `omitempty` does (an eviction's DisruptionBudget cause).
    #[serde(skip_serializing_if = "str::is_empty")]
    field: &'a str,
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Mvcc(MvccError::Compacted { compact_revision }) => ApiError::gone(
                format!("The resourceVersion for the provided list is too old (compacted at {compact_revision})."),
            ),
            StoreError::Mvcc(MvccError::FutureRevision) => ApiError::timeout(
                "Too large resource version: the store has not reached it yet",
            ),
            StoreError::Mvcc(MvccError::NoSpace) => ApiError::new(
                507,
                "InsufficientStorage",
                "etcdserver: mvcc: database space exceeded",
            ),
            StoreError::Unavailable(m) => ApiError::unavailable(format!(
                "the control plane store is unavailable: {m}"
            )),
            StoreError::Timeout => {
                ApiError::timeout("etcdserver: request timed out; the store may have no leader")
            }
            StoreError::Stopped => ApiError::unavailable("the server is shutting down"),
            other => ApiError::internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_body_has_kubernetes_shape() {
        let s = ApiError::not_found("apps", "deployments", "web").status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["details"]["kind"], "deployments");
        assert_eq!(s["details"]["group"], "apps");
    }

    #[test]
    fn status_is_written_in_kube_apiservers_field_order() {
        let e = ApiError::not_found("", "pods", "web");
        assert_eq!(
            String::from_utf8(serde_json::to_vec(&e.status_body()).unwrap()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"pods \"web\" not found","reason":"NotFound","details":{"name":"web","kind":"pods"},"code":404}"#
        );
        let mut e = ApiError::invalid(
            "",
            "Pod",
            "x",
            vec![Cause {
                reason: "FieldValueRequired",
                field: "spec.containers".into(),
                message: "Required value".into(),
            }],
        );
        e.retry_after = Some(1);
        let bytes = serde_json::to_vec(&e.status_body()).unwrap();
        let text = String::from_utf8(bytes).unwrap();
        assert!(
            text.ends_with(r#""details":{"name":"x","kind":"Pod","causes":[{"reason":"FieldValueRequired","message":"Required value","field":"spec.containers"}],"retryAfterSeconds":1},"code":422}"#),
            "{text}"
        );
        // Without details the key is absent, as in Go's omitempty.
        let plain = serde_json::to_vec(&ApiError::bad_request("no").status_body()).unwrap();
        assert!(!String::from_utf8(plain).unwrap().contains("details"));
    }

    #[test]
    fn invalid_lists_each_cause() {
        let e = ApiError::invalid(
            "",
            "Pod",
            "x",
            vec![
                Cause {
                    reason: "FieldValueRequired",
                    field: "spec.containers".into(),
                    message: "Required value".into(),
                },
                Cause {
                    reason: "FieldValueInvalid",
                    field: "metadata.name".into(),
                    message: "Invalid value: \"X\"".into(),
                },
            ],
        );
        assert_eq!(
            e.message,
            "Pod \"x\" is invalid: [spec.containers: Required value, metadata.name: Invalid value: \"X\"]"
        );
        assert_eq!(e.status()["details"]["causes"].as_array().unwrap().len(), 2);
    }
}
