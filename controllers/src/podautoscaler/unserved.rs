//! Metrics from APIs rkube does not serve: Pods and Object metrics come from a custom metrics
//! API (custom.metrics.k8s.io), External ones from an external metrics API
//! (external.metrics.k8s.io), which an adapter (prometheus-adapter, KEDA) registers in
//! Kubernetes. Without one, kube-controller-manager's HPA reports each such metric with the
//! errors its metrics clients return; these are the same sentences, so that what `kubectl
//! describe hpa` shows and what people search for is what they know.

use k8s_openapi::api::autoscaling::v2::{MetricSpec, MetricTarget};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::metrics::Failure;

/// The custom metrics client's answer when no custom metrics API is registered.
const NO_CUSTOM_METRICS: &str =
    "unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered";

/// The failure of a Pods, Object or External metric; None for another type.
pub(super) fn failure(metric: &MetricSpec, ns: &str) -> Option<Failure> {
    match metric.type_.as_str() {
        "Pods" => {
            let name = metric.pods.as_ref().map_or("", |p| p.metric.name.as_str());
            let error = format!("unable to get metric {name}: {NO_CUSTOM_METRICS}");
            Some(Failure {
                reason: "FailedGetPodsMetric",
                outer: format!("failed to get pods metric value: {error}"),
                error,
            })
        }
        "Object" => {
            let source = metric.object.as_ref()?;
            let (name, object) = (&source.metric.name, &source.described_object);
            // Kubernetes' replica calculator words it so (its arguments out of order).
            let error = format!(
                "unable to get metric {name}: {} on {ns} {}/{NO_CUSTOM_METRICS}",
                object.kind, object.name
            );
            let outer = match object_target(&source.target) {
                Some("Value") => error.clone(),
                Some(_) => format!("failed to get {name} object metric: {error}"),
                None => {
                    return Some(invalid("FailedGetObjectMetric", "object", |e| {
                        format!("failed to get object metric value: {e}")
                    }))
                }
            };
            Some(Failure {
                reason: "FailedGetObjectMetric",
                outer: format!("failed to get object metric value: {outer}"),
                error,
            })
        }
        "External" => {
            let source = metric.external.as_ref()?;
            let name = &source.metric.name;
            let error = format!(
                "unable to get external metric {ns}/{name}/{}: unable to fetch metrics from external metrics API: the server could not find the requested resource (get {name}.external.metrics.k8s.io)",
                go_selector(source.metric.selector.as_ref())
            );
            let outer = match external_target(&source.target) {
                Some("AverageValue") => format!("failed to get {name} external metric: {error}"),
                Some(_) => format!("failed to get external metric {name}: {error}"),
                None => {
                    return Some(invalid("FailedGetExternalMetric", "external", |e| {
                        format!("failed to get {name} external metric value: {e}")
                    }))
                }
            };
            Some(Failure {
                reason: "FailedGetExternalMetric",
                outer: format!("failed to get {name} external metric value: {outer}"),
                error,
            })
        }
        _ => None,
    }
}

/// Which of an Object metric's targets the HPA reads: the one its type names, if set.
fn object_target(target: &MetricTarget) -> Option<&'static str> {
    match target.type_.as_str() {
        "Value" if target.value.is_some() => Some("Value"),
        "AverageValue" if target.average_value.is_some() => Some("AverageValue"),
        _ => None,
    }
}

/// Which of an External metric's targets the HPA reads: the average value if set, else the
/// value.
fn external_target(target: &MetricTarget) -> Option<&'static str> {
    if target.average_value.is_some() {
        Some("AverageValue")
    } else {
        target.value.as_ref().map(|_| "Value")
    }
}

fn invalid(reason: &'static str, what: &str, wrap: impl Fn(&str) -> String) -> Failure {
    let error = format!(
        "invalid {what} metric source: neither a value target nor an average value target was set"
    );
    Failure {
        reason,
        outer: wrap(&error),
        error,
    }
}

