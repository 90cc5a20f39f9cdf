//! The PersistentVolume controller (kube-controller-manager's persistentvolume-binder, with
//! the pvc-protection and pv-protection controllers folded in), and the built-in local-path
//! provisioner ([`localpath`]).
//!
//! Two typed controllers share one context. A claim's reconcile binds it: the volume it names,
//! else the best available one (`rkube_core::volume::find_matching_volume`), else it waits for
//! its first consumer (WaitForFirstConsumer classes, until the scheduler names a node) or for
//! a provisioner, recording Kubernetes' events on the way; a bind writes the volume's
//! `claimRef` and Bound phase first, then the claim's `volumeName`, annotations and Bound
//! status, each step only when it is not done yet, so a reconcile cut short is finished by the
//! next. A volume's reconcile keeps its phase (Available, Bound, Released, Failed) and reclaims
//! it once its claim is gone: Retain keeps it Released, Delete deletes it (a local-path
//! volume; other plugins' volumes fail as in Kubernetes, which has no deleter for them).
//! Protection: a claim marked for deletion keeps `kubernetes.io/pvc-protection` while a pod
//! that is not finished uses it, a volume keeps `kubernetes.io/pv-protection` while Bound.

pub mod localpath;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_api::strategy::persistentvolume::PV_PROTECTION;
use rkube_api::strategy::persistentvolumeclaim::PVC_PROTECTION;
use rkube_api::strategy::storageclass::{BETA_DEFAULT_CLASS_ANNOTATION, DEFAULT_CLASS_ANNOTATION};
use rkube_core::meta::{key, name, namespace};
use rkube_core::path;
use rkube_core::volume::{
    access_modes_fit, bound_to, capacity, claim_class, find_matching_volume, pod_claims, requested,
    volume_class, MatchOn, BETA_STORAGE_PROVISIONER, BIND_COMPLETED, BOUND_BY_CONTROLLER,
    PROVISIONED_BY, SELECTED_NODE, STORAGE_PROVISIONER,
};
use serde_json::{json, Value};

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::store::Store;

const COMPONENT: &str = "persistentvolume-controller";
const WORKERS: usize = 2;
/// How often a claim that waits for a volume is looked at again without a change (the
/// binder's periodic resync in Kubernetes is 15 s).
const RESYNC: Duration = Duration::from_secs(15);

/// What both reconciles work with.
pub struct Binder {
    claims: Arc<Store<PersistentVolumeClaim>>,
    volumes: Arc<Store<PersistentVolume>>,
    classes: Arc<Store<StorageClass>>,
    pods: Arc<Store<Pod>>,
    nodes: Arc<Store<Node>>,
    client: LocalClient,
    recorder: Recorder,
    provisioner: Recorder,
    /// Claim key -> the volume this controller bound it to, for reconciles whose cache does
    /// not show the claim's `volumeName` yet (Kubernetes' assume cache).
    assumed: Mutex<HashMap<String, String>>,
}

