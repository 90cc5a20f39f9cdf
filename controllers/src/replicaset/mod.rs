//! The ReplicaSet and ReplicationController controller: keep `spec.replicas` pods that match the
//! selector and name the set as their controller.
//!
//! A sync reads the set and the namespace's pods from the informers, adopts matching orphans and
//! releases owned pods that stopped matching, then creates pods from the template (in slow-start
//! batches of 1, 2, 4...) or deletes the surplus (unscheduled, then pending, then not-ready,
//! then the newest first), and writes the status. Expectations ([`Expectations`]) make a sync
//! wait until the informer has seen the pods the previous sync created or deleted, so a stale
//! cache never creates twice.

mod expectations;
mod rank;

use std::sync::Arc;
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::json::str_at as s;
use rkube_core::selector::LabelSelector;
use serde_json::{json, Value};

pub use expectations::Expectations;

use rkube_runtime::events::{Recorder, NORMAL, WARNING};
use rkube_runtime::informer::{key_of, Informer};
use rkube_runtime::queue::WorkQueue;

/// Most pods one sync creates or deletes (Kubernetes' burstReplicas).
const BURST: usize = 500;
/// Parallel syncs.
const WORKERS: usize = 4;

/// What differs between the two kinds this controller keeps.
#[derive(Debug, Clone, Copy)]
pub struct SetKind {
    pub kind: &'static str,
    pub api_version: &'static str,
    /// `/apis/apps/v1` or `/api/v1`.
    pub base: &'static str,
    pub plural: &'static str,
    pub component: &'static str,
}

pub const REPLICA_SET: SetKind = SetKind {
    kind: "ReplicaSet",
    api_version: "apps/v1",
    base: "/apis/apps/v1",
    plural: "replicasets",
    component: "replicaset-controller",
};

pub const REPLICATION_CONTROLLER: SetKind = SetKind {
    kind: "ReplicationController",
    api_version: "v1",
    base: "/api/v1",
    plural: "replicationcontrollers",
    component: "replication-controller",
};

pub struct Controller {
    kind: SetKind,
    sets: Arc<Informer>,
    pods: Arc<Informer>,
    client: LocalClient,
    queue: Arc<WorkQueue>,
    expectations: Arc<Expectations>,
    recorder: Recorder,
}

/// The controller owner reference of an object, if any: (kind, name, uid).
pub fn controller_of(o: &Value) -> Option<(&str, &str, &str)> {
    o.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)?
        .iter()
        .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
        .map(|r| (s(r, "/kind"), s(r, "/name"), s(r, "/uid")))
}

/// A set's selector as a metav1.LabelSelector (an RC's is a plain map).
fn selector(kind: &SetKind, set: &Value) -> Value {
    let sel = set
        .pointer("/spec/selector")
        .cloned()
        .unwrap_or(Value::Null);
    if kind.kind == "ReplicationController" {
        let labels = match sel {
            Value::Object(m) if !m.is_empty() => Value::Object(m),
            _ => set
                .pointer("/spec/template/metadata/labels")
                .cloned()
                .unwrap_or(json!({})),
        };
        json!({ "matchLabels": labels })
    } else {
        sel
    }
}

fn matches(selector: &Value, pod: &Value) -> bool {
    // An empty selector would match everything; Kubernetes' validation refuses it, and a
    // controller never claims every pod.
    let empty = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|m| m.is_empty())
        && selector
            .get("matchExpressions")
            .and_then(Value::as_array)
            .is_none_or(|e| e.is_empty());
    !empty
        && LabelSelector::from_json(selector)
            .matches(pod.pointer("/metadata/labels").and_then(Value::as_object))
}

fn is_active(pod: &Value) -> bool {
    let phase = s(pod, "/status/phase");
    phase != "Succeeded"
        && phase != "Failed"
        && pod.pointer("/metadata/deletionTimestamp").is_none()
}

pub fn is_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True")
        })
}

