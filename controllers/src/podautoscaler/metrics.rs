//! What each metric proposes: the pods' usage of a resource from `metrics.k8s.io` and their
//! requests go to the calculator ([`super::replicas`]); the largest proposal wins, and the
//! ScalingActive condition and the warning events say which metric failed and why.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::autoscaling::v2::{
    ContainerResourceMetricStatus, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    MetricSpec, MetricStatus, MetricTarget, MetricValueStatus, ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use rkube_core::meta::name;
use rkube_core::quantity::{format_canonical, parse_quantity, Format};
use rkube_core::selector::LabelSelector;
use rkube_runtime::events::WARNING;
use serde_json::Value;

use super::replicas::{self, Ms, PodInfo, Sample, Target};
use super::{now_ms, set_condition, Autoscalers};

fn milli(q: &str) -> Option<i64> {
    i64::try_from(parse_quantity(q)? / 1_000_000).ok()
}

/// A failed metric: the condition reason and the error.
pub(super) struct Failure {
    pub(super) reason: &'static str,
    pub(super) error: String,
    /// The error as the count of invalid metrics quotes it.
    pub(super) outer: String,
}

/// What a metric proposes.
struct Proposed {
    replicas: i32,
    name: String,
    status: MetricStatus,
}

impl Autoscalers {
    /// Every metric's proposal: None when the selector is unusable (the conditions say why);
    /// else the largest proposal (None when every metric failed) and each metric's status.
    pub(super) async fn metrics_replicas(
        &self,
        hpa: &HorizontalPodAutoscaler,
        ns: &str,
        selector: &str,
        current: i32,
        metrics: &[MetricSpec],
        conditions: &mut Vec<HorizontalPodAutoscalerCondition>,
    ) -> Option<(Option<(i32, String)>, Vec<MetricStatus>)> {
        if selector.is_empty() {
            self.recorder
                .event_for(hpa, WARNING, "SelectorRequired", "selector is required")
                .await;
            set_condition(
                conditions,
                "ScalingActive",
                false,
                "InvalidSelector",
                "the HPA target's scale is missing a selector".into(),
            );
            return None;
        }
        let parsed = match LabelSelector::parse(selector) {
            Ok(s) => s,
            Err(e) => {
                self.recorder
                    .event_for(hpa, WARNING, "InvalidSelector", &e)
                    .await;
                set_condition(
                    conditions,
                    "ScalingActive",
                    false,
                    "InvalidSelector",
                    format!("the HPA target's scale has an invalid selector: {e}"),
                );
                return None;
            }
        };
        let pods: Vec<Arc<Pod>> = self
            .pods
            .in_namespace(ns)
            .into_iter()
            .filter(|p| parsed.matches_labels(p.metadata.labels.as_ref()))
            .collect();
        let mut statuses = Vec::new();
        let mut best: Option<(i32, String)> = None;
        let mut failures: Vec<Failure> = Vec::new();
        for m in metrics {
            match self.metric_replicas(ns, selector, current, m, &pods).await {
                Ok(p) => {
                    if best.as_ref().is_none_or(|(r, _)| p.replicas > *r) {
                        best = Some((p.replicas, p.name.clone()));
                    }
                    statuses.push(p.status);
                }
                Err(f) => {
                    self.recorder
                        .event_for(hpa, WARNING, f.reason, &f.error)
                        .await;
                    statuses.push(MetricStatus::default());
                    failures.push(f);
                }
            }
        }
        // Kubernetes gives up when every metric failed, and when some failed and the others
        // would scale down (a failed one might have asked for more).
        let give_up = best.as_ref().is_none_or(|(r, _)| *r < current);
        match (&best, failures.first().filter(|_| give_up)) {
            (_, Some(first)) => {
                set_condition(
                    conditions,
                    "ScalingActive",
                    false,
                    first.reason,
                    format!(
                        "the HPA was unable to compute the replica count: {}",
                        first.error
                    ),
                );
                self.recorder
                    .event_for(
                        hpa,
                        WARNING,
                        "FailedComputeMetricsReplicas",
                        &format!(
                            "invalid metrics ({} invalid out of {}), first error is: {}",
                            failures.len(),
                            metrics.len(),
                            first.outer
                        ),
                    )
                    .await;
            }
            (Some((_, name)), None) => set_condition(
                conditions,
                "ScalingActive",
                true,
                "ValidMetricFound",
                format!("the HPA was able to successfully calculate a replica count from {name}"),
            ),
            (None, None) => {}
        }
        let best = best.filter(|_| !give_up || failures.is_empty());
        Some((best, statuses))
    }

