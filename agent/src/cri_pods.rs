//! A pod's worker on the `cri` runtime: sandbox and containers made through the runtime, their
//! state read back every second and reported as the kubelet reports it (phase, conditions, pod
//! IP from the sandbox's network, containerStatuses with state, lastState, restartCount,
//! imageID, exit codes and reasons), exited containers restarted as restartPolicy says with
//! back-off (CrashLoopBackOff), images missing and unpullable reported as ErrImagePull /
//! ImagePullBackOff, a deleted pod's containers stopped within its grace period, and its
//! projected service account tokens renewed before they expire.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use rkube_core::meta;
use tokio::sync::mpsc;

use crate::cri::{backoff, ContainerView, Cri};
use crate::join::Clients;
use crate::pods::{phase, status_patch};
use crate::podspec::{pod_containers, spec_str};
use crate::NodeConfig;

const TICK: Duration = Duration::from_secs(1);
/// How often a pod's projected tokens are checked for renewal.
const TOKEN_CHECK: Duration = Duration::from_secs(10);

/// A time the runtime reports (nanoseconds since the epoch; 0: not yet), to the second.
fn time(nanos: i64) -> Option<Time> {
    if nanos <= 0 {
        return None;
    }
    Timestamp::from_second(nanos / 1_000_000_000).ok().map(Time)
}

/// One spec container as this worker runs it.
struct Slot {
    spec: Container,
    id: Option<String>,
    restarts: u32,
    /// The last finished run, for lastState.
    last: Option<ContainerState>,
    /// Why it is not running (ErrImagePull, CrashLoopBackOff...), with the message.
    waiting: Option<(String, String)>,
    /// When a back-off ends.
    retry_at: Option<Instant>,
    /// Image pulls failed in a row.
    pull_failures: u32,
    /// The container of the run before this one (kept for its logs).
    previous: Option<String>,
    startup: Option<crate::probe::Probe>,
    readiness: Option<crate::probe::Probe>,
    liveness: Option<crate::probe::Probe>,
    view: Option<ContainerView>,
}

impl Slot {
    fn new(spec: &Container) -> Slot {
        Slot {
            spec: spec.clone(),
            id: None,
            restarts: 0,
            last: None,
            waiting: None,
            retry_at: None,
            pull_failures: 0,
            previous: None,
            startup: None,
            readiness: None,
            liveness: None,
            view: None,
        }
    }

    fn exited(&self) -> Option<i32> {
        self.view
            .as_ref()
            .filter(|v| v.exited() && self.waiting.is_none())
            .map(|v| v.exit_code)
    }

    /// Running, and past its startup probe if it has one.
    fn started(&self) -> bool {
        self.view.as_ref().is_some_and(ContainerView::running)
            && self.startup.as_ref().is_none_or(|p| p.ok)
    }

    fn ready(&self) -> bool {
        self.started() && self.readiness.as_ref().is_none_or(|p| p.ok)
    }
}

fn terminated(v: &ContainerView) -> ContainerState {
    let reason = if !v.reason.is_empty() && v.reason != "Completed" && v.reason != "Error" {
        v.reason.clone()
    } else if v.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: v.exit_code,
            reason: Some(reason),
            started_at: time(v.started_at),
            finished_at: time(v.finished_at),
            container_id: Some(format!("containerd://{}", v.id)),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}