/// Ready for at least `min_ready` seconds at `now`.
pub fn is_available(pod: &Value, min_ready: i64, now: chrono::DateTime<chrono::Utc>) -> bool {
    if !is_ready(pod) {
        return false;
    }
    if min_ready <= 0 {
        return true;
    }
    let since = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| s(c, "/type") == "Ready"))
        .and_then(|c| c.get("lastTransitionTime"))
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    since.is_some_and(|t| (now - t.with_timezone(&chrono::Utc)).num_seconds() >= min_ready)
}

impl Controller {
    pub fn new(
        kind: SetKind,
        sets: Arc<Informer>,
        pods: Arc<Informer>,
        client: LocalClient,
    ) -> Arc<Controller> {
        let c = Arc::new(Controller {
            kind,
            sets: sets.clone(),
            pods: pods.clone(),
            recorder: Recorder::new(client.clone(), kind.component),
            client,
            queue: Arc::new(WorkQueue::new()),
            expectations: Arc::new(Expectations::default()),
        });
        let queue = c.queue.clone();
        sets.on_change(Box::new(move |_, new| {
            if let Some(n) = new {
                queue.add(&key_of(n));
            }
        }));
        let weak = Arc::downgrade(&c);
        pods.on_change(Box::new(move |old, new| {
            if let Some(c) = weak.upgrade() {
                c.pod_changed(old, new);
            }
        }));
        c
    }

    /// Enqueues the sets a pod change concerns, and counts it against expectations.
    fn pod_changed(&self, old: Option<&Value>, new: Option<&Value>) {
        let owner_key = |p: &Value| {
            controller_of(p)
                .filter(|(k, _, _)| *k == self.kind.kind)
                .map(|(_, name, _)| format!("{}/{name}", s(p, "/metadata/namespace")))
        };
        match (old, new) {
            (None, Some(p)) => {
                if let Some(k) = owner_key(p) {
                    self.expectations.creation_observed(&k);
                    self.queue.add(&k);
                } else {
                    self.enqueue_selecting(p);
                }
            }
            (Some(p), None) => {
                if let Some(k) = owner_key(p) {
                    self.expectations.deletion_observed(&k, &key_of(p));
                    self.queue.add(&k);
                }
            }
            (Some(o), Some(n)) => {
                let (ok, nk) = (owner_key(o), owner_key(n));
                if let Some(k) = &nk {
                    if n.pointer("/metadata/deletionTimestamp").is_some()
                        && o.pointer("/metadata/deletionTimestamp").is_none()
                    {
                        // Graceful deletion starts: as good as gone for the count.
                        self.expectations.deletion_observed(k, &key_of(n));
                    }
                    self.queue.add(k);
                }
                if ok != nk {
                    if let Some(k) = &ok {
                        self.queue.add(k);
                    }
                }
                if nk.is_none() || o.pointer("/metadata/labels") != n.pointer("/metadata/labels") {
                    self.enqueue_selecting(n);
                }
            }
            (None, None) => {}
        }
    }

    /// Every set in the pod's namespace whose selector matches it (orphans to adopt).
    fn enqueue_selecting(&self, pod: &Value) {
        let ns = s(pod, "/metadata/namespace");
        for set in self.sets.list(&format!("{ns}/")) {
            if matches(&selector(&self.kind, &set), pod) {
                self.queue.add(&key_of(&set));
            }
        }
    }

    /// Runs the workers until `stop`.
    pub fn run(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        rkube_runtime::queue::run_workers(
            self.kind.component,
            self.queue.clone(),
            WORKERS,
            vec![self.sets.clone(), self.pods.clone()],
            stop,
            move |key| {
                let c = c.clone();
                async move { c.sync(&key).await }
            },
        );
    }

    fn path(&self, ns: &str, name: &str) -> String {
        format!(
            "{}/namespaces/{ns}/{}/{name}",
            self.kind.base, self.kind.plural
        )
    }