    async fn metric_replicas(
        &self,
        ns: &str,
        selector: &str,
        current: i32,
        metric: &MetricSpec,
        pods: &[Arc<Pod>],
    ) -> Result<Proposed, Failure> {
        if let Some(f) = super::unserved::failure(metric, ns) {
            return Err(f);
        }
        // A Resource metric counts every container of a pod; a ContainerResource one the
        // named container only.
        let (resource, container, source_target): (&str, Option<&str>, &MetricTarget) = match (
            metric.type_.as_str(),
            &metric.resource,
            &metric.container_resource,
        ) {
            ("Resource", Some(r), _) => (r.name.as_str(), None, &r.target),
            ("ContainerResource", _, Some(c)) => {
                (c.name.as_str(), Some(c.container.as_str()), &c.target)
            }
            (other, _, _) => {
                let error = format!("unknown metric source type {other:?}");
                return Err(Failure {
                    reason: "InvalidMetricSourceType",
                    outer: error.clone(),
                    error,
                });
            }
        };
        // kube-controller-manager's reason and outer wording for each kind of source.
        let (reason, outer) = match container {
            None => (
                "FailedGetResourceMetric",
                format!("failed to get {resource} resource metric value"),
            ),
            Some(c) => (
                "FailedGetContainerResourceMetric",
                format!("failed to get {c} container metric value"),
            ),
        };
        let target = if let Some(v) = &source_target.average_value {
            Target::AverageValue(milli(&v.0).unwrap_or(0))
        } else if let Some(u) = source_target.average_utilization {
            Target::Utilization(u.into())
        } else {
            let error = "invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".to_string();
            return Err(Failure {
                reason,
                outer: format!("{outer}: {error}"),
                error,
            });
        };
        let what = match target {
            Target::Utilization(_) => "utilization",
            Target::AverageValue(_) => "usage",
        };
        let fail = |e: String| {
            let error = format!("failed to get {resource} {what}: {e}");
            Failure {
                reason,
                outer: format!("{outer}: {error}"),
                error,
            }
        };
        let samples = self
            .pod_samples(ns, selector, resource, container)
            .await
            .map_err(|e| {
                fail(format!(
                    "unable to get metrics for resource {resource}: {e}"
                ))
            })?;
        let infos: Vec<PodInfo> = pods
            .iter()
            .map(|p| pod_info(p, resource, container))
            .collect();
        let p = replicas::resource_replicas(
            &self.calc,
            current,
            target,
            resource,
            &infos,
            &samples,
            now_ms(),
        )
        .map_err(fail)?;
        let name = match (target, container) {
            (Target::Utilization(_), None) => {
                format!("{resource} resource utilization (percentage of request)")
            }
            (Target::Utilization(_), Some(_)) => {
                format!("{resource} container resource utilization (percentage of request)")
            }
            (Target::AverageValue(_), _) => format!("{resource} resource"),
        };
        let current_value = MetricValueStatus {
            average_utilization: p.utilization.map(|u| u as i32),
            // As Kubernetes writes it (a DecimalSI milli-quantity, canonical).
            average_value: Some(Quantity(format_canonical(
                p.average as i128 * 1_000_000,
                Format::DecimalSi,
            ))),
            value: None,
        };
        let status = match container {
            None => MetricStatus {
                type_: "Resource".into(),
                resource: Some(ResourceMetricStatus {
                    name: resource.to_string(),
                    current: current_value,
                }),
                ..Default::default()
            },
            Some(c) => MetricStatus {
                type_: "ContainerResource".into(),
                container_resource: Some(ContainerResourceMetricStatus {
                    name: resource.to_string(),
                    container: c.to_string(),
                    current: current_value,
                }),
                ..Default::default()
            },
        };
        Ok(Proposed {
            replicas: p.replicas,
            name,
            status,
        })
    }

    /// The pods' usage of `resource` from metrics.k8s.io (milli-units), by pod name: of every
    /// container, or of `container` only.
    async fn pod_samples(
        &self,
        ns: &str,
        selector: &str,
        resource: &str,
        container: Option<&str>,
    ) -> Result<BTreeMap<String, Sample>, String> {
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("labelSelector", selector)
            .finish();
        let list = self
            .client
            .get(&format!(
                "/apis/metrics.k8s.io/v1beta1/namespaces/{ns}/pods?{query}"
            ))
            .await
            .map_err(|e| e.message)?;
        let samples = pod_samples(&list, resource, container)
            .map_err(|e| format!("failed to get container metrics: {e}"))?;
        if samples.is_empty() {
            return Err("no metrics returned from resource metrics API".into());
        }
        Ok(samples)
    }
}

/// The samples of a PodMetricsList: each pod's containers' usage summed (a pod with no
/// container, or with one that lacks the resource, is left out), or with `container` the usage
/// of that container (a pod whose container lacks the resource is left out; one without the
/// container is an error, as in Kubernetes).
fn pod_samples(
    list: &Value,
    resource: &str,
    container: Option<&str>,
) -> Result<BTreeMap<String, Sample>, String> {
    let mut out = BTreeMap::new();
    for item in list
        .get("items")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(pod) = item.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        let timestamp = item
            .get("timestamp")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map(|t| t.as_millisecond())
            .unwrap_or(0);
        let window = item
            .get("window")
            .and_then(Value::as_str)
            .and_then(|w| w.strip_suffix('s'))
            .and_then(|w| w.parse::<f64>().ok())
            .map(|s| (s * 1000.0) as Ms)
            .unwrap_or(0);
        let containers: Vec<&Value> = item
            .get("containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .collect();
        let usage = |c: &Value| {
            c.pointer(&format!("/usage/{resource}"))
                .and_then(Value::as_str)
                .and_then(milli)
        };
        let total = match container {
            Some(wanted) => {
                let Some(c) = containers
                    .iter()
                    .find(|c| c.get("name").and_then(Value::as_str) == Some(wanted))
                else {
                    let ns = item
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    return Err(format!(
                        "container {wanted} not present in metrics for pod {ns}/{pod}"
                    ));
                };
                usage(c)
            }
            None if containers.is_empty() => None,
            None => containers
                .iter()
                .try_fold(0i64, |sum, c| usage(c).map(|v| sum + v)),
        };
        if let Some(value) = total {
            out.insert(
                pod.to_string(),
                Sample {
                    value,
                    timestamp,
                    window,
                },
            );
        }
    }
    Ok(out)
}

