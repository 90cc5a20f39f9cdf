//! A workload's rollout history (DaemonSets' and StatefulSets'): one ControllerRevision per
//! template it has had, named `<owner>-<hash>`, labelled with the template's labels and
//! `controller-revision-hash`, and holding as its data the strategic merge patch that puts that
//! template back (`{"spec":{"template":{..., "$patch":"replace"}}}`): what `kubectl rollout undo`
//! sends as it is, and compares byte for byte with the patch it makes from the workload's
//! template (the template is in Go's shape for that, [`go_shape`]). The current template's revision has the highest number; a template that
//! comes back (an undo) takes the next number again. Old revisions beyond revisionHistoryLimit
//! that no live pod runs are deleted, oldest first.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as LabelSelectorSpec, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use k8s_openapi::NamespaceResourceScope;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::{controller_of, controller_ref, name, namespace};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::store::{Object, Store};
use serde::Serialize;
use serde_json::{json, Value};

/// The label that names a revision's hash (on revisions, and on the pods of a DaemonSet; a
/// StatefulSet's pods carry the revision's name in it).
pub const HASH_LABEL: &str = "controller-revision-hash";

/// A workload whose templates are kept as ControllerRevisions.
pub trait Versioned:
    Object + k8s_openapi::Resource<Scope = NamespaceResourceScope> + Serialize + Clone
{
    fn template(&self) -> Option<&PodTemplateSpec>;
    fn collision_count(&self) -> i32;
    /// The same object with `n` as its status' collision count.
    fn with_collision_count(&self, n: i32) -> Self;
    fn history_limit(&self) -> i32;
    fn selector(&self) -> Option<&LabelSelectorSpec>;
}

/// DaemonSets and StatefulSets keep their template, collision count and history limit in
/// fields of the same names.
macro_rules! versioned {
    ($($kind:ty),*) => {$(
        impl Versioned for $kind {
            fn template(&self) -> Option<&PodTemplateSpec> {
                self.spec.as_ref().map(|s| &s.template)
            }
            fn collision_count(&self) -> i32 {
                self.status
                    .as_ref()
                    .and_then(|s| s.collision_count)
                    .unwrap_or(0)
            }
            fn with_collision_count(&self, n: i32) -> Self {
                let mut counted = self.clone();
                counted.status.get_or_insert_with(Default::default).collision_count = Some(n);
                counted
            }
            fn history_limit(&self) -> i32 {
                self.spec
                    .as_ref()
                    .and_then(|s| s.revision_history_limit)
                    .unwrap_or(10)
            }
            fn selector(&self) -> Option<&LabelSelectorSpec> {
                self.spec.as_ref().map(|s| &s.selector)
            }
        }
    )*};
}

versioned!(DaemonSet, StatefulSet);

/// The revision data of the owner's current template, its template written as Kubernetes'
/// Go types write it ([`go_shape`]).
pub fn patch<K: Versioned>(owner: &K) -> Value {
    let mut t = serde_json::to_value(owner.template()).unwrap_or(json!({}));
    go_shape(&mut t);
    if let Some(o) = t.as_object_mut() {
        o.insert("$patch".into(), json!("replace"));
    }
    // kubectl builds its patch through Go maps, which encoding/json writes with sorted keys.
    rkube_core::json::sort_keys(&mut t);
    json!({"spec": {"template": t}})
}

/// Map-valued fields of a pod template (Go maps, left out when empty).
const MAP_FIELDS: &[&str] = &[
    "labels",
    "annotations",
    "nodeSelector",
    "matchLabels",
    "limits",
    "requests",
    "overhead",
    "volumeAttributes",
];

/// A pod template as Go's `encoding/json` writes Kubernetes' PodTemplateSpec: the metadata's
/// creationTimestamp is always there (null), so is each container's resources (`{}`), empty
/// lists and maps are left out (omitempty), and quantities are canonical (`1000m` is `1`). kubectl makes the patch it compares a
/// revision's data with (byte for byte, `rollout undo`) from the workload's template that
/// way, as Kubernetes' DaemonSet and StatefulSet controllers make revisions.
fn go_shape(template: &mut Value) {
    drop_empty(template);
    rkube_api::quantities::canonicalize_as("io.k8s.api.core.v1.PodTemplateSpec", template);
    let Some(t) = template.as_object_mut() else {
        return;
    };
    let meta = t.entry("metadata").or_insert_with(|| json!({}));
    if let Some(m) = meta.as_object_mut() {
        m.entry("creationTimestamp").or_insert(Value::Null);
    }
    let spec = t.entry("spec").or_insert_with(|| json!({}));
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        let containers = spec.get_mut(list).and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            if let Some(c) = c.as_object_mut() {
                c.entry("resources").or_insert_with(|| json!({}));
            }
        }
    }
}

