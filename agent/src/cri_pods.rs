//! A pod's worker on the `cri` runtime: sandbox and containers made through the runtime, their
//! state read back every second and reported as the kubelet reports it (phase, conditions, pod
//! IP from the sandbox's network, containerStatuses with state, lastState, restartCount,
//! imageID, exit codes and reasons), exited containers restarted as restartPolicy says with
//! back-off (CrashLoopBackOff), images missing and unpullable reported as ErrImagePull /
//! ImagePullBackOff, and a deleted pod's containers stopped within its grace period.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::cri::{backoff, ContainerView, Cri};
use crate::join::Clients;
use crate::NodeConfig;

const TICK: Duration = Duration::from_secs(1);

fn s<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or("")
}

fn rfc3339(nanos: i64) -> Value {
    if nanos <= 0 {
        return Value::Null;
    }
    chrono::DateTime::from_timestamp(nanos / 1_000_000_000, (nanos % 1_000_000_000) as u32)
        .map(|t| json!(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
        .unwrap_or(Value::Null)
}

/// One spec container as this worker runs it.
struct Slot {
    spec: Value,
    id: Option<String>,
    restarts: u32,
    /// The last finished run, for lastState.
    last: Option<Value>,
    /// Why it is not running (ErrImagePull, CrashLoopBackOff...), with the message.
    waiting: Option<(String, String)>,
    /// When a back-off ends.
    retry_at: Option<Instant>,
    /// Image pulls failed in a row.
    pull_failures: u32,
    /// The container of the run before this one (kept for its logs).
    previous: Option<String>,
    readiness: Option<crate::probe::Probe>,
    liveness: Option<crate::probe::Probe>,
    view: Option<ContainerView>,
}

fn terminated(v: &ContainerView) -> Value {
    let reason = if !v.reason.is_empty() && v.reason != "Completed" && v.reason != "Error" {
        v.reason.clone()
    } else if v.exit_code == 0 {
        "Completed".into()
    } else {
        "Error".into()
    };
    json!({"terminated": {"exitCode": v.exit_code, "reason": reason,
        "startedAt": rfc3339(v.started_at), "finishedAt": rfc3339(v.finished_at),
        "containerID": format!("containerd://{}", v.id)}})
}

pub async fn worker(
    clients: Arc<Clients>,
    cfg: Arc<NodeConfig>,
    cri: Cri,
    mut rx: mpsc::UnboundedReceiver<Value>,
) {
    let Some(mut pod) = rx.recv().await else {
        return;
    };
    let uid = s(&pod, "/metadata/uid").to_string();
    let mut sandbox: Option<(String, String)> = None;
    let mut volumes: Option<std::collections::HashMap<String, std::path::PathBuf>> = None;
    let mut slots: Vec<Slot> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|cs| {
            cs.iter()
                .map(|c| Slot {
                    spec: c.clone(),
                    id: None,
                    restarts: 0,
                    last: None,
                    waiting: None,
                    retry_at: None,
                    pull_failures: 0,
                    previous: None,
                    readiness: None,
                    liveness: None,
                    view: None,
                })
                .collect()
        })
        .unwrap_or_default();
    // Containers left by an earlier run of the agent: adopted, not made twice.
    if let Ok(existing) = cri.containers_of(&uid).await {
        for slot in &mut slots {
            let name = s(&slot.spec, "/name");
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
    let started = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut last_status = Value::Null;
    let mut tick = tokio::time::interval(TICK);
    loop {
        if pod.pointer("/metadata/deletionTimestamp").is_some() {
            let grace = pod
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(30);
            if let Err(e) = cri.stop_pod(&uid, grace).await {
                tracing::warn!(pod = s(&pod, "/metadata/name"), error = %e, "stopping the pod failed; retrying");
                tokio::time::sleep(TICK).await;
                continue;
            }
            let _ = std::fs::remove_dir_all(cri.volume_root().join(&uid));
            crate::pods::finish_deletion(&clients, &cfg, &pod).await;
            return;
        }
        let phase = s(&pod, "/status/phase");
        if phase != "Succeeded" && phase != "Failed" {
            step(
                &cri,
                &clients.get(),
                &cfg.name,
                &pod,
                &mut sandbox,
                &mut volumes,
                &mut slots,
            )
            .await;
            let status = pod_status(&pod, &cfg, &sandbox, &slots, &started);
            if status != last_status {
                let api: Api<Pod> = Api::namespaced(clients.get(), s(&pod, "/metadata/namespace"));
                match api
                    .patch_status(
                        s(&pod, "/metadata/name"),
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"status": status})),
                    )
                    .await
                {
                    Ok(_) => last_status = status,
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

/// One pass: sandbox, images, containers started or restarted, states read.
async fn step(
    cri: &Cri,
    client: &kube::Client,
    node: &str,
    pod: &Value,
    sandbox: &mut Option<(String, String)>,
    volumes: &mut Option<std::collections::HashMap<String, std::path::PathBuf>>,
    slots: &mut [Slot],
) {
    if sandbox.is_none() {
        match cri.sandbox(pod).await {
            Ok(sb) => *sandbox = Some(sb),
            Err(e) => {
                let why = format!("{e:#}");
                // Once per distinct failure, as the kubelet's event would be counted.
                if slots.first().and_then(|s| s.waiting.as_ref()).map(|w| &w.1) != Some(&why) {
                    crate::pods::record(
                        client,
                        pod,
                        "FailedCreatePodSandBox",
                        &format!("Failed to create pod sandbox: {why}"),
                        "Warning",
                        node,
                    )
                    .await;
                }
                for slot in slots.iter_mut() {
                    slot.waiting = Some(("ContainerCreating".into(), why.clone()));
                }
                return;
            }
        }
    }
    let Some((sb, _)) = sandbox.clone() else {
        return;
    };
    let policy = match s(pod, "/spec/restartPolicy") {
        "" => "Always",
        p => p,
    };
    let now = Instant::now();
    for slot in slots.iter_mut() {
        if let Some(id) = &slot.id {
            match cri.container(id).await {
                Ok(v) => {
                    if v.exited() {
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
                                    s(&slot.spec, "/name"),
                                    s(pod, "/metadata/name")
                                ),
                            ));
                        }
                        if again && slot.retry_at.is_some_and(|t| now >= t) {
                            slot.last = Some(terminated(&v));
                            // The exited container stays for `kubectl logs --previous`; the
                            // one before it goes.
                            if let Some(old) = slot.previous.take() {
                                let _ = cri.remove_container(&old).await;
                            }
                            slot.previous = slot.id.take();
                            slot.view = None;
                            slot.restarts += 1;
                        } else {
                            slot.view = Some(v);
                        }
                    } else {
                        slot.waiting = None;
                        slot.retry_at = None;
                        let ip = sandbox
                            .as_ref()
                            .map(|(_, ip)| ip.clone())
                            .unwrap_or_default();
                        if v.running() {
                            probe(cri, client, node, pod, slot, &v.id, &ip).await;
                        }
                        slot.view = Some(v);
                    }
                }
                Err(_) => {
                    slot.id = None;
                    slot.view = None;
                }
            }
        }
        if slot.id.is_some() {
            continue;
        }
        if slot.retry_at.is_some_and(|t| now < t) {
            continue;
        }
        let image = s(&slot.spec, "/image").to_string();
        if let Err(e) = cri.ensure_image(&image).await {
            // ErrImagePull at first, then ImagePullBackOff while the next try waits.
            let first = slot.pull_failures == 0;
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
            continue;
        }
        slot.pull_failures = 0;
        // Volumes once per pod; what a container needs from them and its env, per start.
        if volumes.is_none() {
            match crate::podspec::volumes(client, pod, &cri.volume_root()).await {
                Ok(v) => *volumes = Some(v),
                Err(e) => {
                    slot.waiting = Some(("CreateContainerConfigError".into(), format!("{e:#}")));
                    continue;
                }
            }
        }
        let ip = sandbox
            .as_ref()
            .map(|(_, ip)| ip.clone())
            .unwrap_or_default();
        let prepared = async {
            let envs = crate::podspec::env(client, pod, &slot.spec, &ip).await?;
            let mounts = crate::podspec::mounts(&slot.spec, volumes.as_ref().expect("made above"))?;
            anyhow::Ok((envs, mounts))
        }
        .await;
        let (envs, mounts) = match prepared {
            Ok(p) => p,
            Err(e) => {
                slot.waiting = Some(("CreateContainerConfigError".into(), format!("{e:#}")));
                continue;
            }
        };
        match cri
            .start_container(pod, &sb, &slot.spec, slot.restarts, envs, mounts)
            .await
        {
            Ok(id) => {
                slot.id = Some(id);
                slot.waiting = None;
                slot.retry_at = None;
                let started = Instant::now();
                slot.readiness = slot
                    .spec
                    .get("readinessProbe")
                    .map(|p| crate::probe::Probe::new(p, started, false));
                slot.liveness = slot
                    .spec
                    .get("livenessProbe")
                    .map(|p| crate::probe::Probe::new(p, started, true));
            }
            Err(e) => {
                slot.waiting = Some(("CreateContainerError".into(), format!("{e:#}")));
            }
        }
    }
}

/// Runs the container's due probes: a failed liveness probe stops the container (the restart
/// policy and back-off bring it back), a readiness probe sets whether it is ready.
async fn probe(
    cri: &Cri,
    client: &kube::Client,
    node: &str,
    pod: &Value,
    slot: &mut Slot,
    id: &str,
    ip: &str,
) {
    let name = s(&slot.spec, "/name").to_string();
    if let Some(p) = slot.readiness.as_mut() {
        if let Some(Err(why)) = p.tick(cri, id, ip).await {
            crate::pods::record(
                client,
                pod,
                "Unhealthy",
                &format!("Readiness probe failed: {why}"),
                "Warning",
                node,
            )
            .await;
        }
    }
    if let Some(p) = slot.liveness.as_mut() {
        if let Some(Err(why)) = p.tick(cri, id, ip).await {
            crate::pods::record(
                client,
                pod,
                "Unhealthy",
                &format!("Liveness probe failed: {why}"),
                "Warning",
                node,
            )
            .await;
            if !p.ok {
                crate::pods::record(
                    client,
                    pod,
                    "Killing",
                    &format!("Container {name} failed liveness probe, will be restarted"),
                    "Normal",
                    node,
                )
                .await;
                let grace = pod
                    .pointer("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30);
                if let Err(e) = cri.stop_container(id, grace).await {
                    tracing::warn!(container = %name, error = %e, "stopping a container that failed its liveness probe failed");
                }
            }
        }
    }
}

/// The pod's status as the kubelet writes it.
fn pod_status(
    _pod: &Value,
    cfg: &NodeConfig,
    sandbox: &Option<(String, String)>,
    slots: &[Slot],
    started: &str,
) -> Value {
    let mut statuses = Vec::new();
    let mut all_running = !slots.is_empty();
    let mut all_done = !slots.is_empty();
    let mut any_failed = false;
    for slot in slots {
        let name = s(&slot.spec, "/name");
        let running = slot.view.as_ref().is_some_and(ContainerView::running)
            && slot.readiness.as_ref().is_none_or(|p| p.ok);
        let state = match (&slot.waiting, &slot.view) {
            (Some((reason, message)), _) => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            (None, Some(v)) if v.running() => {
                json!({"running": {"startedAt": rfc3339(v.started_at)}})
            }
            (None, Some(v)) if v.exited() => terminated(v),
            _ => json!({"waiting": {"reason": "ContainerCreating"}}),
        };
        if !running {
            all_running = false;
        }
        match slot.view.as_ref() {
            Some(v) if v.exited() && slot.waiting.is_none() => {
                if v.exit_code != 0 {
                    any_failed = true;
                }
            }
            _ => all_done = false,
        }
        let mut st = json!({
            "name": name, "image": s(&slot.spec, "/image"),
            "imageID": slot.view.as_ref().map(|v| v.image_ref.clone()).unwrap_or_default(),
            "ready": running, "started": running, "restartCount": slot.restarts,
            "state": state, "lastState": slot.last.clone().unwrap_or(json!({})),
        });
        if let Some(id) = &slot.id {
            st["containerID"] = json!(format!("containerd://{id}"));
        }
        statuses.push(st);
    }
    let phase = if all_done {
        if any_failed {
            "Failed"
        } else {
            "Succeeded"
        }
    } else if slots.iter().any(|s| s.view.is_some()) {
        "Running"
    } else {
        "Pending"
    };
    let cond = |t: &str, ok: bool| json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null});
    let ip = sandbox
        .as_ref()
        .map(|(_, ip)| ip.clone())
        .unwrap_or_default();
    let mut status = json!({
        "phase": phase,
        "conditions": [cond("PodReadyToStartContainers", sandbox.is_some()),
                       cond("Initialized", true), cond("Ready", all_running),
                       cond("ContainersReady", all_running), cond("PodScheduled", true)],
        "hostIP": cfg.node_ip, "hostIPs": [{"ip": cfg.node_ip}],
        "startTime": started,
        "containerStatuses": statuses,
    });
    if !ip.is_empty() {
        status["podIP"] = json!(ip);
        status["podIPs"] = json!([{"ip": ip}]);
    }
    status
}
