//! Namespaces: a DNS label name, the `kubernetes` finalizer, the servers' own namespaces that
//! may not be deleted, and a deletion the namespace controller finishes.

use serde_json::{json, Value};

use crate::admission::{check_label, child, default};
use crate::error::ApiError;

use super::Strategy;

pub struct Namespace;

/// Whether the namespace may not be deleted (it exists from bootstrap).
pub fn protected(name: &str) -> bool {
    matches!(
        name,
        "default" | "kube-system" | "kube-public" | "kube-node-lease"
    )
}

impl Strategy for Namespace {
    fn check_name(&self, name: &str) -> Option<String> {
        check_label(name)
    }

    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let name = o
            .get("metadata")
            .and_then(|m| m.get("name"))
            .cloned()
            .unwrap_or(Value::Null);
        let labels = child(child(o, "metadata"), "labels");
        labels.insert("kubernetes.io/metadata.name".into(), name);
        let spec = child(o, "spec");
        default(spec, "finalizers", json!(["kubernetes"]));
        let status = child(o, "status");
        default(status, "phase", json!("Active"));
    }

    fn check_delete(&self, name: &str) -> Result<(), ApiError> {
        if protected(name) {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{name}\" is forbidden: this namespace may not be deleted"
            )));
        }
        Ok(())
    }

    /// The namespace controller deletes the contents, whatever the propagation asked.
    fn propagation_finalizers(&self) -> bool {
        false
    }

    fn finished_by_controller(&self) -> bool {
        true
    }

    fn mark_for_deletion(&self, object: &mut Value) {
        crate::value::set(object, &["status", "phase"], json!("Terminating"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_namespaces_may_not_be_deleted() {
        for (name, ok) in [("default", false), ("kube-system", false), ("team-a", true)] {
            assert_eq!(Namespace.check_delete(name).is_ok(), ok, "{name}");
        }
        let e = Namespace.check_delete("kube-public").unwrap_err();
        assert_eq!(e.code, 403);
    }

    #[test]
    fn defaults_and_terminating() {
        let mut ns = json!({"metadata": {"name": "a"}});
        Namespace.defaults(&mut ns);
        assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "a");
        assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
        assert_eq!(ns["status"]["phase"], "Active");
        Namespace.mark_for_deletion(&mut ns);
        assert_eq!(ns["status"]["phase"], "Terminating");
    }
}