/// A label selector as Go prints Kubernetes' generated type (`%+v`).
fn go_selector(selector: Option<&LabelSelector>) -> String {
    let Some(s) = selector else {
        return "nil".into();
    };
    let labels: String = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}: {v},"))
        .collect();
    let expressions: String = s
        .match_expressions
        .iter()
        .flatten()
        .map(|e| {
            let values = e.values.as_deref().unwrap_or_default().join(" ");
            format!(
                "LabelSelectorRequirement{{Key:{},Operator:{},Values:[{values}],}},",
                e.key, e.operator
            )
        })
        .collect();
    format!(
        "&LabelSelector{{MatchLabels:map[string]string{{{labels}}},MatchExpressions:[]LabelSelectorRequirement{{{expressions}}},}}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> MetricSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_unserved_metric_fails_as_kubernetes_words_it() {
        let custom = "unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered";
        let cases = [
            (
                json!({"type": "Pods", "pods": {"metric": {"name": "packets-per-second"},
                    "target": {"type": "AverageValue", "averageValue": "1k"}}}),
                "FailedGetPodsMetric",
                format!("unable to get metric packets-per-second: {custom}"),
                format!("failed to get pods metric value: unable to get metric packets-per-second: {custom}"),
            ),
            (
                json!({"type": "Object", "object": {"metric": {"name": "requests-per-second"},
                    "describedObject": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "name": "main-route"},
                    "target": {"type": "Value", "value": "10k"}}}),
                "FailedGetObjectMetric",
                format!("unable to get metric requests-per-second: Ingress on web main-route/{custom}"),
                format!("failed to get object metric value: unable to get metric requests-per-second: Ingress on web main-route/{custom}"),
            ),
            (
                json!({"type": "Object", "object": {"metric": {"name": "queue-depth"},
                    "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "q"},
                    "target": {"type": "AverageValue", "averageValue": "30"}}}),
                "FailedGetObjectMetric",
                format!("unable to get metric queue-depth: Service on web q/{custom}"),
                format!("failed to get object metric value: failed to get queue-depth object metric: unable to get metric queue-depth: Service on web q/{custom}"),
            ),
            (
                json!({"type": "External", "external": {"metric": {"name": "queue_messages_ready",
                    "selector": {"matchLabels": {"queue": "worker_tasks", "env": "prod"}}},
                    "target": {"type": "AverageValue", "averageValue": "30"}}}),
                "FailedGetExternalMetric",
                "unable to get external metric web/queue_messages_ready/&LabelSelector{MatchLabels:map[string]string{env: prod,queue: worker_tasks,},MatchExpressions:[]LabelSelectorRequirement{},}: unable to fetch metrics from external metrics API: the server could not find the requested resource (get queue_messages_ready.external.metrics.k8s.io)".to_string(),
                "failed to get queue_messages_ready external metric value: failed to get queue_messages_ready external metric: unable to get external metric web/queue_messages_ready/&LabelSelector{MatchLabels:map[string]string{env: prod,queue: worker_tasks,},MatchExpressions:[]LabelSelectorRequirement{},}: unable to fetch metrics from external metrics API: the server could not find the requested resource (get queue_messages_ready.external.metrics.k8s.io)".to_string(),
            ),
            (
                json!({"type": "External", "external": {"metric": {"name": "lag",
                    "selector": {"matchExpressions": [{"key": "topic", "operator": "In", "values": ["a", "b"]}]}},
                    "target": {"type": "Value", "value": "100"}}}),
                "FailedGetExternalMetric",
                "unable to get external metric web/lag/&LabelSelector{MatchLabels:map[string]string{},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:topic,Operator:In,Values:[a b],},},}: unable to fetch metrics from external metrics API: the server could not find the requested resource (get lag.external.metrics.k8s.io)".to_string(),
                "failed to get lag external metric value: failed to get external metric lag: unable to get external metric web/lag/&LabelSelector{MatchLabels:map[string]string{},MatchExpressions:[]LabelSelectorRequirement{LabelSelectorRequirement{Key:topic,Operator:In,Values:[a b],},},}: unable to fetch metrics from external metrics API: the server could not find the requested resource (get lag.external.metrics.k8s.io)".to_string(),
            ),
            (
                json!({"type": "External", "external": {"metric": {"name": "lag"},
                    "target": {"type": "Value", "value": "100"}}}),
                "FailedGetExternalMetric",
                "unable to get external metric web/lag/nil: unable to fetch metrics from external metrics API: the server could not find the requested resource (get lag.external.metrics.k8s.io)".to_string(),
                "failed to get lag external metric value: failed to get external metric lag: unable to get external metric web/lag/nil: unable to fetch metrics from external metrics API: the server could not find the requested resource (get lag.external.metrics.k8s.io)".to_string(),
            ),
        ];
        for (metric, reason, error, outer) in cases {
            let f = failure(&spec(metric.clone()), "web").expect("a failure");
            assert_eq!(f.reason, reason, "{metric}");
            assert_eq!(f.error, error, "{metric}");
            assert_eq!(f.outer, outer, "{metric}");
        }
        let resource = spec(json!({"type": "Resource", "resource": {"name": "cpu",
            "target": {"type": "Utilization", "averageUtilization": 50}}}));
        assert!(failure(&resource, "web").is_none());
    }
}
