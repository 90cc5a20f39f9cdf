//! The HorizontalPodAutoscaler controller (autoscaling/v2), as Kubernetes' runs it: every sync
//! period each autoscaler reads its target's scale subresource (Deployments, ReplicaSets,
//! ReplicationControllers), works out the replicas each Resource metric proposes from the
//! pods' usage in `metrics.k8s.io` and their requests ([`replicas`]), takes the largest,
//! normalizes it ([`behavior`]: stabilization windows, scaling policies, min and max), updates
//! the scale when it changed (a `SuccessfulRescale` event: "New size: 3; reason: cpu resource
//! utilization (percentage of request) above target"), and writes the status with the
//! AbleToScale, ScalingActive and ScalingLimited conditions and Kubernetes' reasons.
//!
//! The recommendations and scale events an autoscaler remembers live in this leader's memory,
//! as in kube-controller-manager: a new leader starts them afresh.

pub mod behavior;
pub mod replicas;
mod unserved;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{
    HPAScalingRules, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus, MetricSpec, MetricStatus, MetricValueStatus,
    ResourceMetricStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{key, name, namespace};
use rkube_core::quantity::{format_canonical, parse_quantity, Format};
use rkube_core::selector::LabelSelector;
use serde_json::Value;

use behavior::{History, Normalized, Policy, PolicyKind, Rules, Select};
use replicas::{Calculator, Ms, PodInfo, Sample, Target};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;

const COMPONENT: &str = "horizontal-pod-autoscaler";
const WORKERS: usize = 2;

/// kube-controller-manager's `--horizontal-pod-autoscaler-*` settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub sync_period: Duration,
    pub tolerance: f64,
    /// How long a scale-down waits for higher recommendations when `behavior` does not say.
    pub downscale_stabilization: Duration,
    pub cpu_initialization_period: Duration,
    pub initial_readiness_delay: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            sync_period: Duration::from_secs(15),
            tolerance: 0.1,
            downscale_stabilization: Duration::from_secs(300),
            cpu_initialization_period: Duration::from_secs(300),
            initial_readiness_delay: Duration::from_secs(30),
        }
    }
}

/// What one autoscaler's controller remembers: its recommendations and rescales, and when
/// (at which generation) it was last looked at.
#[derive(Default)]
struct Memory {
    history: History,
    last: Option<(Instant, Option<i64>)>,
}

pub struct Autoscalers {
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    recorder: Recorder,
    settings: Settings,
    calc: Calculator,
    memory: Mutex<HashMap<String, Memory>>,
}

pub fn start(
    hpas: Arc<Store<HorizontalPodAutoscaler>>,
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
    settings: Settings,
) {
    let ctx = Arc::new(Autoscalers {
        pods: pods.clone(),
        recorder: Recorder::new(client.clone(), COMPONENT),
        client,
        calc: Calculator {
            tolerance: settings.tolerance,
            cpu_initialization: settings.cpu_initialization_period.as_millis() as Ms,
            initial_readiness_delay: settings.initial_readiness_delay.as_millis() as Ms,
        },
        settings,
        memory: Mutex::new(HashMap::new()),
    });
    let forget = ctx.clone();
    // Pods are read from the cache at each sync; their changes do not trigger one.
    Controller::new(COMPONENT, hpas)
        .watches(&pods, |_, _| Vec::new())
        .on_gone(move |key| {
            forget
                .memory
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(key);
        })
        .run(
            WORKERS,
            stop,
            ctx,
            |hpa: Arc<HorizontalPodAutoscaler>, ctx: Arc<Autoscalers>| async move {
                ctx.reconcile(&hpa).await
            },
        );
}

fn now_ms() -> Ms {
    Timestamp::now().as_millisecond()
}

/// Sets condition `ty`, keeping its transition time when its status did not change.
fn set_condition(
    conditions: &mut Vec<HorizontalPodAutoscalerCondition>,
    ty: &str,
    status: bool,
    reason: &str,
    message: String,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let now = Some(Time(Timestamp::now()));
    match conditions.iter_mut().find(|c| c.type_ == ty) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now;
            }
            c.status = status;
            c.reason = Some(reason.to_string());
            c.message = Some(message);
        }
        None => conditions.push(HorizontalPodAutoscalerCondition {
            type_: ty.to_string(),
            status,
            reason: Some(reason.to_string()),
            message: Some(message),
            last_transition_time: now,
        }),
    }
}

