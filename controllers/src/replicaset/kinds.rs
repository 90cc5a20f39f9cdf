//! The two kinds the ReplicaSet controller keeps: what [`ReplicatedSet`] reads from each. They
//! differ in their selector (an RC's is a plain map that defaults to its template's labels) and
//! in their status and condition types.

use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{
    PodTemplateSpec, ReplicationController, ReplicationControllerStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{Counts, ReplicatedSet};

/// The parts both kinds share, field for field: spec.replicas, minReadySeconds, template and
/// the status counts.
macro_rules! common {
    ($status:ident) => {
        fn replicas(&self) -> i32 {
            self.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
        }

        fn min_ready_seconds(&self) -> i32 {
            self.spec
                .as_ref()
                .and_then(|s| s.min_ready_seconds)
                .unwrap_or(0)
        }

        fn template(&self) -> Option<&PodTemplateSpec> {
            self.spec.as_ref()?.template.as_ref()
        }

        fn with_counts(&self, c: Counts) -> Option<Self> {
            // Kubernetes omits zero counts of ready and available pods.
            let status = $status {
                replicas: c.replicas,
                fully_labeled_replicas: Some(c.fully_labeled),
                observed_generation: Some(c.observed_generation),
                ready_replicas: (c.ready > 0).then_some(c.ready),
                available_replicas: (c.available > 0).then_some(c.available),
                conditions: self.status.as_ref().and_then(|s| s.conditions.clone()),
            };
            if self.status.as_ref() == Some(&status) {
                return None;
            }
            let mut updated = self.clone();
            updated.status = Some(status);
            Some(updated)
        }
    };
}

impl ReplicatedSet for ReplicaSet {
    const COMPONENT: &'static str = "replicaset-controller";

    fn selector(&self) -> LabelSelector {
        self.spec
            .as_ref()
            .map(|s| s.selector.clone())
            .unwrap_or_default()
    }

    common!(ReplicaSetStatus);
}

impl ReplicatedSet for ReplicationController {
    const COMPONENT: &'static str = "replication-controller";

    fn selector(&self) -> LabelSelector {
        let labels = match self.spec.as_ref().and_then(|s| s.selector.as_ref()) {
            Some(m) if !m.is_empty() => Some(m.clone()),
            _ => self
                .template()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.clone()),
        };
        LabelSelector {
            match_labels: Some(labels.unwrap_or_default()),
            match_expressions: None,
        }
    }

    common!(ReplicationControllerStatus);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_rc_selects_by_its_template_labels_when_it_has_no_selector() {
        let rc: ReplicationController = serde_json::from_value(json!({
            "metadata": {"name": "web"},
            "spec": {"template": {"metadata": {"labels": {"app": "web"}}}}}))
        .unwrap();
        assert_eq!(
            rc.selector().match_labels,
            Some([("app".to_string(), "web".to_string())].into())
        );
        assert_eq!(rc.replicas(), 1);
    }

    #[test]
    fn the_status_is_written_only_when_it_changes() {
        let rs: ReplicaSet = serde_json::from_value(json!({
            "metadata": {"name": "web", "generation": 2},
            "status": {"replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 3,
                       "observedGeneration": 2}}))
        .unwrap();
        let counts = Counts {
            replicas: 3,
            fully_labeled: 3,
            ready: 3,
            available: 0,
            observed_generation: 2,
        };
        assert!(rs.with_counts(counts).is_none());
        let updated = rs
            .with_counts(Counts {
                available: 3,
                ..counts
            })
            .expect("a change");
        assert_eq!(
            serde_json::to_value(updated.status).unwrap(),
            json!({"replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 3,
                   "availableReplicas": 3, "observedGeneration": 2})
        );
    }
}