pub async fn worker(
    clients: Arc<Clients>,
    cfg: Arc<NodeConfig>,
    cri: Cri,
    mut rx: mpsc::UnboundedReceiver<Pod>,
) {
    let Some(mut pod) = rx.recv().await else {
        return;
    };
    let uid = meta::uid(&pod.metadata).to_string();
    let mut sandbox: Option<(String, String)> = None;
    let mut volumes: Option<std::collections::HashMap<String, std::path::PathBuf>> = None;
    let slots_of =
        |init: bool| -> Vec<Slot> { pod_containers(&pod, init).map(Slot::new).collect() };
    let mut inits = slots_of(true);
    let mut slots = slots_of(false);
    // Containers left by an earlier run of the agent: adopted, not made twice.
    if let Ok(existing) = cri.containers_of(&uid).await {
        for slot in inits.iter_mut().chain(slots.iter_mut()) {
            let name = slot.spec.name.as_str();
            if let Some(c) = existing
                .iter()
                .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
                .max_by_key(|c| c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0))
            {
                slot.id = Some(c.id.clone());
                slot.restarts = c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
            }
        }
    }
    let started = crate::pods::now();
    let mut last_status: Option<PodStatus> = None;
    let mut stop_grace: Option<i64> = None;
    let mut tick = tokio::time::interval(TICK);
    let mut token_check = Instant::now() + TOKEN_CHECK;
    loop {
        if pod.metadata.deletion_timestamp.is_some() {
            // preStop hooks once, within the grace period; then SIGTERM with what is left of
            // it (at least 2 s, as the kubelet gives), then SIGKILL.
            let grace = match stop_grace {
                Some(g) => g,
                None => {
                    let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30);
                    let ip = sandbox.as_ref().map(|(_, ip)| ip.as_str()).unwrap_or("");
                    let spent =
                        pre_stop(&cri, &clients.get(), &cfg.name, &pod, &slots, ip, grace).await;
                    let left = if grace == 0 {
                        0
                    } else {
                        (grace - spent).max(2)
                    };
                    stop_grace = Some(left);
                    left
                }
            };
            if let Err(e) = cri.stop_pod(&uid, grace).await {
                tracing::warn!(pod = meta::name(&pod.metadata), error = %e, "stopping the pod failed; retrying");
                tokio::time::sleep(TICK).await;
                continue;
            }
            let _ = std::fs::remove_dir_all(cri.volume_root().join(&uid));
            crate::pods::finish_deletion(&clients, &cfg, &pod).await;
            return;
        }
        let phase = phase(&pod);
        if phase != "Succeeded" && phase != "Failed" {
            if Instant::now() >= token_check {
                token_check = Instant::now() + TOKEN_CHECK;
                crate::projected::renew_due(
                    &clients.get(),
                    &pod,
                    &cri.volume_root(),
                    std::time::SystemTime::now(),
                )
                .await;
            }
            let mut w = Work {
                cri: &cri,
                client: clients.get(),
                node: &cfg.name,
                pod: &pod,
                sandbox: &mut sandbox,
                volumes: &mut volumes,
            };
            w.step(&mut inits, &mut slots).await;
            let mut status = pod_status(&cfg, &sandbox, &inits, &slots, &started);
            // Before this worker wrote a status, the pod's own (the scheduler's PodScheduled,
            // or what an earlier run of the agent wrote) holds the times to keep.
            let before = last_status.as_ref().or(pod.status.as_ref());
            stamp_transitions(&mut status, before, &crate::pods::now());
            if last_status.as_ref() != Some(&status) {
                let api: Api<Pod> = Api::namespaced(clients.get(), meta::namespace(&pod.metadata));
                match api
                    .patch_status(
                        meta::name(&pod.metadata),
                        &PatchParams::default(),
                        &Patch::Merge(&status_patch(&status)),
                    )
                    .await
                {
                    Ok(_) => last_status = Some(status),
                    Err(e) => tracing::debug!(error = %e, "writing the pod status failed"),
                }
            }
        }
        tokio::select! {
            next = rx.recv() => match next {
                Some(p) => pod = p,
                // The pod is gone (deleted for good by someone else): clean up.
                None => {
                    if let Err(e) = cri.stop_pod(&uid, 0).await {
                        tracing::warn!(error = %e, "removing the containers of a deleted pod failed");
                    }
                    return;
                }
            },
            _ = tick.tick() => {}
        }
    }
}

/// Runs the preStop hooks of the pod's running containers, together, for at most `grace`
/// seconds; the seconds they took. A failed hook is a `FailedPreStopHook` event.
async fn pre_stop(
    cri: &Cri,
    client: &kube::Client,
    node: &str,
    pod: &Pod,
    slots: &[Slot],
    ip: &str,
    grace: i64,
) -> i64 {
    let begun = Instant::now();
    let limit = Duration::from_secs(grace.max(0) as u64);
    let hooks = slots.iter().filter_map(|slot| {
        let hook = slot.spec.lifecycle.as_ref()?.pre_stop.as_ref()?;
        let id = slot.id.clone().filter(|_| slot.started())?;
        let name = slot.spec.name.clone();
        Some(async move {
            let r = crate::probe::run(hook, &slot.spec, cri, &id, ip, limit).await;
            (name, r)
        })
    });
    let hooks: Vec<_> = hooks.collect();
    if hooks.is_empty() {
        return 0;
    }
    match tokio::time::timeout(limit, futures::future::join_all(hooks)).await {
        Ok(results) => {
            for (name, r) in results {
                if let Err(why) = r {
                    crate::pods::record(
                        client,
                        pod,
                        "FailedPreStopHook",
                        &format!("PreStopHook failed for container {name}: {why}"),
                        "Warning",
                        node,
                    )
                    .await;
                }
            }
        }
        Err(_) => {
            crate::pods::record(
                client,
                pod,
                "FailedPreStopHook",
                &format!("PreStopHook did not finish within the grace period ({grace}s)"),
                "Warning",
                node,
            )
            .await;
        }
    }
    begun.elapsed().as_secs() as i64
}

