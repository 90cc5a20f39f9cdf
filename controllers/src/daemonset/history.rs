//! A DaemonSet's rollout history: one ControllerRevision per template it has had, named
//! `<daemonset>-<hash>`, labelled with the template's labels and `controller-revision-hash`,
//! and holding as its data the strategic merge patch that puts that template back
//! (`{"spec":{"template":{..., "$patch":"replace"}}}`): what `kubectl rollout undo` sends as it
//! is. The current template's revision has the highest number; a template that comes back (an
//! undo) takes the next number again. Old revisions beyond revisionHistoryLimit that no live
//! pod runs are deleted, oldest first.

use std::collections::{BTreeMap, HashSet};

use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use rkube_core::meta::{controller_ref, name, namespace};
use serde_json::{json, Value};

use super::placement::HASH_LABEL;

/// The revision data of the DaemonSet's current template.
pub fn patch(ds: &DaemonSet) -> Value {
    let template = ds.spec.as_ref().map(|s| &s.template);
    let mut t = serde_json::to_value(template).unwrap_or(json!({}));
    if let Some(o) = t.as_object_mut() {
        o.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": t}})
}

pub fn collision_count(ds: &DaemonSet) -> i32 {
    ds.status
        .as_ref()
        .and_then(|s| s.collision_count)
        .unwrap_or(0)
}

/// The hash of the current template (and the collision count, so that a collision of names
/// is resolved by counting it).
pub fn hash(ds: &DaemonSet) -> String {
    let template = ds
        .spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default();
    crate::deployment::template_hash(&template, i64::from(collision_count(ds)))
}

pub fn data(r: &ControllerRevision) -> Option<&Value> {
    r.data.as_ref().map(|d| &d.0)
}

/// A new revision of the DaemonSet's current template.
pub fn snapshot(ds: &DaemonSet, hash: &str, revision: i64) -> ControllerRevision {
    let template_labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone());
    let mut labels: BTreeMap<String, String> = template_labels.unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(format!("{}-{hash}", name(&ds.metadata))),
            namespace: Some(namespace(&ds.metadata).to_string()),
            labels: Some(labels),
            annotations: ds.metadata.annotations.clone(),
            owner_references: Some(vec![controller_ref(ds)]),
            ..Default::default()
        },
        data: Some(RawExtension(patch(ds))),
        revision,
    }
}

/// The DaemonSet's revisions split: those holding the current template (newest first), and
/// the others.
pub fn split<'a>(
    ds: &DaemonSet,
    owned: &'a [ControllerRevision],
) -> (Vec<&'a ControllerRevision>, Vec<&'a ControllerRevision>) {
    let current = patch(ds);
    let (mut cur, old): (Vec<_>, Vec<_>) = owned.iter().partition(|r| data(r) == Some(&current));
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
        .filter(|r| {
            let hash = r
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(HASH_LABEL))
                .map_or("", String::as_str);
            !live_hashes.contains(hash)
        })
        .take(excess as usize)
        .collect()
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
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}}})
        );
        assert_ne!(hash(&ds("busybox:2")), h, "another template, another hash");
        let (cur, old) = split(&ds("busybox:2"), std::slice::from_ref(&r));
        assert!(cur.is_empty() && old.len() == 1);
        let (cur, old) = split(&d, std::slice::from_ref(&r));
        assert!(cur.len() == 1 && old.is_empty());
        assert_eq!(next_revision(&[&revision(2, "a"), &revision(5, "b")]), 6);
        assert_eq!(next_revision(&[]), 1);
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