/// Starts the binder (and the local-path provisioner) until `stop`.
pub fn start(
    claims: Arc<Store<PersistentVolumeClaim>>,
    volumes: Arc<Store<PersistentVolume>>,
    classes: Arc<Store<StorageClass>>,
    pods: Arc<Store<Pod>>,
    nodes: Arc<Store<Node>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let ctx = Arc::new(Binder {
        claims: claims.clone(),
        volumes: volumes.clone(),
        classes: classes.clone(),
        pods: pods.clone(),
        nodes,
        recorder: Recorder::new(client.clone(), COMPONENT),
        provisioner: Recorder::new(client.clone(), localpath::PROVISIONER),
        client,
        assumed: Mutex::new(HashMap::new()),
    });
    let pending = {
        let claims = claims.clone();
        move || -> Vec<String> {
            claims
                .list("")
                .iter()
                .filter(|c| c.spec.as_ref().is_none_or(|s| s.volume_name.is_none()))
                .map(|c| key(&c.metadata))
                .collect()
        }
    };
    let class_pending = pending.clone();
    let claim_controller = Controller::new("persistentvolume-binder-claims", claims.clone())
        .watches(&volumes, move |old, new| {
            // The claim a volume names; a volume that became available, every waiting claim.
            let mut keys: Vec<String> = [old, new]
                .into_iter()
                .flatten()
                .filter_map(|pv| pv.spec.as_ref()?.claim_ref.as_ref())
                .map(|r| {
                    format!(
                        "{}/{}",
                        r.namespace.as_deref().unwrap_or(""),
                        r.name.as_deref().unwrap_or("")
                    )
                })
                .collect();
            if new.is_some_and(|pv| pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_none())) {
                keys.extend(pending());
            }
            keys
        })
        .watches(&classes, move |_, _| class_pending())
        .watches(&pods, |old, new| {
            // A pod's claims: one that finished or went may free a claim being deleted.
            [old, new]
                .into_iter()
                .flatten()
                .flat_map(|p| {
                    pod_claims(p)
                        .into_iter()
                        .map(|c| format!("{}/{c}", namespace(&p.metadata)))
                })
                .collect()
        });
    claim_controller.run(
        WORKERS,
        stop.clone(),
        ctx.clone(),
        |c, ctx: Arc<Binder>| async move { ctx.sync_claim(&c).await },
    );
    let volume_controller =
        Controller::new("persistentvolume-binder-volumes", volumes).watches(&claims, |old, new| {
            [old, new]
                .into_iter()
                .flatten()
                .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
                .collect()
        });
    volume_controller.run(WORKERS, stop, ctx, |pv, ctx: Arc<Binder>| async move {
        ctx.sync_volume(&pv).await
    });
}

fn has_finalizer(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    f: &str,
) -> bool {
    meta.finalizers.iter().flatten().any(|x| x == f)
}

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    k: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(k).map(String::as_str)
}