    /// One sync of the set at `key`; returns when to look again, if the set asks for it
    /// (minReadySeconds).
    pub async fn sync(&self, key: &str) -> Result<Option<Duration>, ApiError> {
        let Some(set) = self.sets.get(key) else {
            self.expectations.forget(key);
            return Ok(None);
        };
        let ns = s(&set, "/metadata/namespace").to_string();
        let name = s(&set, "/metadata/name").to_string();
        let uid = s(&set, "/metadata/uid").to_string();
        let sel = selector(&self.kind, &set);
        let deleting = set.pointer("/metadata/deletionTimestamp").is_some();

        // Claim: adopt matching orphans, release owned pods that no longer match.
        let mut owned: Vec<Arc<Value>> = Vec::new();
        for pod in self.pods.list(&format!("{ns}/")) {
            let matching = matches(&sel, &pod);
            match controller_of(&pod) {
                Some((_, _, owner)) if owner == uid => {
                    if matching || deleting {
                        owned.push(pod);
                    } else {
                        self.release(&pod, &uid).await?;
                    }
                }
                Some(_) => {}
                None if matching && !deleting && is_active(&pod) => {
                    if let Some(adopted) = self.adopt(&set, &pod).await? {
                        owned.push(Arc::new(adopted));
                    }
                }
                None => {}
            }
        }
        let active: Vec<Arc<Value>> = owned.iter().filter(|p| is_active(p)).cloned().collect();

        if self.expectations.satisfied(key) && !deleting {
            let want = set
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(1)
                .max(0) as usize;
            if active.len() < want {
                self.create_pods(key, &set, want - active.len()).await;
            } else if active.len() > want {
                self.delete_pods(key, &set, &active, active.len() - want)
                    .await;
            }
        }
        self.write_status(&set, &owned).await?;
        let min_ready = set
            .pointer("/spec/minReadySeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let now = chrono::Utc::now();
        let waiting = active
            .iter()
            .any(|p| is_ready(p) && !is_available(p, min_ready, now));
        let _ = name;
        Ok((min_ready > 0 && waiting).then(|| Duration::from_secs(1)))
    }

    async fn adopt(&self, set: &Value, pod: &Value) -> Result<Option<Value>, ApiError> {
        let mut refs = pod
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        refs.push(json!({
            "apiVersion": self.kind.api_version,
            "kind": self.kind.kind,
            "name": s(set, "/metadata/name"),
            "uid": s(set, "/metadata/uid"),
            "controller": true,
            "blockOwnerDeletion": true,
        }));
        let patch = json!({"metadata": {
            "ownerReferences": refs,
            "resourceVersion": s(pod, "/metadata/resourceVersion"),
        }});
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            s(pod, "/metadata/namespace"),
            s(pod, "/metadata/name")
        );
        crate::ignore_gone(self.client.merge_patch(&path, &patch).await)
    }

