//! The Deployment controller: one ReplicaSet per pod template (named `<deployment>-<hash>`, the
//! hash also a `pod-template-hash` label on the set, its selector and its pods), rolled by the
//! RollingUpdate strategy within maxSurge and maxUnavailable ([`rolling`]) or by Recreate;
//! revisions in the `deployment.kubernetes.io/revision` annotation (so `kubectl rollout
//! history` and `undo` work: undo puts an old template back, whose ReplicaSet then becomes the
//! new one with the next revision); old sets beyond revisionHistoryLimit deleted; status and the
//! Available and Progressing conditions as `kubectl rollout status` reads them.

mod rolling;
mod status;

use std::sync::Arc;
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::json::int_at as int;
use rkube_core::json::str_at as s;
use rkube_core::selector::LabelSelector;
use serde_json::{json, Value};

use crate::ignore_gone;
use crate::replicaset::controller_of;
use rkube_runtime::events::{Recorder, NORMAL};
use rkube_runtime::informer::{key_of, Informer};
use rkube_runtime::queue::WorkQueue;

pub const HASH_LABEL: &str = "pod-template-hash";
pub const REVISION: &str = "deployment.kubernetes.io/revision";
const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const WORKERS: usize = 4;

fn revision(rs: &Value) -> i64 {
    s(
        rs,
        &format!("/metadata/annotations/{}", REVISION.replace('/', "~1")),
    )
    .parse()
    .unwrap_or(0)
}

/// The template without its pod-template-hash label: what two templates are compared by.
fn template_ignoring_hash(t: Option<&Value>) -> Value {
    let mut t = t.cloned().unwrap_or(json!({}));
    if let Some(l) = t
        .pointer_mut("/metadata/labels")
        .and_then(Value::as_object_mut)
    {
        l.remove(HASH_LABEL);
        if l.is_empty() {
            if let Some(m) = t.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("labels");
            }
        }
    }
    t
}