fn phase_of_volume(pv: &PersistentVolume) -> &str {
    pv.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn phase_of_claim(c: &PersistentVolumeClaim) -> &str {
    c.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Why a volume a claim names cannot be bound to it, in the binder's words, or None.
pub fn mismatch(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> Option<&'static str> {
    if capacity(pv) < requested(claim) {
        return Some("requested PV is too small");
    }
    if volume_class(pv) != claim_class(claim) {
        return Some("storageClassName does not match");
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", |m| m.as_str()).to_string();
    if mode(pv.spec.as_ref().and_then(|s| s.volume_mode.as_ref()))
        != mode(claim.spec.as_ref().and_then(|s| s.volume_mode.as_ref()))
    {
        return Some("incompatible volumeMode");
    }
    if !access_modes_fit(claim, pv) {
        return Some("incompatible accessMode");
    }
    None
}

impl Binder {
    fn claims_api<'a>(&'a self, ns: &'a str) -> Objects<'a, PersistentVolumeClaim> {
        Objects::namespaced(&self.client, ns)
    }

    fn volumes_api(&self) -> Objects<'_, PersistentVolume> {
        Objects::namespaced(&self.client, "")
    }

    /// A merge patch of an object's status (a volume's, or a claim's).
    async fn patch_status<K: k8s_openapi::Resource>(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        status: Value,
    ) -> Result<(), ApiError> {
        let p = format!("{}/status", path::object::<K>(namespace(meta), name(meta)));
        ignore_gone(
            self.client
                .merge_patch(&p, &json!({"status": status}))
                .await,
        )?;
        Ok(())
    }

    /// Sets a volume's phase (with its transition time) unless it has it.
    async fn volume_phase(
        &self,
        pv: &PersistentVolume,
        phase: &str,
        message: Option<&str>,
    ) -> Result<(), ApiError> {
        let same_message = pv.status.as_ref().and_then(|s| s.message.as_deref()) == message;
        if phase_of_volume(pv) == phase && same_message {
            return Ok(());
        }
        let mut status = json!({"phase": phase, "message": message});
        if phase_of_volume(pv) != phase {
            status["lastPhaseTransitionTime"] = json!(now());
        }
        self.patch_status::<PersistentVolume>(&pv.metadata, status)
            .await
    }

    /// Removes a finalizer from an object at `path`, with its resourceVersion as precondition.
    async fn drop_finalizer(
        &self,
        path: &str,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        f: &str,
    ) -> Result<(), ApiError> {
        let left: Vec<&String> = meta
            .finalizers
            .iter()
            .flatten()
            .filter(|x| *x != f)
            .collect();
        let patch = json!({"metadata": {"finalizers": left,
                                        "resourceVersion": meta.resource_version}});
        ignore_gone(self.client.merge_patch(path, &patch).await)?;
        Ok(())
    }

    /// Whether a pod that has not finished uses the claim (pvc-protection's question).
    fn claim_in_use(&self, c: &PersistentVolumeClaim) -> bool {
        let claim = name(&c.metadata);
        self.pods
            .in_namespace(namespace(&c.metadata))
            .iter()
            .any(|p| {
                let finished = matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                );
                !finished && pod_claims(p).iter().any(|n| n == claim)
            })
    }

    async fn sync_claim(&self, c: &PersistentVolumeClaim) -> Result<Action, ApiError> {
        let claim_key = key(&c.metadata);
        if c.metadata.deletion_timestamp.is_some() {
            if has_finalizer(&c.metadata, PVC_PROTECTION) && !self.claim_in_use(c) {
                let p = path::object::<PersistentVolumeClaim>(
                    namespace(&c.metadata),
                    name(&c.metadata),
                );
                self.drop_finalizer(&p, &c.metadata, PVC_PROTECTION).await?;
            }
            self.assumed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&claim_key);
            return Ok(Action::await_change());
        }
        let named = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|n| !n.is_empty());
        let assumed = self
            .assumed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&claim_key)
            .cloned();
        match named.or(assumed) {
            None => self.sync_unbound(c).await,
            Some(volume) => self.sync_named(c, &volume).await,
        }
    }

    /// The default StorageClass: of the classes marked default, the newest (then the first
    /// name), as the DefaultStorageClass admission picks it.
    fn default_class(&self) -> Option<String> {
        self.classes
            .list("")
            .into_iter()
            .filter(|c| {
                let a = |k: &str| annotation(&c.metadata, k) == Some("true");
                a(DEFAULT_CLASS_ANNOTATION) || a(BETA_DEFAULT_CLASS_ANNOTATION)
            })
            .max_by(|a, b| {
                let at = |c: &StorageClass| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
                at(a)
                    .cmp(&at(b))
                    .then_with(|| name(&b.metadata).cmp(name(&a.metadata)))
            })
            .map(|c| name(&c.metadata).to_string())
    }

    /// A claim that names no volume yet: the best one, else what it waits for.
    async fn sync_unbound(&self, c: &PersistentVolumeClaim) -> Result<Action, ApiError> {
        // Retroactive default class: a claim made while no class was default gets the one
        // that is now (a claim with `storageClassName: ""` asked for none).
        let unset = c
            .spec
            .as_ref()
            .is_none_or(|s| s.storage_class_name.is_none())
            && annotation(&c.metadata, "volume.beta.kubernetes.io/storage-class").is_none();
        if unset {
            if let Some(class) = self.default_class() {
                let patch = json!({"spec": {"storageClassName": class}});
                let p = path::object::<PersistentVolumeClaim>(
                    namespace(&c.metadata),
                    name(&c.metadata),
                );
                ignore_gone(self.client.merge_patch(&p, &patch).await)?;
                return Ok(Action::await_change());
            }
        }
        let class_name = claim_class(c).to_string();
        let class = (!class_name.is_empty())
            .then(|| self.classes.get(&class_name))
            .flatten();
        let delay = class
            .as_ref()
            .and_then(|k| k.volume_binding_mode.as_deref())
            == Some("WaitForFirstConsumer");
        let volumes = self.volumes.list("");
        let on = MatchOn {
            node: None,
            delay_binding: delay,
        };
        if let Some(pv) = find_matching_volume(c, &volumes, &on) {
            let pv = pv.clone();
            return self.bind(c, &pv).await;
        }
        if phase_of_claim(c) != "Pending" {
            self.patch_status::<PersistentVolumeClaim>(&c.metadata, json!({"phase": "Pending"}))
                .await?;
        }
        let selected = annotation(&c.metadata, SELECTED_NODE).map(str::to_string);
        if delay && selected.is_none() {
            self.recorder
                .event_for(
                    c,
                    NORMAL,
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding",
                )
                .await;
            return Ok(Action::await_change());
        }
        if class_name.is_empty() {
            self.recorder
                .event_for(
                    c,
                    NORMAL,
                    "FailedBinding",
                    "no persistent volumes available for this claim and no storage class is set",
                )
                .await;
            return Ok(Action::requeue(RESYNC));
        }
        let Some(class) = class else {
            let msg = format!("storageclass.storage.k8s.io \"{class_name}\" not found");
            self.recorder
                .event_for(c, WARNING, "ProvisioningFailed", &msg)
                .await;
            return Ok(Action::await_change());
        };
        if class.provisioner == "kubernetes.io/no-provisioner" {
            let msg = format!("no volume plugin matched name: {}", class.provisioner);
            self.recorder
                .event_for(c, WARNING, "ProvisioningFailed", &msg)
                .await;
            return Ok(Action::requeue(RESYNC));
        }
        // Provisioning is asked of the class's provisioner through the claim's annotations.
        if annotation(&c.metadata, STORAGE_PROVISIONER) != Some(class.provisioner.as_str()) {
            let patch = json!({"metadata": {"annotations": {
                STORAGE_PROVISIONER: class.provisioner,
                BETA_STORAGE_PROVISIONER: class.provisioner,
            }}});
            let p =
                path::object::<PersistentVolumeClaim>(namespace(&c.metadata), name(&c.metadata));
            ignore_gone(self.client.merge_patch(&p, &patch).await)?;
        }
        let msg = format!("Waiting for a volume to be created either by the external provisioner '{}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered.", class.provisioner);
        self.recorder
            .event_for(c, NORMAL, "ExternalProvisioning", &msg)
            .await;
        if class.provisioner == localpath::PROVISIONER {
            return self.provision(c, &class, selected.as_deref()).await;
        }
        Ok(Action::requeue(RESYNC))
    }

    /// A claim that names a volume (by a user, or by a bind not finished).
    async fn sync_named(
        &self,
        c: &PersistentVolumeClaim,
        volume: &str,
    ) -> Result<Action, ApiError> {
        let Some(pv) = self.volumes.get(volume) else {
            if phase_of_claim(c) == "Bound" {
                self.patch_status::<PersistentVolumeClaim>(&c.metadata, json!({"phase": "Lost"}))
                    .await?;
                self.recorder
                    .event_for(
                        c,
                        WARNING,
                        "ClaimLost",
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
                    )
                    .await;
            }
            return Ok(Action::await_change());
        };
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        if claim_ref.is_none() {
            if let Some(why) = mismatch(c, &pv) {
                let msg = format!("Cannot bind to requested volume \"{volume}\": {why}");
                self.recorder
                    .event_for(c, WARNING, "VolumeMismatch", &msg)
                    .await;
                return Ok(Action::await_change());
            }
            return self.bind(c, &pv).await;
        }
        if bound_to(&pv, c) {
            return self.bind(c, &pv).await;
        }
        if phase_of_claim(c) == "Bound" {
            self.patch_status::<PersistentVolumeClaim>(&c.metadata, json!({"phase": "Lost"}))
                .await?;
            self.recorder
                .event_for(
                    c,
                    WARNING,
                    "ClaimMisbound",
                    "Two claims are bound to the same volume, this one is bound incorrectly",
                )
                .await;
        } else {
            let msg = format!("volume \"{volume}\" already bound to a different claim.");
            self.recorder
                .event_for(c, WARNING, "FailedBinding", &msg)
                .await;
        }
        Ok(Action::await_change())
    }

    /// Binds a claim and a volume, each step only if it is not done: the volume's claimRef,
    /// its Bound phase, the claim's volumeName and annotations, its Bound status.
    async fn bind(
        &self,
        c: &PersistentVolumeClaim,
        pv: &PersistentVolume,
    ) -> Result<Action, ApiError> {
        let (ns, claim) = (namespace(&c.metadata), name(&c.metadata));
        let volume = name(&pv.metadata).to_string();
        let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let complete_ref = claim_ref.is_some_and(|r| r.uid.as_deref() == c.metadata.uid.as_deref());
        if !complete_ref {
            let mut patch = json!({
                "metadata": {"resourceVersion": pv.metadata.resource_version},
                "spec": {"claimRef": {
                    "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                    "namespace": ns, "name": claim, "uid": c.metadata.uid,
                    "resourceVersion": c.metadata.resource_version,
                }},
            });
            if claim_ref.is_none() {
                patch["metadata"]["annotations"] = json!({BOUND_BY_CONTROLLER: "yes"});
            }
            let p = path::object::<PersistentVolume>("", &volume);
            if ignore_gone(self.client.merge_patch(&p, &patch).await)?.is_none() {
                // The volume moved meanwhile: look again once the cache has it.
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
        }
        self.assumed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key(&c.metadata), volume.clone());
        self.volume_phase(pv, "Bound", None).await?;
        let spec = c.spec.as_ref();
        let named = spec
            .and_then(|s| s.volume_name.as_deref())
            .filter(|n| !n.is_empty());
        let completed = annotation(&c.metadata, BIND_COMPLETED).is_some();
        if named != Some(volume.as_str()) || !completed {
            let mut annotations = json!({BIND_COMPLETED: "yes"});
            if named.is_none() {
                annotations[BOUND_BY_CONTROLLER] = json!("yes");
            }
            let patch = json!({"metadata": {"annotations": annotations},
                               "spec": {"volumeName": volume}});
            let p = path::object::<PersistentVolumeClaim>(ns, claim);
            if ignore_gone(self.client.merge_patch(&p, &patch).await)?.is_none() {
                return Ok(Action::requeue(Duration::from_millis(200)));
            }
        }
        let pv_spec = pv.spec.as_ref();
        let status = json!({
            "phase": "Bound",
            "accessModes": pv_spec.and_then(|s| s.access_modes.clone()),
            "capacity": pv_spec.and_then(|s| s.capacity.clone()),
        });
        let current = c.status.as_ref();
        let done = phase_of_claim(c) == "Bound"
            && current.and_then(|s| s.capacity.as_ref())
                == pv_spec.and_then(|s| s.capacity.as_ref())
            && current.and_then(|s| s.access_modes.as_ref())
                == pv_spec.and_then(|s| s.access_modes.as_ref());
        if !done {
            self.patch_status::<PersistentVolumeClaim>(&c.metadata, status)
                .await?;
        }
        Ok(Action::await_change())
    }

    async fn sync_volume(&self, pv: &PersistentVolume) -> Result<Action, ApiError> {
        if pv.metadata.deletion_timestamp.is_some()
            && has_finalizer(&pv.metadata, PV_PROTECTION)
            && phase_of_volume(pv) != "Bound"
        {
            let p = path::object::<PersistentVolume>("", name(&pv.metadata));
            self.drop_finalizer(&p, &pv.metadata, PV_PROTECTION).await?;
        }
        let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            self.volume_phase(pv, "Available", None).await?;
            return Ok(Action::await_change());
        };
        let uid = r.uid.as_deref().unwrap_or("");
        if uid.is_empty() {
            // Pre-bound by a user: available until its claim binds it.
            self.volume_phase(pv, "Available", None).await?;
            return Ok(Action::await_change());
        }
        let (ns, claim_name) = (
            r.namespace.as_deref().unwrap_or(""),
            r.name.as_deref().unwrap_or(""),
        );
        let mut claim = self.claims.get(&format!("{ns}/{claim_name}"));
        if claim
            .as_ref()
            .is_none_or(|c| c.metadata.uid.as_deref() != Some(uid))
        {
            // The cache may lag: the API decides before a volume is released.
            claim = match self.claims_api(ns).get(claim_name).await {
                Ok(c) => Some(Arc::new(c)),
                Err(e) if e.code == 404 => None,
                Err(e) => return Err(e),
            };
        }
        match claim.filter(|c| c.metadata.uid.as_deref() == Some(uid)) {
            None => self.reclaim(pv).await,
            Some(c) => {
                let named = c.spec.as_ref().and_then(|s| s.volume_name.as_deref());
                if named == Some(name(&pv.metadata)) {
                    self.volume_phase(pv, "Bound", None).await?;
                } else if named.is_some_and(|n| !n.is_empty())
                    && annotation(&pv.metadata, BOUND_BY_CONTROLLER).is_some()
                {
                    // The claim went to another volume: this one is free again.
                    let p = path::object::<PersistentVolume>("", name(&pv.metadata));
                    let patch = json!({"metadata": {"annotations": {BOUND_BY_CONTROLLER: null},
                                                    "resourceVersion": pv.metadata.resource_version},
                                       "spec": {"claimRef": null}});
                    ignore_gone(self.client.merge_patch(&p, &patch).await)?;
                }
                Ok(Action::await_change())
            }
        }
    }

    /// A volume whose claim is gone: Released, then its reclaim policy.
    async fn reclaim(&self, pv: &PersistentVolume) -> Result<Action, ApiError> {
        let policy = pv
            .spec
            .as_ref()
            .and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
            .unwrap_or("Retain");
        let volume = name(&pv.metadata).to_string();
        if phase_of_volume(pv) == "Failed" {
            return Ok(Action::await_change());
        }
        if phase_of_volume(pv) != "Released" {
            self.volume_phase(pv, "Released", None).await?;
        }
        match policy {
            "Delete" => {
                if pv.metadata.deletion_timestamp.is_some() {
                    return Ok(Action::await_change());
                }
                if annotation(&pv.metadata, PROVISIONED_BY) == Some(localpath::PROVISIONER) {
                    ignore_gone(self.volumes_api().delete(&volume).await)?;
                    return Ok(Action::await_change());
                }
                if annotation(&pv.metadata, PROVISIONED_BY).is_some() {
                    // Another provisioner's volume: it deletes it.
                    return Ok(Action::await_change());
                }
                let msg = format!("error getting deleter volume plugin for volume \"{volume}\": no deletable volume plugin matched");
                self.volume_phase(pv, "Failed", Some(&msg)).await?;
                self.recorder
                    .event_for(pv, WARNING, "VolumeFailedDelete", &msg)
                    .await;
            }
            "Recycle" => {
                let msg = "No recycler plugin found for the volume!";
                self.volume_phase(pv, "Failed", Some(msg)).await?;
                self.recorder
                    .event_for(pv, WARNING, "VolumeFailedRecycle", msg)
                    .await;
            }
            _ => {}
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn claim(size: &str, class: &str, modes: &[&str]) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                storage_class_name: Some(class.into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity(size.into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn volume(size: &str, class: &str, modes: &[&str]) -> PersistentVolume {
        PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                storage_class_name: Some(class.into()),
                capacity: Some([("storage".to_string(), Quantity(size.into()))].into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_named_volume_that_does_not_fit_says_why() {
        let rwo = &["ReadWriteOnce"];
        let cases = [
            (claim("1Gi", "a", rwo), volume("1Gi", "a", rwo), None),
            (
                claim("2Gi", "a", rwo),
                volume("1Gi", "a", rwo),
                Some("requested PV is too small"),
            ),
            (
                claim("1Gi", "a", rwo),
                volume("1Gi", "b", rwo),
                Some("storageClassName does not match"),
            ),
            (
                claim("1Gi", "a", &["ReadWriteMany"]),
                volume("1Gi", "a", rwo),
                Some("incompatible accessMode"),
            ),
        ];
        for (c, pv, want) in cases {
            assert_eq!(mismatch(&c, &pv), want);
        }
    }
}