/// Removes empty lists (but `containers`, which Go writes even empty) and empty maps of
/// [`MAP_FIELDS`], at any depth.
fn drop_empty(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.retain(|k, child| match child {
                Value::Array(a) => !a.is_empty() || k == "containers",
                Value::Object(m) => !m.is_empty() || !MAP_FIELDS.contains(&k.as_str()),
                _ => true,
            });
            o.values_mut().for_each(drop_empty);
        }
        Value::Array(a) => a.iter_mut().for_each(drop_empty),
        _ => {}
    }
}

/// Whether a revision holds the template of `current` (a [`patch`]); revisions written before
/// their templates took Go's shape hold it too.
fn holds(r: &ControllerRevision, current: &Value) -> bool {
    let Some(data) = data(r) else {
        return false;
    };
    if data == current {
        return true;
    }
    let mut data = data.clone();
    match data.pointer_mut("/spec/template") {
        Some(t) => go_shape(t),
        None => return false,
    }
    &data == current
}

/// The hash of the current template (and the collision count, so that a collision of names
/// is resolved by counting it).
pub fn hash<K: Versioned>(owner: &K) -> String {
    let template = owner.template().cloned().unwrap_or_default();
    crate::deployment::template_hash(&template, i64::from(owner.collision_count()))
}

pub fn data(r: &ControllerRevision) -> Option<&Value> {
    r.data.as_ref().map(|d| &d.0)
}

/// The hash a revision is labelled with.
pub fn hash_of(r: &ControllerRevision) -> &str {
    r.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .map_or("", String::as_str)
}

/// A new revision of the owner's current template.
pub fn snapshot<K: Versioned>(owner: &K, hash: &str, revision: i64) -> ControllerRevision {
    let template_labels = owner
        .template()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone());
    let mut labels: BTreeMap<String, String> = template_labels.unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    let meta = owner.metadata();
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", name(meta))),
            namespace: Some(namespace(meta).to_string()),
            labels: Some(labels),
            annotations: meta.annotations.clone(),
            owner_references: Some(vec![controller_ref(owner)]),
            ..Default::default()
        },
        data: Some(RawExtension(patch(owner))),
        revision,
    }
}

/// The owner's revisions split: those holding the current template (newest first), and the
/// others.
pub fn split<'a, K: Versioned>(
    owner: &K,
    owned: &'a [ControllerRevision],
) -> (Vec<&'a ControllerRevision>, Vec<&'a ControllerRevision>) {
    let current = patch(owner);
    let (mut cur, old): (Vec<_>, Vec<_>) = owned.iter().partition(|r| holds(r, &current));
    cur.sort_by_key(|r| std::cmp::Reverse(r.revision));
    (cur, old)
}

/// The number the current revision should have: one past every other revision's.
pub fn next_revision(old: &[&ControllerRevision]) -> i64 {
    old.iter().map(|r| r.revision).max().unwrap_or(0) + 1
}

/// The old revisions to delete: beyond `limit`, oldest first, none that a live pod runs.
pub fn to_prune<'a>(
    old: &[&'a ControllerRevision],
    limit: i64,
    live_hashes: &HashSet<&str>,
) -> Vec<&'a ControllerRevision> {
    let excess = old.len() as i64 - limit.max(0);
    if excess <= 0 {
        return Vec::new();
    }
    let mut by_age = old.to_vec();
    by_age.sort_by_key(|r| r.revision);
    by_age
        .into_iter()
        .filter(|r| !live_hashes.contains(hash_of(r)))
        .take(excess as usize)
        .collect()
}

