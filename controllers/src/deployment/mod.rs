//! The Deployment controller: one ReplicaSet per pod template (named `<deployment>-<hash>`, the
//! hash also a `pod-template-hash` label on the set, its selector and its pods), rolled by the
//! RollingUpdate strategy within maxSurge and maxUnavailable ([`rolling`]) or by Recreate;
//! revisions in the `deployment.kubernetes.io/revision` annotation (so `kubectl rollout
//! history` and `undo` work: undo puts an old template back, whose ReplicaSet then becomes the
//! new one with the next revision); old sets beyond revisionHistoryLimit deleted; status and the
//! Available and Progressing conditions as `kubectl rollout status` reads them.

mod rolling;
mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_of, controller_ref, key, name, namespace};
use rkube_core::selector::LabelSelector;
use serde_json::json;

use crate::ignore_gone;
use rkube_runtime::client::Objects;
use rkube_runtime::controller::{owner_key, Action, Controller};
use rkube_runtime::events::{Recorder, NORMAL};
use rkube_runtime::store::Store;

pub const HASH_LABEL: &str = "pod-template-hash";
pub const REVISION: &str = "deployment.kubernetes.io/revision";
const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const WORKERS: usize = 4;

fn annotation<'a>(meta: &'a ObjectMeta, name: &str) -> &'a str {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map_or("", String::as_str)
}

fn revision(rs: &ReplicaSet) -> i64 {
    annotation(&rs.metadata, REVISION).parse().unwrap_or(0)
}

/// `spec.replicas` of a ReplicaSet (0 when unset, as the rollout arithmetic counts it).
fn spec_replicas(rs: &ReplicaSet) -> i64 {
    i64::from(rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))
}

fn status_replicas(rs: &ReplicaSet) -> i64 {
    i64::from(rs.status.as_ref().map_or(0, |s| s.replicas))
}

fn available(rs: &ReplicaSet) -> i64 {
    i64::from(
        rs.status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0),
    )
}

fn set_spec_replicas(rs: &mut ReplicaSet, n: i64) {
    rs.spec.get_or_insert_with(Default::default).replicas = Some(n as i32);
}

/// `spec.replicas` of a Deployment (1 when unset).
fn desired(d: &Deployment) -> i64 {
    i64::from(d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1))
}

/// The template without its pod-template-hash label: what two templates are compared by.
fn template_ignoring_hash(t: Option<&PodTemplateSpec>) -> PodTemplateSpec {
    let mut t = t.cloned().unwrap_or_default();
    if let Some(m) = t.metadata.as_mut() {
        if let Some(l) = m.labels.as_mut() {
            l.remove(HASH_LABEL);
            if l.is_empty() {
                m.labels = None;
            }
        }
    }
    t
}

/// The pod-template-hash of a template: FNV-1a of its JSON and the collision count, its decimal
/// digits spelled in Kubernetes' alphabet without vowels (so it never spells a word).
pub fn template_hash(template: &PodTemplateSpec, collisions: i64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    // Through a JSON value with sorted keys, so the text does not depend on field order (and
    // stays what rkube hashed before serde_json kept insertion order).
    let mut json = serde_json::to_value(template_ignoring_hash(Some(template))).unwrap_or_default();
    rkube_core::json::sort_keys(&mut json);
    let text = format!("{json}{collisions}");
    let mut h: u32 = 0x811c9dc5;
    for b in text.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    h.to_string()
        .bytes()
        .map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char)
        .collect()
}

fn selector_of(d: &Deployment) -> LabelSelector {
    d.spec
        .as_ref()
        .map(|s| LabelSelector::from_selector(&s.selector))
        .unwrap_or_default()
}

/// The deployments a ReplicaSet concerns: its controller, or, for an orphan, every deployment
/// of its namespace that selects it (to adopt it).
fn deployments_of(deployments: &Store<Deployment>, rs: &ReplicaSet) -> Vec<String> {
    if controller_of(&rs.metadata).is_some() {
        return owner_key::<Deployment>(&rs.metadata).into_iter().collect();
    }
    deployments
        .in_namespace(namespace(&rs.metadata))
        .iter()
        .filter(|d| selector_of(d).matches_labels(rs.metadata.labels.as_ref()))
        .map(|d| key(&d.metadata))
        .collect()
}