    async fn release(&self, pod: &Value, uid: &str) -> Result<(), ApiError> {
        let refs: Vec<Value> = pod
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .map(|rs| rs.iter().filter(|r| s(r, "/uid") != uid).cloned().collect())
            .unwrap_or_default();
        let patch = json!({"metadata": {
            "ownerReferences": if refs.is_empty() { Value::Null } else { json!(refs) },
            "resourceVersion": s(pod, "/metadata/resourceVersion"),
        }});
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            s(pod, "/metadata/namespace"),
            s(pod, "/metadata/name")
        );
        crate::ignore_gone(self.client.merge_patch(&path, &patch).await).map(|_| ())
    }

    fn pod_from_template(&self, set: &Value) -> Value {
        let name = s(set, "/metadata/name");
        let template = set.pointer("/spec/template").cloned().unwrap_or(json!({}));
        let mut meta = serde_json::Map::new();
        meta.insert("generateName".into(), json!(format!("{name}-")));
        meta.insert("namespace".into(), json!(s(set, "/metadata/namespace")));
        for f in ["labels", "annotations", "finalizers"] {
            if let Some(v) = template.pointer(&format!("/metadata/{f}")) {
                meta.insert(f.into(), v.clone());
            }
        }
        meta.insert(
            "ownerReferences".into(),
            json!([{
                "apiVersion": self.kind.api_version,
                "kind": self.kind.kind,
                "name": name,
                "uid": s(set, "/metadata/uid"),
                "controller": true,
                "blockOwnerDeletion": true,
            }]),
        );
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": Value::Object(meta),
            "spec": template.get("spec").cloned().unwrap_or(json!({})),
        })
    }

    /// Creates `n` pods (at most a burst) in slow-start batches: 1, 2, 4... A batch with a
    /// failure stops the rest, which the expectations forget.
    async fn create_pods(&self, key: &str, set: &Value, n: usize) {
        let n = n.min(BURST);
        self.expectations.expect_creations(key, n as i64);
        let ns = s(set, "/metadata/namespace");
        let path = format!("/api/v1/namespaces/{ns}/pods");
        let pod = self.pod_from_template(set);
        let mut done = 0;
        let mut batch = 1;
        while done < n {
            let size = batch.min(n - done);
            let results =
                futures::future::join_all((0..size).map(|_| self.client.create(&path, &pod))).await;
            let mut failed = 0;
            for r in results {
                match r {
                    Ok(created) => {
                        let msg = format!("Created pod: {}", s(&created, "/metadata/name"));
                        self.recorder
                            .event(set, self.kind.kind, NORMAL, "SuccessfulCreate", &msg)
                            .await;
                    }
                    Err(e) => {
                        failed += 1;
                        self.expectations.creation_observed(key);
                        let msg = format!("Error creating: {}", e.message);
                        self.recorder
                            .event(set, self.kind.kind, WARNING, "FailedCreate", &msg)
                            .await;
                    }
                }
            }
            done += size;
            if failed > 0 {
                // The rest of this burst is not attempted: forget its expectations.
                for _ in done..n {
                    self.expectations.creation_observed(key);
                }
                return;
            }
            batch *= 2;
        }
    }

    async fn delete_pods(&self, key: &str, set: &Value, active: &[Arc<Value>], n: usize) {
        let n = n.min(BURST);
        let victims = rank::victims(active, n);
        self.expectations
            .expect_deletions(key, victims.iter().map(|p| key_of(p)).collect());
        for pod in victims {
            let pname = s(&pod, "/metadata/name");
            let path = format!(
                "/api/v1/namespaces/{}/pods/{pname}",
                s(&pod, "/metadata/namespace")
            );
            match self.client.delete(&path, None).await {
                Ok(_) => {
                    let msg = format!("Deleted pod: {pname}");
                    self.recorder
                        .event(set, self.kind.kind, NORMAL, "SuccessfulDelete", &msg)
                        .await;
                }
                Err(e) => {
                    self.expectations.deletion_observed(key, &key_of(&pod));
                    if e.code != 404 {
                        let msg = format!("Error deleting: {}", e.message);
                        self.recorder
                            .event(set, self.kind.kind, WARNING, "FailedDelete", &msg)
                            .await;
                    }
                }
            }
        }
    }

    async fn write_status(&self, set: &Value, owned: &[Arc<Value>]) -> Result<(), ApiError> {
        let sel = selector(&self.kind, set);
        let template_labels = set
            .pointer("/spec/template/metadata/labels")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let min_ready = set
            .pointer("/spec/minReadySeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let now = chrono::Utc::now();
        let active: Vec<&Arc<Value>> = owned.iter().filter(|p| is_active(p)).collect();
        let fully_labeled = active
            .iter()
            .filter(|p| {
                let labels = p.pointer("/metadata/labels").and_then(Value::as_object);
                template_labels
                    .iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            })
            .count();
        let ready = active.iter().filter(|p| is_ready(p)).count();
        let available = active
            .iter()
            .filter(|p| is_available(p, min_ready, now))
            .count();
        let _ = sel;
        let mut status = json!({
            "replicas": active.len(),
            "fullyLabeledReplicas": fully_labeled,
            "observedGeneration": set.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
        });
        // Kubernetes omits zero counts.
        if ready > 0 {
            status["readyReplicas"] = json!(ready);
        }
        if available > 0 {
            status["availableReplicas"] = json!(available);
        }
        if let Some(c) = set.pointer("/status/conditions") {
            status["conditions"] = c.clone();
        }
        if set.get("status") == Some(&status) {
            return Ok(());
        }
        let mut updated = set.clone();
        updated["status"] = status;
        let path = format!(
            "{}/status",
            self.path(s(set, "/metadata/namespace"), s(set, "/metadata/name"))
        );
        crate::ignore_gone(self.client.update(&path, &updated).await).map(|_| ())
    }
}
