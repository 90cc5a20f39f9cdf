//! pods/binding: assigning a pod to a node.

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::query::Query;
use crate::storage::Fence;

use super::{now, success_status, Api, Target, UPDATE_RETRIES};

impl Api {
    /// pods/binding: assigns a pod to a node, once. Returns the Status a request answers.
    pub(super) async fn bind(
        &self,
        t: &Target,
        q: &Query,
        binding: Value,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let dry_run = q.dry_run()?;
        let node = binding
            .pointer("/target/name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "",
                    "Binding",
                    t.name(),
                    vec![crate::error::Cause {
                        reason: "FieldValueRequired",
                        field: "target.name".into(),
                        message: "Required value".into(),
                    }],
                )
            })?
            .to_string();
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            if let Some(existing) = current
                .object
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict(
                    "",
                    "pods/binding",
                    t.name(),
                    &format!(
                        "pod {} is already assigned to node \"{existing}\"",
                        t.name()
                    ),
                ));
            }
            if current
                .object
                .pointer("/metadata/deletionTimestamp")
                .is_some()
            {
                return Err(ApiError::conflict(
                    "",
                    "pods/binding",
                    t.name(),
                    "pod is being deleted, cannot be assigned to a host",
                ));
            }
            let mut new = current.object.clone();
            crate::value::set(&mut new, &["spec", "nodeName"], json!(node));
            let conds = new["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut conds: Vec<Value> = conds
                .into_iter()
                .filter(|c| c["type"] != "PodScheduled")
                .collect();
            conds.push(json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now()}));
            crate::value::set(&mut new, &["status", "conditions"], json!(conds));
            if self
                .commit(t, &current, new, dry_run, fence)
                .await?
                .is_some()
            {
                return Ok(success_status());
            }
        }
        Err(ApiError::conflict(
            "",
            "pods/binding",
            t.name(),
            "too many concurrent updates; try again",
        ))
    }
}