/// What one pass over a pod works with.
struct Work<'a> {
    cri: &'a Cri,
    client: kube::Client,
    node: &'a str,
    pod: &'a Pod,
    sandbox: &'a mut Option<(String, String)>,
    volumes: &'a mut Option<std::collections::HashMap<String, std::path::PathBuf>>,
}

impl Work<'_> {
    fn ip(&self) -> String {
        self.sandbox
            .as_ref()
            .map(|(_, ip)| ip.clone())
            .unwrap_or_default()
    }

    async fn event(&self, reason: &str, message: &str, kind: &str) {
        crate::pods::record(&self.client, self.pod, reason, message, kind, self.node).await;
    }

    /// One pass: sandbox; init containers one at a time, each to a successful exit; then the
    /// containers started or restarted, their states read, their probes run.
    async fn step(&mut self, inits: &mut [Slot], slots: &mut [Slot]) {
        if self.sandbox.is_none() {
            match self.cri.sandbox(self.pod).await {
                Ok(sb) => *self.sandbox = Some(sb),
                Err(e) => {
                    let why = format!("{e:#}");
                    let all = || inits.iter().chain(slots.iter());
                    // Once per distinct failure, as the kubelet's event would be counted.
                    if all().next().and_then(|s| s.waiting.as_ref()).map(|w| &w.1) != Some(&why) {
                        self.event(
                            "FailedCreatePodSandBox",
                            &format!("Failed to create pod sandbox: {why}"),
                            "Warning",
                        )
                        .await;
                    }
                    for slot in inits.iter_mut().chain(slots.iter_mut()) {
                        slot.waiting = Some(("ContainerCreating".into(), why.clone()));
                    }
                    return;
                }
            }
        }
        let policy = match spec_str(self.pod, |s| s.restart_policy.as_ref()) {
            "" => "Always",
            p => p,
        };
        let now = Instant::now();
        // Init containers run to completion: restarted on failure unless the policy is Never.
        let init_policy = if policy == "Never" {
            "Never"
        } else {
            "OnFailure"
        };
        for slot in inits.iter_mut() {
            if slot.id.is_some() {
                self.refresh(slot, init_policy, now).await;
            }
            match slot.exited() {
                Some(0) => continue,
                Some(_) => return, // failed for good: the pod fails
                None if slot.id.is_some() => return, // running, or waiting to restart
                None => {}
            }
            self.launch(slot, now).await;
            return;
        }
        for slot in slots.iter_mut() {
            if slot.id.is_some() {
                self.refresh(slot, policy, now).await;
                if let Some(id) = slot
                    .id
                    .clone()
                    .filter(|_| slot.view.as_ref().is_some_and(ContainerView::running))
                {
                    self.probe(slot, &id).await;
                }
            }
            if slot.id.is_none() {
                self.launch(slot, now).await;
            }
        }
    }

    /// Reads the container's state; an exited one is restarted (its id cleared) when the
    /// policy says so and its back-off has passed.
    async fn refresh(&self, slot: &mut Slot, policy: &str, now: Instant) {
        let Some(id) = slot.id.clone() else {
            return;
        };
        match self.cri.container(&id).await {
            Ok(v) if v.exited() => {
                let again = match policy {
                    "Always" => true,
                    "OnFailure" => v.exit_code != 0,
                    _ => false,
                };
                if again && slot.retry_at.is_none() {
                    let wait = backoff(slot.restarts);
                    slot.retry_at = Some(now + wait);
                    slot.waiting = Some((
                        "CrashLoopBackOff".into(),
                        format!(
                            "back-off {}s restarting failed container={} pod={}",
                            wait.as_secs(),
                            slot.spec.name,
                            meta::name(&self.pod.metadata)
                        ),
                    ));
                }
                if again && slot.retry_at.is_some_and(|t| now >= t) {
                    slot.last = Some(terminated(&v));
                    // The exited container stays for `kubectl logs --previous`; the one
                    // before it goes.
                    if let Some(old) = slot.previous.take() {
                        let _ = self.cri.remove_container(&old).await;
                    }
                    slot.previous = slot.id.take();
                    slot.view = None;
                    slot.restarts += 1;
                } else {
                    slot.view = Some(v);
                }
            }
            Ok(v) => {
                slot.waiting = None;
                slot.retry_at = None;
                slot.view = Some(v);
            }
            Err(_) => {
                slot.id = None;
                slot.view = None;
            }
        }
    }

    /// Starts the container (image, volumes, environment), unless it is backing off.
    async fn launch(&mut self, slot: &mut Slot, now: Instant) {
        if slot.retry_at.is_some_and(|t| now < t) {
            return;
        }
        let Some((sb, _)) = self.sandbox.clone() else {
            return;
        };
        let name = slot.spec.name.clone();
        let image = slot.spec.image.clone().unwrap_or_default();
        // The kubelet's image events: Pulling/Pulled, or Failed and BackOff.
        let pulled = match self.cri.image_id(&image).await {
            Ok(Some(_)) => {
                self.event(
                    "Pulled",
                    &format!("Container image {image:?} already present on machine"),
                    "Normal",
                )
                .await;
                Ok(())
            }
            Ok(None) => {
                self.event("Pulling", &format!("Pulling image {image:?}"), "Normal")
                    .await;
                let started = Instant::now();
                match self.cri.pull_image(&image).await {
                    Ok(_) => {
                        self.event(
                            "Pulled",
                            &format!(
                                "Successfully pulled image {image:?} in {:.3}s",
                                started.elapsed().as_secs_f64()
                            ),
                            "Normal",
                        )
                        .await;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        if let Err(e) = pulled {
            // ErrImagePull at first, then ImagePullBackOff while the next try waits.
            let first = slot.pull_failures == 0;
            self.event(
                "Failed",
                &format!("Failed to pull image {image:?}: {e:#}"),
                "Warning",
            )
            .await;
            self.event("Failed", "Error: ErrImagePull", "Warning").await;
            slot.waiting = Some((
                if first {
                    "ErrImagePull"
                } else {
                    "ImagePullBackOff"
                }
                .into(),
                format!("failed to pull image {image:?}: {e:#}"),
            ));
            slot.retry_at = Some(now + backoff(slot.pull_failures));
            slot.pull_failures += 1;
            self.event(
                "BackOff",
                &format!("Back-off pulling image {image:?}"),
                "Normal",
            )
            .await;
            self.event("Failed", "Error: ImagePullBackOff", "Warning")
                .await;
            return;
        }
        slot.pull_failures = 0;
        // Volumes once per pod; what a container needs from them and its env, per start.
        if self.volumes.is_none() {
            match crate::podspec::volumes(&self.client, self.pod, &self.cri.volume_root()).await {
                Ok(v) => *self.volumes = Some(v),
                Err(e) => {
                    slot.waiting = Some(("CreateContainerConfigError".into(), format!("{e:#}")));
                    return;
                }
            }
        }
        let ip = self.ip();
        let prepared = async {
            let envs = crate::podspec::env(&self.client, self.pod, &slot.spec, &ip).await?;
            let mounts = crate::podspec::mounts(
                &slot.spec,
                self.volumes.as_ref().expect("made above"),
                &crate::podspec::read_only_volumes(self.pod),
            )?;
            anyhow::Ok((envs, mounts))
        }
        .await;
        let (envs, mounts) = match prepared {
            Ok(p) => p,
            Err(e) => {
                slot.waiting = Some(("CreateContainerConfigError".into(), format!("{e:#}")));
                return;
            }
        };
        match self
            .cri
            .start_container(self.pod, &sb, &slot.spec, slot.restarts, envs, mounts)
            .await
        {
            Ok(id) => {
                slot.id = Some(id);
                slot.waiting = None;
                slot.retry_at = None;
                let started = Instant::now();
                let spec = &slot.spec;
                let probe = |p: &Option<k8s_openapi::api::core::v1::Probe>, initially: bool| {
                    p.as_ref()
                        .map(|p| crate::probe::Probe::new(p, spec, started, initially))
                };
                slot.startup = probe(&spec.startup_probe, false);
                slot.readiness = probe(&spec.readiness_probe, false);
                slot.liveness = probe(&spec.liveness_probe, true);
                self.event("Started", &format!("Started container {name}"), "Normal")
                    .await;
            }
            Err(e) => {
                slot.waiting = Some(("CreateContainerError".into(), format!("{e:#}")));
                self.event("Failed", &format!("Error: {e:#}"), "Warning")
                    .await;
            }
        }
    }

    /// Runs the container's due probes: until its startup probe passes, only that one (giving
    /// up restarts the container); then liveness (a failure restarts it) and readiness.
    async fn probe(&self, slot: &mut Slot, id: &str) {
        let name = slot.spec.name.clone();
        let ip = self.ip();
        if let Some(p) = slot.startup.as_mut().filter(|p| !p.ok) {
            if let Some(Err(why)) = p.tick(self.cri, id, &ip).await {
                self.event(
                    "Unhealthy",
                    &format!("Startup probe failed: {why}"),
                    "Warning",
                )
                .await;
                if p.exhausted() {
                    self.restart(
                        slot,
                        id,
                        &format!("Container {name} failed startup probe, will be restarted"),
                    )
                    .await;
                }
            }
            return;
        }
        if let Some(p) = slot.readiness.as_mut() {
            if let Some(Err(why)) = p.tick(self.cri, id, &ip).await {
                self.event(
                    "Unhealthy",
                    &format!("Readiness probe failed: {why}"),
                    "Warning",
                )
                .await;
            }
        }
        if let Some(p) = slot.liveness.as_mut() {
            if let Some(Err(why)) = p.tick(self.cri, id, &ip).await {
                self.event(
                    "Unhealthy",
                    &format!("Liveness probe failed: {why}"),
                    "Warning",
                )
                .await;
                if !p.ok {
                    self.restart(
                        slot,
                        id,
                        &format!("Container {name} failed liveness probe, will be restarted"),
                    )
                    .await;
                }
            }
        }
    }

    /// Stops a container that failed a probe; the restart policy and back-off bring it back.
    async fn restart(&self, slot: &Slot, id: &str, why: &str) {
        self.event("Killing", why, "Normal").await;
        let grace = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30);
        if let Err(e) = self.cri.stop_container(id, grace).await {
            tracing::warn!(container = slot.spec.name, error = %e, "stopping a container that failed a probe failed");
        }
    }
}

/// One container's status as the kubelet writes it (`waiting` overrides what the runtime says:
/// PodInitializing for containers waiting on init containers).
fn container_status(slot: &Slot, waiting: Option<&str>) -> ContainerStatus {
    let waiting_state = |reason: &str, message: Option<&String>| ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: message.cloned(),
        }),
        ..ContainerState::default()
    };
    let state = match (waiting, &slot.waiting, &slot.view) {
        (Some(reason), _, _) => waiting_state(reason, None),
        (None, Some((reason, message)), _) => waiting_state(reason, Some(message)),
        (None, None, Some(v)) if v.running() => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: time(v.started_at),
            }),
            ..ContainerState::default()
        },
        (None, None, Some(v)) if v.exited() => terminated(v),
        _ => waiting_state("ContainerCreating", None),
    };
    ContainerStatus {
        name: slot.spec.name.clone(),
        image: slot.spec.image.clone().unwrap_or_default(),
        image_id: slot
            .view
            .as_ref()
            .map(|v| v.image_ref.clone())
            .unwrap_or_default(),
        ready: slot.ready(),
        started: Some(slot.started()),
        restart_count: slot.restarts as i32,
        state: Some(state),
        last_state: Some(slot.last.clone().unwrap_or_default()),
        container_id: slot.id.as_ref().map(|id| format!("containerd://{id}")),
        ..ContainerStatus::default()
    }
}