/// The reconciler's context.
pub struct Deployments {
    sets: Arc<Store<ReplicaSet>>,
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    recorder: Recorder,
}

/// Starts the Deployment controller until `stop`.
pub fn start(
    deployments: Arc<Store<Deployment>>,
    sets: Arc<Store<ReplicaSet>>,
    pods: Arc<Store<Pod>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let orphans = {
        let deployments = deployments.clone();
        move |old: Option<&Arc<ReplicaSet>>, new: Option<&Arc<ReplicaSet>>| {
            [old, new]
                .into_iter()
                .flatten()
                .filter(|rs| controller_of(&rs.metadata).is_none())
                .flat_map(|rs| deployments_of(&deployments, rs))
                .collect()
        }
    };
    // Recreate waits for the old pods to be gone.
    let pod_gone = {
        let (deployments, sets) = (deployments.clone(), sets.clone());
        move |old: Option<&Arc<Pod>>, new: Option<&Arc<Pod>>| match (old, new) {
            (Some(p), None) => owner_key::<ReplicaSet>(&p.metadata)
                .and_then(|k| sets.get(&k))
                .map(|rs| deployments_of(&deployments, &rs))
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    };
    let controller = Controller::new("deployment-controller", deployments)
        .owns(&sets)
        .watches(&sets, orphans)
        .watches(&pods, pod_gone);
    let ctx = Arc::new(Deployments {
        sets,
        pods,
        recorder: Recorder::new(client.clone(), "deployment-controller"),
        client,
    });
    controller.run(WORKERS, stop, ctx, |d, ctx| async move {
        ctx.reconcile(&d).await
    });
}

impl Deployments {
    fn sets_in<'a>(&'a self, ns: &'a str) -> Objects<'a, ReplicaSet> {
        Objects::namespaced(&self.client, ns)
    }

    /// The deployment's ReplicaSets, after adopting matching orphans and releasing owned sets
    /// that stopped matching.
    async fn claim(&self, d: &Deployment) -> Result<Vec<ReplicaSet>, ApiError> {
        let ns = namespace(&d.metadata);
        let uid = d.metadata.uid.as_deref().unwrap_or("");
        let sel = selector_of(d);
        let mut out = Vec::new();
        for rs in self.sets.in_namespace(ns) {
            let matching = sel.matches_labels(rs.metadata.labels.as_ref());
            let rv = &rs.metadata.resource_version;
            match controller_of(&rs.metadata) {
                Some(r) if r.uid == uid => {
                    if matching {
                        out.push(rs.as_ref().clone());
                    } else {
                        let patch =
                            json!({"metadata": {"ownerReferences": null, "resourceVersion": rv}});
                        ignore_gone(
                            self.sets_in(ns)
                                .merge_patch(name(&rs.metadata), &patch)
                                .await,
                        )?;
                    }
                }
                None if matching && rs.metadata.deletion_timestamp.is_none() => {
                    let patch = json!({"metadata": {"ownerReferences": [controller_ref(d)],
                        "resourceVersion": rv}});
                    if let Some(adopted) = ignore_gone(
                        self.sets_in(ns)
                            .merge_patch(name(&rs.metadata), &patch)
                            .await,
                    )? {
                        out.push(adopted);
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }

    pub async fn reconcile(&self, d: &Deployment) -> Result<Action, ApiError> {
        if d.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let default_spec = DeploymentSpec::default();
        let spec = d.spec.as_ref().unwrap_or(&default_spec);
        let mut sets = self.claim(d).await?;
        sets.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
                .then(name(&a.metadata).cmp(name(&b.metadata)))
        });
        let wanted = template_ignoring_hash(Some(&spec.template));
        let new_idx = sets.iter().position(|rs| {
            template_ignoring_hash(rs.spec.as_ref().and_then(|s| s.template.as_ref())) == wanted
        });
        let mut new_rs = new_idx.map(|i| sets.remove(i));
        let mut olds = sets;
        let replicas = desired(d);
        let paused = spec.paused == Some(true);
        let strategy = spec.strategy.as_ref();
        let recreate = strategy.and_then(|s| s.type_.as_deref()) == Some("Recreate");
        let (surge, unavailable) = if recreate {
            (0, 0)
        } else {
            let update = strategy.and_then(|s| s.rolling_update.as_ref());
            let quarter = IntOrString::String("25%".into());
            rolling::surge_and_unavailable(
                update
                    .and_then(|r| r.max_surge.as_ref())
                    .unwrap_or(&quarter),
                update
                    .and_then(|r| r.max_unavailable.as_ref())
                    .unwrap_or(&quarter),
                replicas,
            )
        };
        let mut created = None;
        if paused {
            // A paused deployment rolls nothing out; it only follows scaling of its current set.
            if let Some(rs) = &new_rs {
                if olds.iter().all(|o| spec_replicas(o) == 0) {
                    self.scale(d, rs, replicas, surge).await?;
                }
            }
        } else if recreate {
            let mut old_pods_left = false;
            for old in &olds {
                if spec_replicas(old) > 0 {
                    self.scale(d, old, 0, surge).await?;
                    old_pods_left = true;
                }
                let uid = old.metadata.uid.as_deref().unwrap_or("");
                let running = self
                    .pods
                    .in_namespace(namespace(&old.metadata))
                    .iter()
                    .any(|p| {
                        controller_of(&p.metadata).is_some_and(|r| r.uid == uid)
                            && crate::pods::phase(p) != "Succeeded"
                            && crate::pods::phase(p) != "Failed"
                    });
                old_pods_left |= running;
            }
            if !old_pods_left {
                match &new_rs {
                    Some(rs) => self.scale(d, rs, replicas, surge).await?,
                    None => {
                        let rs = self.create_new(d, &olds, replicas, surge).await?;
                        created = Some(name(&rs.metadata).to_string());
                        new_rs = Some(rs);
                    }
                }
            }
        } else {
            // RollingUpdate: grow the new set within maxSurge...
            let all: i64 = olds.iter().chain(new_rs.iter()).map(spec_replicas).sum();
            match &new_rs {
                None => {
                    let size = rolling::new_rs_replicas(replicas, surge, all, 0);
                    let rs = self.create_new(d, &olds, size, surge).await?;
                    created = Some(name(&rs.metadata).to_string());
                    new_rs = Some(rs);
                }
                Some(rs) => {
                    let current = spec_replicas(rs);
                    let size = if current > replicas {
                        replicas
                    } else {
                        rolling::new_rs_replicas(replicas, surge, all, current)
                    };
                    self.bump_revision(rs, &olds).await?;
                    if size != current {
                        self.scale(d, rs, size, surge).await?;
                    }
                }
            }
            // ...then shrink the old ones within maxUnavailable.
            self.scale_down_old(d, &mut olds, new_rs.as_ref(), replicas, surge, unavailable)
                .await?;
        }
        let complete = self
            .cleanup_and_status(d, new_rs.as_ref(), &olds, replicas, unavailable, created)
            .await?;
        // Look again while waiting on availability (minReadySeconds) or the progress deadline.
        Ok(if !complete && !paused {
            Action::requeue(Duration::from_secs(1))
        } else {
            Action::await_change()
        })
    }

    async fn scale_down_old(
        &self,
        d: &Deployment,
        olds: &mut [ReplicaSet],
        new_rs: Option<&ReplicaSet>,
        replicas: i64,
        surge: i64,
        unavailable: i64,
    ) -> Result<(), ApiError> {
        let old_pods: i64 = olds.iter().map(spec_replicas).sum();
        if old_pods == 0 {
            return Ok(());
        }
        let new_spec = new_rs.map(spec_replicas).unwrap_or(0);
        let new_available = new_rs.map(available).unwrap_or(0);
        let all = old_pods + new_spec;
        let mut budget =
            rolling::old_scale_down_budget(replicas, unavailable, all, new_spec, new_available);
        if budget <= 0 {
            return Ok(());
        }
        // Unhealthy old pods go first: they serve nothing.
        for old in olds.iter_mut() {
            if budget <= 0 {
                break;
            }
            let spec = spec_replicas(old);
            let unhealthy = spec - available(old);
            let cut = unhealthy.min(budget).max(0);
            if cut > 0 {
                self.scale(d, old, spec - cut, surge).await?;
                set_spec_replicas(old, spec - cut);
                budget -= cut;
            }
        }
        // Then available ones, oldest set first, as long as enough stay available.
        let min_available = replicas - unavailable;
        let available_now: i64 = olds
            .iter()
            .map(|r| available(r).min(spec_replicas(r)))
            .sum::<i64>()
            + new_available;
        let mut cut_total = (available_now - min_available).min(budget);
        for old in olds.iter_mut() {
            if cut_total <= 0 {
                break;
            }
            let spec = spec_replicas(old);
            let cut = spec.min(cut_total);
            if cut > 0 {
                self.scale(d, old, spec - cut, surge).await?;
                set_spec_replicas(old, spec - cut);
                cut_total -= cut;
            }
        }
        Ok(())
    }

    /// Sets a ReplicaSet's size (and the annotations that say for which deployment size).
    async fn scale(
        &self,
        d: &Deployment,
        rs: &ReplicaSet,
        to: i64,
        surge: i64,
    ) -> Result<(), ApiError> {
        let from = spec_replicas(rs);
        let desired = desired(d);
        if from == to && annotation(&rs.metadata, DESIRED) == desired.to_string() {
            return Ok(());
        }
        let patch = json!({
            "metadata": {"annotations": {
                DESIRED: desired.to_string(),
                MAX_REPLICAS: (desired + surge).to_string(),
            }},
            "spec": {"replicas": to},
        });
        let (ns, rs_name) = (namespace(&rs.metadata), name(&rs.metadata));
        ignore_gone(self.sets_in(ns).merge_patch(rs_name, &patch).await)?;
        if from != to {
            let dir = if to > from { "up" } else { "down" };
            let msg = format!("Scaled {dir} replica set {rs_name} from {from} to {to}");
            self.recorder
                .event_for(d, NORMAL, "ScalingReplicaSet", &msg)
                .await;
        }
        Ok(())
    }

    /// An existing set that becomes the new one again (a rollback) takes the next revision.
    async fn bump_revision(&self, rs: &ReplicaSet, olds: &[ReplicaSet]) -> Result<(), ApiError> {
        let max_old = olds.iter().map(revision).max().unwrap_or(0);
        if revision(rs) > max_old {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": {REVISION: (max_old + 1).to_string()}}});
        let (ns, rs_name) = (namespace(&rs.metadata), name(&rs.metadata));
        ignore_gone(self.sets_in(ns).merge_patch(rs_name, &patch).await)?;
        Ok(())
    }

    async fn create_new(
        &self,
        d: &Deployment,
        olds: &[ReplicaSet],
        size: i64,
        surge: i64,
    ) -> Result<ReplicaSet, ApiError> {
        let (ns, dname) = (namespace(&d.metadata), name(&d.metadata));
        let spec = d.spec.clone().unwrap_or_default();
        let collisions = d
            .status
            .as_ref()
            .and_then(|s| s.collision_count)
            .unwrap_or(0);
        let mut template = spec.template;
        let hash = template_hash(&template, i64::from(collisions));
        let labels = template
            .metadata
            .get_or_insert_with(Default::default)
            .labels
            .get_or_insert_with(Default::default);
        labels.insert(HASH_LABEL.into(), hash.clone());
        let labels = labels.clone();
        let mut selector = spec.selector;
        selector
            .match_labels
            .get_or_insert_with(Default::default)
            .insert(HASH_LABEL.into(), hash.clone());
        let desired = desired(d);
        let next_revision = olds.iter().map(revision).max().unwrap_or(0) + 1;
        let rs = ReplicaSet {
            metadata: ObjectMeta {
                name: Some(format!("{dname}-{hash}")),
                namespace: Some(ns.to_string()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([
                    (REVISION.to_string(), next_revision.to_string()),
                    (DESIRED.to_string(), desired.to_string()),
                    (MAX_REPLICAS.to_string(), (desired + surge).to_string()),
                ])),
                owner_references: Some(vec![controller_ref(d)]),
                ..Default::default()
            },
            spec: Some(ReplicaSetSpec {
                replicas: Some(size as i32),
                selector,
                template: Some(template),
                min_ready_seconds: spec.min_ready_seconds,
            }),
            status: None,
        };
        match self.sets_in(ns).create(&rs).await {
            Ok(created) => {
                if size > 0 {
                    let msg = format!(
                        "Scaled up replica set {} from 0 to {size}",
                        name(&created.metadata)
                    );
                    self.recorder
                        .event_for(d, NORMAL, "ScalingReplicaSet", &msg)
                        .await;
                }
                Ok(created)
            }
            Err(e) if e.code == 409 => {
                // A set of that name with another template: count the collision, which changes
                // the hash on the next sync.
                let mut updated = d.clone();
                updated
                    .status
                    .get_or_insert_with(Default::default)
                    .collision_count = Some(collisions + 1);
                let deployments = Objects::<Deployment>::namespaced(&self.client, ns);
                ignore_gone(deployments.replace_status(dname, &updated).await)?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes old sets beyond revisionHistoryLimit once they are empty, and writes the
    /// status; true when the rollout is complete.
    async fn cleanup_and_status(
        &self,
        d: &Deployment,
        new_rs: Option<&ReplicaSet>,
        olds: &[ReplicaSet],
        replicas: i64,
        unavailable: i64,
        created: Option<String>,
    ) -> Result<bool, ApiError> {
        let (ns, dname) = (namespace(&d.metadata), name(&d.metadata));
        let limit = d
            .spec
            .as_ref()
            .and_then(|s| s.revision_history_limit)
            .unwrap_or(10)
            .max(0) as usize;
        let mut empty: Vec<&ReplicaSet> = olds
            .iter()
            .filter(|r| {
                spec_replicas(r) == 0
                    && status_replicas(r) == 0
                    && r.metadata.deletion_timestamp.is_none()
            })
            .collect();
        if empty.len() > limit {
            empty.sort_by_key(|r| revision(r));
            for rs in &empty[..empty.len() - limit] {
                let rs_ns = namespace(&rs.metadata);
                ignore_gone(self.sets_in(rs_ns).delete(name(&rs.metadata)).await)?;
            }
        }
        let deployments = Objects::<Deployment>::namespaced(&self.client, ns);
        let (st, complete) = status::compute(d, new_rs, olds, replicas, unavailable, created);
        if d.status.as_ref() != Some(&st) {
            let mut updated = d.clone();
            updated.status = Some(st);
            ignore_gone(deployments.replace_status(dname, &updated).await)?;
        }
        // The deployment carries its new set's revision, as `kubectl describe` shows it.
        if let Some(rs) = new_rs {
            let rev = revision(rs);
            if rev > 0 && annotation(&d.metadata, REVISION) != rev.to_string() {
                let patch = json!({"metadata": {"annotations": {REVISION: rev.to_string()}}});
                ignore_gone(deployments.merge_patch(dname, &patch).await)?;
            }
        }
        Ok(complete)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(image: &str) -> PodTemplateSpec {
        serde_json::from_value(json!({"metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c", "image": image}]}}))
        .unwrap()
    }

    #[test]
    fn the_hash_ignores_its_own_label_and_changes_with_collisions() {
        let t = template("a");
        let mut labelled = t.clone();
        labelled
            .metadata
            .as_mut()
            .and_then(|m| m.labels.as_mut())
            .unwrap()
            .insert(HASH_LABEL.into(), "x".into());
        let h = template_hash(&t, 0);
        assert_eq!(h, template_hash(&labelled, 0));
        assert_ne!(h, template_hash(&t, 1));
        assert!(h
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)));
        assert_ne!(h, template_hash(&template("b"), 0));
    }

    /// The hash is the one the JSON controller gave the same template, so a set made before
    /// the typed controller keeps its name.
    #[test]
    fn the_hash_is_that_of_the_templates_json() {
        assert_eq!(template_hash(&template("a"), 0), "6b4b7dc4f9");
    }
}