/// What the calculator needs of a pod, with its containers' requests of `resource` (of
/// `container` only, when one is named).
fn pod_info(pod: &Pod, resource: &str, container: Option<&str>) -> PodInfo {
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map(|c| {
            (
                c.status == "True",
                c.last_transition_time
                    .as_ref()
                    .map(|t| t.0.as_millisecond())
                    .unwrap_or(0),
            )
        });
    let mut request = Ok(0i64);
    for c in pod
        .spec
        .as_ref()
        .map(|s| &s.containers)
        .into_iter()
        .flatten()
        .filter(|c| container.is_none_or(|wanted| c.name == wanted))
    {
        let r = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| milli(&q.0));
        request = match (request, r) {
            (Ok(sum), Some(r)) => Ok(sum + r),
            (Ok(_), None) => Err(c.name.clone()),
            (e, _) => e,
        };
    }
    PodInfo {
        name: name(&pod.metadata).to_string(),
        phase: status.phase.clone().unwrap_or_default(),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        ready,
        start: status.start_time.as_ref().map(|t| t.0.as_millisecond()),
        request,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_container_resource_metric_counts_its_container_only() {
        let list = json!({"items": [
            {"metadata": {"name": "a", "namespace": "web"}, "timestamp": "2026-01-01T00:00:00Z",
             "window": "15s",
             "containers": [{"name": "app", "usage": {"cpu": "150m"}},
                            {"name": "proxy", "usage": {"cpu": "50m"}}]},
            {"metadata": {"name": "b", "namespace": "web"}, "timestamp": "2026-01-01T00:00:00Z",
             "window": "15s",
             "containers": [{"name": "app", "usage": {"memory": "1Mi"}},
                            {"name": "proxy", "usage": {"cpu": "50m"}}]},
            {"metadata": {"name": "c", "namespace": "web"}, "timestamp": "2026-01-01T00:00:00Z",
             "window": "15s", "containers": []},
        ]});
        let s = pod_samples(&list, "cpu", Some("app")).err();
        assert_eq!(
            s.as_deref(),
            Some("container app not present in metrics for pod web/c"),
            "a pod without the container is an error, as in Kubernetes"
        );
        let items = list["items"].as_array().expect("items")[..2].to_vec();
        let two = json!({ "items": items });
        let s = pod_samples(&two, "cpu", Some("app")).expect("samples");
        assert_eq!(s.len(), 1, "a container without CPU leaves its pod out");
        assert_eq!(s["a"].value, 150, "the sidecar is not counted");
        let all = pod_samples(&list, "cpu", None).expect("samples");
        assert_eq!(
            all.len(),
            1,
            "b lacks CPU in one container, c has none at all"
        );
        assert_eq!(all["a"].value, 200);

        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "a"},
            "spec": {"containers": [
                {"name": "app", "resources": {"requests": {"cpu": "100m"}}},
                {"name": "proxy"}]}}))
        .expect("pod");
        assert_eq!(pod_info(&pod, "cpu", Some("app")).request, Ok(100));
        assert_eq!(
            pod_info(&pod, "cpu", None).request,
            Err("proxy".to_string()),
            "a Resource metric needs every container's request"
        );
    }

    #[test]
    fn pod_metrics_become_samples() {
        let list = json!({"items": [
            {"metadata": {"name": "a"}, "timestamp": "2026-01-01T00:00:00Z", "window": "15.5s",
             "containers": [{"name": "x", "usage": {"cpu": "150000000n", "memory": "1Mi"}},
                            {"name": "y", "usage": {"cpu": "50m", "memory": "1Mi"}}]},
            {"metadata": {"name": "b"}, "timestamp": "2026-01-01T00:00:00Z", "window": "15s",
             "containers": [{"name": "x", "usage": {"memory": "1Mi"}}]},
        ]});
        let s = pod_samples(&list, "cpu", None).expect("samples");
        assert_eq!(s.len(), 1, "a pod with a container without CPU is left out");
        assert_eq!(s["a"].value, 200);
        assert_eq!(s["a"].window, 15_500);
        assert_eq!(
            s["a"].timestamp,
            "2026-01-01T00:00:00Z"
                .parse::<Timestamp>()
                .unwrap()
                .as_millisecond()
        );
    }
}