/// The owner's current revision and the other (old) revisions, after recording the current
/// template as a revision with the highest number; an orphan revision the owner selects is
/// adopted. None when the owner must be looked at again: a revision of another template had
/// the name (the collision is counted in the owner's status, and the next reconcile hashes
/// anew), or an orphan of this template changed while it was adopted.
pub async fn record<K: Versioned>(
    revisions: &Store<ControllerRevision>,
    client: &LocalClient,
    owner: &K,
) -> Result<Option<(ControllerRevision, Vec<ControllerRevision>)>, ApiError> {
    let meta = owner.metadata();
    let ns = namespace(meta);
    let uid = meta.uid.as_deref().unwrap_or("");
    let objects = Objects::<ControllerRevision>::namespaced(client, ns);
    let selector = owner.selector().and_then(crate::pods::claiming_selector);
    let mut owned = Vec::new();
    for r in revisions.in_namespace(ns) {
        match controller_of(&r.metadata) {
            Some(c) if c.uid == uid => owned.push(r.as_ref().clone()),
            // An orphan the owner selects (its owner was deleted with the orphan policy) is
            // adopted, as Kubernetes' controllers claim their histories.
            None if selector
                .as_ref()
                .is_some_and(|s| s.matches_labels(r.metadata.labels.as_ref()))
                && meta.deletion_timestamp.is_none() =>
            {
                let mut refs = r.metadata.owner_references.clone().unwrap_or_default();
                refs.push(controller_ref(owner));
                let patch = json!({"metadata": {"ownerReferences": refs,
                    "resourceVersion": r.metadata.resource_version}});
                let adopted = objects.merge_patch(name(&r.metadata), &patch).await;
                if let Some(adopted) = ignore_gone(adopted)? {
                    owned.push(adopted);
                }
            }
            _ => {}
        }
    }
    let (current, old) = split(owner, &owned);
    let next = next_revision(&old);
    // Extra revisions of the current template (after a collision) are old ones now.
    let mut old: Vec<ControllerRevision> = old.into_iter().cloned().collect();
    old.extend(current.iter().skip(1).map(|r| (*r).clone()));
    if let Some(cur) = current.first() {
        let mut cur = (*cur).clone();
        if cur.revision < next {
            let patch = json!({"revision": next});
            if let Some(moved) =
                ignore_gone(objects.merge_patch(name(&cur.metadata), &patch).await)?
            {
                cur = moved;
            }
        }
        return Ok(Some((cur, old)));
    }
    let revision = snapshot(owner, &hash(owner), next);
    match objects.create(&revision).await {
        Ok(created) => Ok(Some((created, old))),
        Err(e) if e.code == 409 => {
            let existing = objects.get(name(&revision.metadata)).await?;
            let controller = controller_of(&existing.metadata).map(|c| c.uid.clone());
            if data(&revision).is_some_and(|d| holds(&existing, d)) {
                match controller {
                    // Created by an earlier reconcile; the cache has not shown it yet.
                    Some(c) if c == uid => return Ok(Some((existing, old))),
                    // Released by an owner of the same name deleted with the orphan policy,
                    // before the cache showed it: adopted.
                    None => {
                        let mut refs = existing
                            .metadata
                            .owner_references
                            .clone()
                            .unwrap_or_default();
                        refs.push(controller_ref(owner));
                        let patch = json!({"metadata": {"ownerReferences": refs,
                            "resourceVersion": existing.metadata.resource_version}});
                        let adopted = objects.merge_patch(name(&existing.metadata), &patch).await;
                        return Ok(ignore_gone(adopted)?.map(|a| (a, old)));
                    }
                    Some(_) => {}
                }
            }
            let counted = owner.with_collision_count(owner.collision_count() + 1);
            let owners = Objects::<K>::namespaced(client, ns);
            ignore_gone(owners.replace_status(name(meta), &counted).await)?;
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Deletes the old revisions beyond the owner's revisionHistoryLimit that no live pod runs.
pub async fn prune<K: Versioned>(
    client: &LocalClient,
    owner: &K,
    old: &[ControllerRevision],
    live_hashes: &HashSet<&str>,
) -> Result<(), ApiError> {
    let objects = Objects::<ControllerRevision>::namespaced(client, namespace(owner.metadata()));
    let old: Vec<&ControllerRevision> = old.iter().collect();
    for r in to_prune(&old, i64::from(owner.history_limit()), live_hashes) {
        ignore_gone(objects.delete(name(&r.metadata)).await)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(image: &str) -> DaemonSet {
        serde_json::from_value(json!({"metadata": {"name": "agent", "namespace": "ns",
                                                   "uid": "u1"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                     "template": {"metadata": {"labels": {"app": "agent"}},
                                  "spec": {"containers": [{"name": "c", "image": image}]}}}}))
        .unwrap()
    }

    fn revision(n: i64, hash: &str) -> ControllerRevision {
        serde_json::from_value(json!({"metadata": {"name": format!("agent-{hash}"),
                                                   "labels": {HASH_LABEL: hash}},
                                      "revision": n}))
        .unwrap()
    }

    #[test]
    fn a_revision_holds_the_patch_that_puts_its_template_back() {
        let d = ds("busybox:1");
        let h = hash(&d);
        let r = snapshot(&d, &h, 3);
        assert_eq!(
            r.metadata.name.as_deref(),
            Some(format!("agent-{h}").as_str())
        );
        assert_eq!(r.revision, 3);
        let labels = r.metadata.labels.clone().unwrap();
        assert_eq!(
            (labels["app"].as_str(), labels[HASH_LABEL].as_str()),
            ("agent", h.as_str())
        );
        assert_eq!(
            data(&r).unwrap(),
            &json!({"spec": {"template": {"$patch": "replace",
                "metadata": {"creationTimestamp": null, "labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1",
                                         "resources": {}}]}}}})
        );
        // Written as Go writes it: keys sorted, creationTimestamp and resources always there.
        assert_eq!(
            serde_json::to_string(data(&r).unwrap()).unwrap(),
            r#"{"spec":{"template":{"$patch":"replace","metadata":{"creationTimestamp":null,"labels":{"app":"agent"}},"spec":{"containers":[{"image":"busybox:1","name":"c","resources":{}}]}}}}"#
        );
        assert_ne!(hash(&ds("busybox:2")), h, "another template, another hash");
        let (cur, old) = split(&ds("busybox:2"), std::slice::from_ref(&r));
        assert!(cur.is_empty() && old.len() == 1);
        let (cur, old) = split(&d, std::slice::from_ref(&r));
        assert!(cur.len() == 1 && old.is_empty());
        // A revision written before templates took Go's shape still holds its template.
        let mut earlier = r.clone();
        earlier.data = Some(RawExtension(
            json!({"spec": {"template": {"$patch": "replace",
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "c", "image": "busybox:1", "args": []}]}}}}),
        ));
        let (cur, _) = split(&d, std::slice::from_ref(&earlier));
        assert_eq!(cur.len(), 1);
        assert_eq!(next_revision(&[&revision(2, "a"), &revision(5, "b")]), 6);
        assert_eq!(next_revision(&[]), 1);
    }

    #[test]
    fn revision_data_has_canonical_quantities() {
        let mut d = ds("busybox:1");
        let resources = json!({"requests": {"cpu": "1000m", "memory": "1024Mi"},
                               "limits": {"cpu": "0.5", "memory": "1.5Gi"}});
        let template = d.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
        template.containers[0].resources = Some(serde_json::from_value(resources).unwrap());
        template.overhead = Some(serde_json::from_value(json!({"cpu": "250000u"})).unwrap());
        let p = patch(&d);
        let spec = &p["spec"]["template"]["spec"];
        assert_eq!(
            spec["containers"][0]["resources"],
            json!({"requests": {"cpu": "1", "memory": "1Gi"},
                   "limits": {"cpu": "500m", "memory": "1536Mi"}})
        );
        assert_eq!(spec["overhead"], json!({"cpu": "250m"}));
    }

    #[test]
    fn old_revisions_beyond_the_limit_go_oldest_first_unless_a_pod_runs_them() {
        let rs: Vec<ControllerRevision> = (1..=5).map(|n| revision(n, &format!("h{n}"))).collect();
        let old: Vec<&ControllerRevision> = rs.iter().rev().collect();
        let names =
            |v: Vec<&ControllerRevision>| -> Vec<i64> { v.iter().map(|r| r.revision).collect() };
        // (limit, hashes live pods run, revisions pruned)
        let cases: &[(i64, &[&str], &[i64])] = &[
            (10, &[], &[]),
            (5, &[], &[]),
            (3, &[], &[1, 2]),
            (3, &["h1"], &[2, 3]),
            (0, &["h4"], &[1, 2, 3, 5]),
        ];
        for (limit, live, want) in cases {
            let live: HashSet<&str> = live.iter().copied().collect();
            assert_eq!(names(to_prune(&old, *limit, &live)), *want, "limit {limit}");
        }
    }
}
