//! ControllerRevisions: their `data` is raw JSON (Kubernetes' runtime.RawExtension), kept
//! exactly as written, nulls included: `kubectl rollout undo` compares it byte for byte with
//! the patch it makes from a workload's template, where the template's creationTimestamp is
//! null.

use super::Strategy;

pub struct ControllerRevision;

impl Strategy for ControllerRevision {
    fn raw_fields(&self) -> &'static [&'static str] {
        &["data"]
    }
}