fn rules(r: Option<&HPAScalingRules>, default_window: i64) -> Rules {
    let r = r.cloned().unwrap_or_default();
    Rules {
        stabilization_seconds: r
            .stabilization_window_seconds
            .map(i64::from)
            .unwrap_or(default_window),
        select: match r.select_policy.as_deref() {
            Some("Min") => Select::Min,
            Some("Disabled") => Select::Disabled,
            _ => Select::Max,
        },
        policies: r
            .policies
            .unwrap_or_default()
            .iter()
            .map(|p| Policy {
                kind: if p.type_ == "Pods" {
                    PolicyKind::Pods
                } else {
                    PolicyKind::Percent
                },
                value: p.value,
                period_seconds: p.period_seconds.into(),
            })
            .collect(),
    }
}

fn milli(q: &str) -> Option<i64> {
    i64::try_from(parse_quantity(q)? / 1_000_000).ok()
}

/// The resource path of a scale target, from its apiVersion and kind.
fn scale_path(ns: &str, api_version: &str, kind: &str, target: &str) -> Result<String, String> {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    let plural = match (group, kind) {
        ("apps", "Deployment") => "deployments",
        ("apps", "ReplicaSet") => "replicasets",
        ("apps", "StatefulSet") => "statefulsets",
        ("", "ReplicationController") => "replicationcontrollers",
        _ => {
            return Err(format!(
                "unable to determine resource for scale target reference: no matches for kind \"{kind}\" in group \"{group}\""
            ))
        }
    };
    let base = if group.is_empty() {
        "/api/v1".to_string()
    } else {
        format!("/apis/{api_version}")
    };
    Ok(format!("{base}/namespaces/{ns}/{plural}/{target}/scale"))
}

/// A failed metric: the condition reason and the error.
struct Failure {
    reason: &'static str,
    error: String,
    /// The error as the count of invalid metrics quotes it.
    outer: String,
}

/// What a metric proposes.
struct Proposed {
    replicas: i32,
    name: String,
    status: MetricStatus,
}