/// The pod-template-hash of a template: FNV-1a of its JSON and the collision count, its decimal
/// digits spelled in Kubernetes' alphabet without vowels (so it never spells a word).
pub fn template_hash(template: &Value, collisions: i64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let text = format!("{}{}", template_ignoring_hash(Some(template)), collisions);
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

pub struct Controller {
    deployments: Arc<Informer>,
    sets: Arc<Informer>,
    pods: Arc<Informer>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
    recorder: Recorder,
}

impl Controller {
    pub fn new(
        deployments: Arc<Informer>,
        sets: Arc<Informer>,
        pods: Arc<Informer>,
        client: LocalClient,
    ) -> Arc<Controller> {
        let c = Arc::new(Controller {
            deployments: deployments.clone(),
            sets: sets.clone(),
            pods: pods.clone(),
            recorder: Recorder::new(client.clone(), "deployment-controller"),
            client,
            queue: Arc::new(WorkQueue::new()),
        });
        let queue = c.queue.clone();
        deployments.on_change(Box::new(move |_, new| {
            if let Some(n) = new {
                queue.add(&key_of(n));
            }
        }));
        let weak = Arc::downgrade(&c);
        sets.on_change(Box::new(move |old, new| {
            if let Some(c) = weak.upgrade() {
                for rs in [old, new].into_iter().flatten() {
                    c.enqueue_owner(rs);
                }
            }
        }));
        // Recreate waits for the old pods to be gone.
        let weak = Arc::downgrade(&c);
        pods.on_change(Box::new(move |old, new| {
            let (Some(c), Some(p), None) = (weak.upgrade(), old, new) else {
                return;
            };
            if let Some((_, rs_name, _)) = controller_of(p) {
                let key = format!("{}/{rs_name}", s(p, "/metadata/namespace"));
                if let Some(rs) = c.sets.get(&key) {
                    c.enqueue_owner(&rs);
                }
            }
        }));
        c
    }

    fn enqueue_owner(&self, rs: &Value) {
        let ns = s(rs, "/metadata/namespace");
        match controller_of(rs) {
            Some(("Deployment", name, _)) => self.queue.add(&format!("{ns}/{name}")),
            Some(_) => {}
            None => {
                for d in self.deployments.list(&format!("{ns}/")) {
                    let sel = d.pointer("/spec/selector").cloned().unwrap_or(Value::Null);
                    if LabelSelector::from_json(&sel)
                        .matches(rs.pointer("/metadata/labels").and_then(Value::as_object))
                    {
                        self.queue.add(&key_of(&d));
                    }
                }
            }
        }
    }

    pub fn run(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        rkube_runtime::queue::run_workers(
            "deployment-controller",
            self.queue.clone(),
            WORKERS,
            vec![
                self.deployments.clone(),
                self.sets.clone(),
                self.pods.clone(),
            ],
            stop,
            move |key| {
                let c = c.clone();
                async move { c.sync(&key).await }
            },
        );
    }

    /// The deployment's ReplicaSets, after adopting matching orphans and releasing owned sets
    /// that stopped matching.
    async fn claim(&self, d: &Value) -> Result<Vec<Value>, ApiError> {
        let ns = s(d, "/metadata/namespace");
        let uid = s(d, "/metadata/uid");
        let sel = LabelSelector::from_json(d.pointer("/spec/selector").unwrap_or(&Value::Null));
        let mut out = Vec::new();
        for rs in self.sets.list(&format!("{ns}/")) {
            let matching = sel.matches(rs.pointer("/metadata/labels").and_then(Value::as_object));
            let path = rs_path(&rs);
            match controller_of(&rs) {
                Some((_, _, owner)) if owner == uid => {
                    if matching {
                        out.push(rs.as_ref().clone());
                    } else {
                        let patch = json!({"metadata": {"ownerReferences": null,
                            "resourceVersion": s(&rs, "/metadata/resourceVersion")}});
                        ignore_gone(self.client.merge_patch(&path, &patch).await)?;
                    }
                }
                None if matching && rs.pointer("/metadata/deletionTimestamp").is_none() => {
                    let patch = json!({"metadata": {"ownerReferences": [owner_ref(d)],
                        "resourceVersion": s(&rs, "/metadata/resourceVersion")}});
                    if let Some(adopted) =
                        ignore_gone(self.client.merge_patch(&path, &patch).await)?
                    {
                        out.push(adopted);
                    }
                }
                _ => {}
            }
        }
        Ok(out)
    }

    pub async fn sync(&self, key: &str) -> Result<Option<Duration>, ApiError> {
        let Some(d) = self.deployments.get(key) else {
            return Ok(None);
        };
        let d = d.as_ref().clone();
        if d.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(None);
        }
        let mut sets = self.claim(&d).await?;
        sets.sort_by(|a, b| {
            s(a, "/metadata/creationTimestamp")
                .cmp(s(b, "/metadata/creationTimestamp"))
                .then(s(a, "/metadata/name").cmp(s(b, "/metadata/name")))
        });
        let template = d.pointer("/spec/template");
        let wanted = template_ignoring_hash(template);
        let new_idx = sets
            .iter()
            .position(|rs| template_ignoring_hash(rs.pointer("/spec/template")) == wanted);
        let mut new_rs = new_idx.map(|i| sets.remove(i));
        let mut olds = sets;
        let replicas = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let paused = d.pointer("/spec/paused").and_then(Value::as_bool) == Some(true);
        let recreate = s(&d, "/spec/strategy/type") == "Recreate";
        let (surge, unavailable) = if recreate {
            (0, 0)
        } else {
            rolling::surge_and_unavailable(
                d.pointer("/spec/strategy/rollingUpdate/maxSurge")
                    .unwrap_or(&json!("25%")),
                d.pointer("/spec/strategy/rollingUpdate/maxUnavailable")
                    .unwrap_or(&json!("25%")),
                replicas,
            )
        };
        let mut created = None;
        if paused {
            // A paused deployment rolls nothing out; it only follows scaling of its current set.
            if let Some(rs) = &new_rs {
                if olds.iter().all(|o| int(o, "/spec/replicas") == 0) {
                    self.scale(&d, rs, replicas, surge).await?;
                }
            }
        } else if recreate {
            let mut old_pods_left = false;
            for old in &olds {
                if int(old, "/spec/replicas") > 0 {
                    self.scale(&d, old, 0, surge).await?;
                    old_pods_left = true;
                }
                let uid = s(old, "/metadata/uid");
                let running = self
                    .pods
                    .list(&format!("{}/", s(old, "/metadata/namespace")))
                    .iter()
                    .any(|p| {
                        controller_of(p).is_some_and(|(_, _, u)| u == uid)
                            && !matches!(s(p, "/status/phase"), "Succeeded" | "Failed")
                    });
                old_pods_left |= running;
            }
            if !old_pods_left {
                match &new_rs {
                    Some(rs) => self.scale(&d, rs, replicas, surge).await?,
                    None => {
                        let rs = self.create_new(&d, &olds, replicas, surge).await?;
                        created = Some(s(&rs, "/metadata/name").to_string());
                        new_rs = Some(rs);
                    }
                }
            }
        } else {
            // RollingUpdate: grow the new set within maxSurge...
            let all: i64 = olds
                .iter()
                .chain(new_rs.iter())
                .map(|r| int(r, "/spec/replicas"))
                .sum();
            match &new_rs {
                None => {
                    let size = rolling::new_rs_replicas(replicas, surge, all, 0);
                    let rs = self.create_new(&d, &olds, size, surge).await?;
                    created = Some(s(&rs, "/metadata/name").to_string());
                    new_rs = Some(rs);
                }
                Some(rs) => {
                    let current = int(rs, "/spec/replicas");
                    let size = if current > replicas {
                        replicas
                    } else {
                        rolling::new_rs_replicas(replicas, surge, all, current)
                    };
                    self.bump_revision(rs, &olds).await?;
                    if size != current {
                        self.scale(&d, rs, size, surge).await?;
                    }
                }
            }
            // ...then shrink the old ones within maxUnavailable.
            self.scale_down_old(&d, &mut olds, new_rs.as_ref(), replicas, surge, unavailable)
                .await?;
        }
        let complete = self
            .cleanup_and_status(&d, new_rs.as_ref(), &olds, replicas, unavailable, created)
            .await?;
        // Look again while waiting on availability (minReadySeconds) or the progress deadline.
        Ok((!complete && !paused).then(|| Duration::from_secs(1)))
    }

    async fn scale_down_old(
        &self,
        d: &Value,
        olds: &mut [Value],
        new_rs: Option<&Value>,
        replicas: i64,
        surge: i64,
        unavailable: i64,
    ) -> Result<(), ApiError> {
        let old_pods: i64 = olds.iter().map(|r| int(r, "/spec/replicas")).sum();
        if old_pods == 0 {
            return Ok(());
        }
        let new_spec = new_rs.map(|r| int(r, "/spec/replicas")).unwrap_or(0);
        let new_available = new_rs
            .map(|r| int(r, "/status/availableReplicas"))
            .unwrap_or(0);
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
            let spec = int(old, "/spec/replicas");
            let unhealthy = spec - int(old, "/status/availableReplicas");
            let cut = unhealthy.min(budget).max(0);
            if cut > 0 {
                self.scale(d, old, spec - cut, surge).await?;
                old["spec"]["replicas"] = json!(spec - cut);
                budget -= cut;
            }
        }
        // Then available ones, oldest set first, as long as enough stay available.
        let min_available = replicas - unavailable;
        let available: i64 = olds
            .iter()
            .map(|r| int(r, "/status/availableReplicas").min(int(r, "/spec/replicas")))
            .sum::<i64>()
            + new_available;
        let mut cut_total = (available - min_available).min(budget);
        for old in olds.iter_mut() {
            if cut_total <= 0 {
                break;
            }
            let spec = int(old, "/spec/replicas");
            let cut = spec.min(cut_total);
            if cut > 0 {
                self.scale(d, old, spec - cut, surge).await?;
                old["spec"]["replicas"] = json!(spec - cut);
                cut_total -= cut;
            }
        }
        Ok(())
    }

    /// Sets a ReplicaSet's size (and the annotations that say for which deployment size).
    async fn scale(&self, d: &Value, rs: &Value, to: i64, surge: i64) -> Result<(), ApiError> {
        let from = int(rs, "/spec/replicas");
        let desired = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let patch = json!({
            "metadata": {"annotations": {
                DESIRED: desired.to_string(),
                MAX_REPLICAS: (desired + surge).to_string(),
            }},
            "spec": {"replicas": to},
        });
        if from == to
            && s(
                rs,
                &format!("/metadata/annotations/{}", DESIRED.replace('/', "~1")),
            ) == desired.to_string()
        {
            return Ok(());
        }
        ignore_gone(self.client.merge_patch(&rs_path(rs), &patch).await)?;
        if from != to {
            let (dir, name) = (
                if to > from { "up" } else { "down" },
                s(rs, "/metadata/name"),
            );
            let msg = format!("Scaled {dir} replica set {name} from {from} to {to}");
            self.recorder
                .event(d, "Deployment", NORMAL, "ScalingReplicaSet", &msg)
                .await;
        }
        Ok(())
    }

    /// An existing set that becomes the new one again (a rollback) takes the next revision.
    async fn bump_revision(&self, rs: &Value, olds: &[Value]) -> Result<(), ApiError> {
        let max_old = olds.iter().map(revision).max().unwrap_or(0);
        if revision(rs) > max_old {
            return Ok(());
        }
        let patch = json!({"metadata": {"annotations": {REVISION: (max_old + 1).to_string()}}});
        ignore_gone(self.client.merge_patch(&rs_path(rs), &patch).await)?;
        Ok(())
    }

    async fn create_new(
        &self,
        d: &Value,
        olds: &[Value],
        size: i64,
        surge: i64,
    ) -> Result<Value, ApiError> {
        let ns = s(d, "/metadata/namespace");
        let dname = s(d, "/metadata/name");
        let collisions = int(d, "/status/collisionCount");
        let template = d.pointer("/spec/template").cloned().unwrap_or(json!({}));
        let hash = template_hash(&template, collisions);
        let mut template = template;
        rkube_api::value::set(
            &mut template,
            &["metadata", "labels", HASH_LABEL],
            json!(hash),
        );
        let mut selector = d.pointer("/spec/selector").cloned().unwrap_or(json!({}));
        rkube_api::value::set(&mut selector, &["matchLabels", HASH_LABEL], json!(hash));
        let mut labels = template
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        labels[HASH_LABEL] = json!(hash);
        let desired = d
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let next_revision = olds.iter().map(revision).max().unwrap_or(0) + 1;
        let mut spec = json!({"replicas": size, "selector": selector, "template": template});
        if let Some(m) = d.pointer("/spec/minReadySeconds") {
            spec["minReadySeconds"] = m.clone();
        }
        let rs = json!({
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": format!("{dname}-{hash}"),
                "namespace": ns,
                "labels": labels,
                "annotations": {
                    REVISION: next_revision.to_string(),
                    DESIRED: desired.to_string(),
                    MAX_REPLICAS: (desired + surge).to_string(),
                },
                "ownerReferences": [owner_ref(d)],
            },
            "spec": spec,
        });
        let path = format!("/apis/apps/v1/namespaces/{ns}/replicasets");
        match self.client.create(&path, &rs).await {
            Ok(created) => {
                if size > 0 {
                    let msg = format!(
                        "Scaled up replica set {} from 0 to {size}",
                        s(&created, "/metadata/name")
                    );
                    self.recorder
                        .event(d, "Deployment", NORMAL, "ScalingReplicaSet", &msg)
                        .await;
                }
                Ok(created)
            }
            Err(e) if e.code == 409 => {
                // A set of that name with another template: count the collision, which changes
                // the hash on the next sync.
                let mut updated = d.clone();
                updated["status"]["collisionCount"] = json!(collisions + 1);
                let spath = format!("/apis/apps/v1/namespaces/{ns}/deployments/{dname}/status");
                ignore_gone(self.client.update(&spath, &updated).await)?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes old sets beyond revisionHistoryLimit once they are empty, and writes the
    /// status; true when the rollout is complete.
    async fn cleanup_and_status(
        &self,
        d: &Value,
        new_rs: Option<&Value>,
        olds: &[Value],
        replicas: i64,
        unavailable: i64,
        created: Option<String>,
    ) -> Result<bool, ApiError> {
        let limit = d
            .pointer("/spec/revisionHistoryLimit")
            .and_then(Value::as_i64)
            .unwrap_or(10)
            .max(0) as usize;
        let mut empty: Vec<&Value> = olds
            .iter()
            .filter(|r| {
                int(r, "/spec/replicas") == 0
                    && int(r, "/status/replicas") == 0
                    && r.pointer("/metadata/deletionTimestamp").is_none()
            })
            .collect();
        if empty.len() > limit {
            empty.sort_by_key(|r| revision(r));
            for rs in &empty[..empty.len() - limit] {
                ignore_gone(self.client.delete(&rs_path(rs), None).await)?;
            }
        }
        let (st, complete) = status::compute(d, new_rs, olds, replicas, unavailable, created);
        if d.get("status") != Some(&st) {
            let mut updated = d.clone();
            updated["status"] = st;
            let path = format!(
                "/apis/apps/v1/namespaces/{}/deployments/{}/status",
                s(d, "/metadata/namespace"),
                s(d, "/metadata/name")
            );
            ignore_gone(self.client.update(&path, &updated).await)?;
        }
        // The deployment carries its new set's revision, as `kubectl describe` shows it.
        if let Some(rs) = new_rs {
            let rev = revision(rs);
            let current = s(
                d,
                &format!("/metadata/annotations/{}", REVISION.replace('/', "~1")),
            );
            if rev > 0 && current != rev.to_string() {
                let patch = json!({"metadata": {"annotations": {REVISION: rev.to_string()}}});
                ignore_gone(self.client.merge_patch(&deploy_path(d), &patch).await)?;
            }
        }
        Ok(complete)
    }
}

fn owner_ref(d: &Value) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": s(d, "/metadata/name"),
        "uid": s(d, "/metadata/uid"),
        "controller": true,
        "blockOwnerDeletion": true,
    })
}

fn rs_path(rs: &Value) -> String {
    format!(
        "/apis/apps/v1/namespaces/{}/replicasets/{}",
        s(rs, "/metadata/namespace"),
        s(rs, "/metadata/name")
    )
}

fn deploy_path(d: &Value) -> String {
    format!(
        "/apis/apps/v1/namespaces/{}/deployments/{}",
        s(d, "/metadata/namespace"),
        s(d, "/metadata/name")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_ignores_its_own_label_and_changes_with_collisions() {
        let t = json!({"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "a"}]}});
        let mut labelled = t.clone();
        labelled["metadata"]["labels"][HASH_LABEL] = json!("x");
        let h = template_hash(&t, 0);
        assert_eq!(h, template_hash(&labelled, 0));
        assert_ne!(h, template_hash(&t, 1));
        assert!(h
            .bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)));
        let mut other = t.clone();
        other["spec"]["containers"][0]["image"] = json!("b");
        assert_ne!(h, template_hash(&other, 0));
    }
}
