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
mod metrics;
pub mod replicas;
mod unserved;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{
    HPAScalingRules, HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition,
    HorizontalPodAutoscalerStatus,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{key, name, namespace};
use serde_json::Value;

use behavior::{History, Normalized, Policy, PolicyKind, Rules, Select};
use replicas::{Calculator, Ms};
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