impl Autoscalers {
    fn remember<R>(&self, key: &str, f: impl FnOnce(&mut Memory) -> R) -> R {
        f(self
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_string())
            .or_default())
    }

    async fn reconcile(&self, hpa: &HorizontalPodAutoscaler) -> Result<Action, ApiError> {
        let meta = &hpa.metadata;
        if meta.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let hpa_key = key(meta);
        let period = self.settings.sync_period;
        // A sync per period: the controller's own status writes do not bring one sooner, a
        // changed spec does.
        let wait = self.remember(&hpa_key, |m| match m.last {
            Some((at, generation)) if generation == meta.generation => {
                period.checked_sub(at.elapsed()).filter(|d| !d.is_zero())
            }
            _ => None,
        });
        if let Some(wait) = wait {
            return Ok(Action::requeue(wait));
        }
        self.remember(&hpa_key, |m| {
            m.last = Some((Instant::now(), meta.generation))
        });
        self.sync(hpa, &hpa_key).await?;
        Ok(Action::requeue(period))
    }

    async fn sync(&self, hpa: &HorizontalPodAutoscaler, hpa_key: &str) -> Result<(), ApiError> {
        let ns = namespace(&hpa.metadata);
        let spec = hpa.spec.clone().unwrap_or_default();
        let previous = hpa.status.clone().unwrap_or_default();
        let mut status = previous.clone();
        let mut conditions = previous.conditions.clone().unwrap_or_default();
        status.observed_generation = hpa.metadata.generation;
        let target = &spec.scale_target_ref;
        let scale = match scale_path(
            ns,
            target.api_version.as_deref().unwrap_or(""),
            &target.kind,
            &target.name,
        ) {
            Ok(path) => self
                .client
                .get(&path)
                .await
                .map(|s| (path, s))
                .map_err(|e| e.message),
            Err(e) => Err(e),
        };
        let (path, mut scale) = match scale {
            Ok(s) => s,
            Err(e) => {
                self.recorder
                    .event_for(hpa, WARNING, "FailedGetScale", &e)
                    .await;
                set_condition(
                    &mut conditions,
                    "AbleToScale",
                    false,
                    "FailedGetScale",
                    format!("the HPA controller was unable to get the target's current scale: {e}"),
                );
                status.conditions = Some(conditions);
                return self.write_status(hpa, status).await;
            }
        };
        set_condition(
            &mut conditions,
            "AbleToScale",
            true,
            "SucceededGetScale",
            "the HPA controller was able to get the target's current scale".into(),
        );
        let current = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(0) as i32;
        let now = now_ms();
        self.remember(hpa_key, |m| m.history.record_initial(current, now));
        let min = spec.min_replicas.unwrap_or(1);
        let max = spec.max_replicas;
        let mut metric_statuses = previous.current_metrics.clone();
        let (desired, reason) = if current == 0 && min != 0 {
            set_condition(
                &mut conditions,
                "ScalingActive",
                false,
                "ScalingDisabled",
                "scaling is disabled since the replica count of the target is zero".into(),
            );
            (current, String::new())
        } else if current > max {
            (
                max,
                "Current number of replicas above Spec.MaxReplicas".to_string(),
            )
        } else if current < min {
            (
                min,
                "Current number of replicas below Spec.MinReplicas".to_string(),
            )
        } else {
            let selector = scale
                .pointer("/status/selector")
                .and_then(Value::as_str)
                .unwrap_or("");
            let metrics = spec.metrics.clone().unwrap_or_default();
            let computed = self
                .metrics_replicas(hpa, ns, selector, current, &metrics, &mut conditions)
                .await;
            let (proposed, statuses) = match computed {
                Some(c) => c,
                None => {
                    status.current_replicas = Some(current);
                    status.conditions = Some(conditions);
                    return self.write_status(hpa, status).await;
                }
            };
            metric_statuses = Some(statuses);
            let Some((replicas, metric)) = proposed else {
                status.current_replicas = Some(current);
                status.current_metrics = metric_statuses;
                status.conditions = Some(conditions);
                return self.write_status(hpa, status).await;
            };
            let reason = if replicas > current {
                format!("{metric} above target")
            } else if replicas < current {
                "All metrics below target".to_string()
            } else {
                String::new()
            };
            let n = self.normalize(hpa_key, &spec, (min, max), current, replicas, now);
            set_condition(
                &mut conditions,
                "AbleToScale",
                true,
                n.able.0,
                n.able.1.into(),
            );
            set_condition(
                &mut conditions,
                "ScalingLimited",
                n.limited.0,
                n.limited.1,
                n.limited.2.into(),
            );
            (n.replicas, reason)
        };
        let mut desired_now = current;
        if desired != current {
            scale["spec"]["replicas"] = Value::from(desired);
            match self.client.update(&path, &scale).await {
                Ok(_) => {
                    set_condition(
                        &mut conditions,
                        "AbleToScale",
                        true,
                        "SucceededRescale",
                        format!(
                            "the HPA controller was able to update the target scale to {desired}"
                        ),
                    );
                    self.recorder
                        .event_for(
                            hpa,
                            NORMAL,
                            "SuccessfulRescale",
                            &format!("New size: {desired}; reason: {reason}"),
                        )
                        .await;
                    if let Some(b) = &spec.behavior {
                        let (up, down) = self.behavior_rules(b);
                        self.remember(hpa_key, |m| {
                            m.history
                                .record_rescale(current, desired, (&up, &down), now)
                        });
                    }
                    status.last_scale_time = Some(Time(Timestamp::now()));
                    desired_now = desired;
                }
                Err(e) => {
                    self.recorder
                        .event_for(
                            hpa,
                            WARNING,
                            "FailedRescale",
                            &format!(
                                "New size: {desired}; reason: {reason}; error: {}",
                                e.message
                            ),
                        )
                        .await;
                    set_condition(
                        &mut conditions,
                        "AbleToScale",
                        false,
                        "FailedUpdateScale",
                        format!(
                            "the HPA controller was unable to update the target scale: {}",
                            e.message
                        ),
                    );
                    status.conditions = Some(conditions);
                    status.current_replicas = Some(current);
                    status.current_metrics = metric_statuses;
                    self.write_status(hpa, status).await?;
                    return Err(e);
                }
            }
        }
        status.current_replicas = Some(current);
        status.desired_replicas = desired_now;
        status.current_metrics = metric_statuses;
        status.conditions = Some(conditions);
        self.write_status(hpa, status).await
    }

    fn behavior_rules(
        &self,
        b: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior,
    ) -> (Rules, Rules) {
        let down_default = self.settings.downscale_stabilization.as_secs() as i64;
        (
            rules(b.scale_up.as_ref(), 0),
            rules(b.scale_down.as_ref(), down_default),
        )
    }

    fn normalize(
        &self,
        hpa_key: &str,
        spec: &k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerSpec,
        bounds: (i32, i32),
        current: i32,
        desired: i32,
        now: Ms,
    ) -> Normalized {
        match &spec.behavior {
            None => {
                let window = self.settings.downscale_stabilization.as_millis() as Ms;
                self.remember(hpa_key, |m| {
                    behavior::normalize(&mut m.history, window, bounds, current, desired, now)
                })
            }
            Some(b) => {
                let (up, down) = self.behavior_rules(b);
                self.remember(hpa_key, |m| {
                    behavior::normalize_with_behavior(
                        &mut m.history,
                        (&up, &down),
                        bounds,
                        current,
                        desired,
                        now,
                    )
                })
            }
        }
    }

    async fn write_status(
        &self,
        hpa: &HorizontalPodAutoscaler,
        status: HorizontalPodAutoscalerStatus,
    ) -> Result<(), ApiError> {
        if hpa.status.as_ref() == Some(&status) {
            return Ok(());
        }
        let mut updated = hpa.clone();
        updated.status = Some(status);
        let objects =
            Objects::<HorizontalPodAutoscaler>::namespaced(&self.client, namespace(&hpa.metadata));
        ignore_gone(objects.replace_status(name(&hpa.metadata), &updated).await)?;
        Ok(())
    }

    /// Every metric's proposal: None when the selector is unusable (the conditions say why);
    /// else the largest proposal (None when every metric failed) and each metric's status.
    async fn metrics_replicas(
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
        if let Some(f) = unserved::failure(metric, ns) {
            return Err(f);
        }
        let Some(source) = metric
            .resource
            .as_ref()
            .filter(|_| metric.type_ == "Resource")
        else {
            let (reason, error) = match metric.type_.as_str() {
                "ContainerResource" => (
                    "FailedGetContainerResourceMetric",
                    "unable to get container resource metric: only Resource metrics are computed here".to_string(),
                ),
                other => (
                    "InvalidMetricSourceType",
                    format!("unknown metric source type {other:?}"),
                ),
            };
            return Err(Failure {
                reason,
                outer: error.clone(),
                error,
            });
        };
        let resource = source.name.as_str();
        let target = if let Some(v) = &source.target.average_value {
            Target::AverageValue(milli(&v.0).unwrap_or(0))
        } else if let Some(u) = source.target.average_utilization {
            Target::Utilization(u.into())
        } else {
            let error = "invalid resource metric source: neither an average utilization target nor an average value (usage) target was set".to_string();
            return Err(Failure {
                reason: "FailedGetResourceMetric",
                outer: format!("failed to get {resource} resource metric value: {error}"),
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
                reason: "FailedGetResourceMetric",
                outer: format!("failed to get {resource} resource metric value: {error}"),
                error,
            }
        };
        let samples = self
            .pod_samples(ns, selector, resource)
            .await
            .map_err(|e| {
                fail(format!(
                    "unable to get metrics for resource {resource}: {e}"
                ))
            })?;
        let infos: Vec<PodInfo> = pods.iter().map(|p| pod_info(p, resource)).collect();
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
        let name = match target {
            Target::Utilization(_) => {
                format!("{resource} resource utilization (percentage of request)")
            }
            Target::AverageValue(_) => format!("{resource} resource"),
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
        Ok(Proposed {
            replicas: p.replicas,
            name,
            status: MetricStatus {
                type_: "Resource".into(),
                resource: Some(ResourceMetricStatus {
                    name: resource.to_string(),
                    current: current_value,
                }),
                ..Default::default()
            },
        })
    }

    /// The pods' usage of `resource` from metrics.k8s.io (milli-units), by pod name.
    async fn pod_samples(
        &self,
        ns: &str,
        selector: &str,
        resource: &str,
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
        let samples = pod_samples(&list, resource);
        if samples.is_empty() {
            return Err("no metrics returned from resource metrics API".into());
        }
        Ok(samples)
    }
}

/// The samples of a PodMetricsList: each pod's containers' usage summed; a pod with a
/// container that lacks the resource is left out.
fn pod_samples(list: &Value, resource: &str) -> BTreeMap<String, Sample> {
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
        let mut total = Some(0i64);
        for c in item
            .get("containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let v = c
                .pointer(&format!("/usage/{resource}"))
                .and_then(Value::as_str)
                .and_then(milli);
            total = match (total, v) {
                (Some(t), Some(v)) => Some(t + v),
                _ => None,
            };
        }
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
    out
}

/// What the calculator needs of a pod, with its containers' requests of `resource`.
fn pod_info(pod: &Pod, resource: &str) -> PodInfo {
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
    fn scale_paths() {
        assert_eq!(
            scale_path("default", "apps/v1", "Deployment", "web").unwrap(),
            "/apis/apps/v1/namespaces/default/deployments/web/scale"
        );
        assert_eq!(
            scale_path("ns", "v1", "ReplicationController", "rc").unwrap(),
            "/api/v1/namespaces/ns/replicationcontrollers/rc/scale"
        );
        assert_eq!(
            scale_path("ns", "apps/v1", "Gadget", "g").unwrap_err(),
            "unable to determine resource for scale target reference: no matches for kind \"Gadget\" in group \"apps\""
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
        let s = pod_samples(&list, "cpu");
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

    #[test]
    fn conditions_keep_their_transition_time() {
        let mut cs = Vec::new();
        set_condition(&mut cs, "AbleToScale", true, "A", "a".into());
        let t = cs[0].last_transition_time.clone();
        set_condition(&mut cs, "AbleToScale", true, "B", "b".into());
        assert_eq!(cs[0].last_transition_time, t);
        assert_eq!(cs[0].reason.as_deref(), Some("B"));
        set_condition(&mut cs, "ScalingActive", false, "C", "c".into());
        assert_eq!(cs.len(), 2);
    }
}