/// Gives each condition of `status` its lastTransitionTime, as the kubelet's status manager
/// does: the time `before` has for a condition of the same type and status, else `now` (the
/// condition changed, or is new). Ready's time is when the pod became ready, which
/// minReadySeconds counts from.
fn stamp_transitions(status: &mut PodStatus, before: Option<&PodStatus>, now: &Time) {
    let earlier = before.and_then(|b| b.conditions.as_deref()).unwrap_or(&[]);
    for c in status.conditions.iter_mut().flatten() {
        let kept = earlier
            .iter()
            .find(|e| e.type_ == c.type_ && e.status == c.status)
            .and_then(|e| e.last_transition_time.clone());
        c.last_transition_time = Some(kept.unwrap_or_else(|| now.clone()));
    }
}

/// The pod's status as the kubelet writes it (its conditions' times are stamped by
/// [`stamp_transitions`]).
fn pod_status(
    cfg: &NodeConfig,
    sandbox: &Option<(String, String)>,
    inits: &[Slot],
    slots: &[Slot],
    started: &Time,
) -> PodStatus {
    let initialized = inits.iter().all(|s| s.exited() == Some(0));
    let init_failed = inits.iter().any(|s| s.exited().is_some_and(|c| c != 0));
    let waiting = (!initialized).then_some("PodInitializing");
    let statuses = slots.iter().map(|s| container_status(s, waiting)).collect();
    let init_statuses: Vec<ContainerStatus> =
        inits.iter().map(|s| container_status(s, None)).collect();
    let all_ready = initialized && !slots.is_empty() && slots.iter().all(Slot::ready);
    let exits: Vec<Option<i32>> = slots.iter().map(Slot::exited).collect();
    let all_done = !slots.is_empty() && exits.iter().all(Option::is_some);
    let phase = if init_failed {
        "Failed"
    } else if !initialized {
        "Pending"
    } else if all_done {
        if exits.iter().any(|c| *c != Some(0)) {
            "Failed"
        } else {
            "Succeeded"
        }
    } else if slots.iter().any(|s| s.view.is_some()) {
        "Running"
    } else {
        "Pending"
    };
    let cond = |type_: &str, ok: bool| PodCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        ..PodCondition::default()
    };
    let ip = sandbox
        .as_ref()
        .map(|(_, ip)| ip.clone())
        .filter(|ip| !ip.is_empty());
    PodStatus {
        phase: Some(phase.into()),
        conditions: Some(vec![
            cond("PodReadyToStartContainers", sandbox.is_some()),
            cond("Initialized", initialized),
            cond("Ready", all_ready),
            cond("ContainersReady", all_ready),
            cond("PodScheduled", true),
        ]),
        host_ip: Some(cfg.node_ip.clone()),
        host_ips: Some(vec![HostIP {
            ip: cfg.node_ip.clone(),
        }]),
        start_time: Some(started.clone()),
        container_statuses: Some(statuses),
        init_container_statuses: (!inits.is_empty()).then_some(init_statuses),
        pod_ips: ip.clone().map(|ip| vec![PodIP { ip }]),
        pod_ip: ip,
        ..PodStatus::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let at = |secs: i64| Time(Timestamp::from_second(secs).unwrap());
        let condition = |type_: &str, status: &str, time: Option<Time>| PodCondition {
            type_: type_.into(),
            status: status.into(),
            last_transition_time: time,
            ..PodCondition::default()
        };
        let conditions = |ready: &str, scheduled_at: Option<Time>| PodStatus {
            conditions: Some(vec![
                condition("Ready", ready, None),
                condition("PodScheduled", "True", scheduled_at),
            ]),
            ..PodStatus::default()
        };
        let times = |status: &PodStatus| -> Vec<Option<Time>> {
            status
                .conditions
                .iter()
                .flatten()
                .map(|c| c.last_transition_time.clone())
                .collect()
        };
        // The first status: the scheduler's time is kept, the others are now.
        let mut first = conditions("False", None);
        stamp_transitions(&mut first, Some(&conditions("", Some(at(0)))), &at(1));
        assert_eq!(times(&first), [Some(at(1)), Some(at(0))]);
        // Nothing changed: every time stays.
        let mut same = conditions("False", None);
        stamp_transitions(&mut same, Some(&first), &at(2));
        assert_eq!(times(&same), [Some(at(1)), Some(at(0))]);
        // Ready turned True: only its time moves.
        let mut ready = conditions("True", None);
        stamp_transitions(&mut ready, Some(&same), &at(3));
        assert_eq!(times(&ready), [Some(at(3)), Some(at(0))]);
    }
}
