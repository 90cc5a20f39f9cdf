//! A StatefulSet pod's identity and storage: its name `<set>-<ordinal>`, hostname and
//! subdomain (the governing Service), the labels that name it and its revision, and the
//! PersistentVolumeClaims `<template>-<set>-<ordinal>` its claim templates give it, with the
//! owner references the PVC retention policy asks for.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::{Metadata, Resource};
use rkube_core::meta::{controller_ref, name, namespace};

use crate::history::HASH_LABEL;

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";

/// The ordinal of a pod named `<set>-<ordinal>` of this set, or None for any other name.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let (parent, n) = pod.rsplit_once('-')?;
    if parent != set || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

pub fn pod_name(set: &StatefulSet, ordinal: i32) -> String {
    format!("{}-{ordinal}", name(&set.metadata))
}

/// The revision a pod was made from (the ControllerRevision's name).
pub fn revision_of(pod: &Pod) -> &str {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(HASH_LABEL))
        .map_or("", String::as_str)
}

/// The claim a template gives the pod of `ordinal`.
pub fn claim_name(template: &PersistentVolumeClaim, set: &StatefulSet, ordinal: i32) -> String {
    format!(
        "{}-{}-{ordinal}",
        name(&template.metadata),
        name(&set.metadata)
    )
}

fn claim_templates(set: &StatefulSet) -> &[PersistentVolumeClaim] {
    set.spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_deref())
        .unwrap_or(&[])
}

/// The pod of `ordinal`, made from `template` (of the revision named `revision`).
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, ordinal: i32, revision: &str) -> Pod {
    let pod_name = pod_name(set, ordinal);
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels = tmeta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), pod_name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(HASH_LABEL.into(), revision.into());
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.hostname = Some(pod_name.clone());
    spec.subdomain = set
        .spec
        .as_ref()
        .and_then(|s| s.service_name.clone())
        .filter(|s| !s.is_empty());
    // The claims' volumes first, then the template's others (a template volume of a claim's
    // name gives way to the claim).
    let claims = claim_templates(set);
    let mut volumes: Vec<Volume> = claims
        .iter()
        .map(|c| Volume {
            name: name(&c.metadata).to_string(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(c, set, ordinal),
                read_only: Some(false),
            }),
            ..Default::default()
        })
        .collect();
    volumes.extend(
        spec.volumes
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|v| !claims.iter().any(|c| name(&c.metadata) == v.name)),
    );
    spec.volumes = (!volumes.is_empty()).then_some(volumes);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name),
            namespace: Some(namespace(&set.metadata).to_string()),
            labels: Some(labels),
            annotations: tmeta.annotations,
            finalizers: tmeta.finalizers,
            owner_references: Some(vec![controller_ref(set)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The claims the pod of `ordinal` uses, as they are created: the template's, named for the
/// pod, in the set's namespace, labelled also with the set's matchLabels.
pub fn claims_for(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let match_labels = set
        .spec
        .as_ref()
        .and_then(|s| s.selector.match_labels.clone())
        .unwrap_or_default();
    claim_templates(set)
        .iter()
        .map(|t| {
            let mut claim = t.clone();
            claim.metadata = ObjectMeta {
                name: Some(claim_name(t, set, ordinal)),
                namespace: Some(namespace(&set.metadata).to_string()),
                labels: Some({
                    let mut l: BTreeMap<String, String> =
                        t.metadata.labels.clone().unwrap_or_default();
                    l.extend(match_labels.clone());
                    l
                }),
                annotations: t.metadata.annotations.clone(),
                finalizers: t.metadata.finalizers.clone(),
                ..Default::default()
            };
            claim.status = None;
            claim
        })
        .collect()
}

/// A plain (not controller) owner reference, as the retention policy sets them.
fn owner_ref<K: Resource + Metadata<Ty = ObjectMeta>>(owner: &K) -> OwnerReference {
    OwnerReference {
        api_version: K::API_VERSION.to_string(),
        kind: K::KIND.to_string(),
        name: name(owner.metadata()).to_string(),
        uid: owner.metadata().uid.clone().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// The owner references a claim of `pod` should have under the set's
/// persistentVolumeClaimRetentionPolicy (Kubernetes' `updateClaimOwnerRefForSetAndPod`):
/// whenDeleted Delete makes the set an owner (its deletion takes the claim); whenScaled Delete
/// makes a pod beyond the replicas an owner (its deletion by the scale-down takes the claim);
/// Retain removes the reference. `pod` is None for a pod not created yet. Answers the new
/// list when it differs from the claim's.
pub fn retention_refs(
    claim: &PersistentVolumeClaim,
    set: &StatefulSet,
    pod: Option<&Pod>,
    scaled_down: bool,
) -> Option<Vec<OwnerReference>> {
    let policy = set
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let deleted = policy.and_then(|p| p.when_deleted.as_deref()) == Some("Delete");
    let scaled = policy.and_then(|p| p.when_scaled.as_deref()) == Some("Delete");
    let set_uid = set.metadata.uid.as_deref().unwrap_or("");
    let pod_uid = pod.and_then(|p| p.metadata.uid.as_deref()).unwrap_or("");
    let mut refs: Vec<OwnerReference> = claim.metadata.owner_references.clone().unwrap_or_default();
    let before = refs.clone();
    let want_set = deleted && !(scaled && scaled_down);
    let want_pod = scaled && scaled_down && pod.is_some();
    refs.retain(|r| {
        let is_set = !set_uid.is_empty() && r.uid == set_uid;
        let is_pod = !pod_uid.is_empty() && r.uid == pod_uid;
        (!is_set || want_set) && (!is_pod || want_pod)
    });
    if want_set && !refs.iter().any(|r| r.uid == set_uid) {
        refs.push(owner_ref(set));
    }
    if let (true, Some(pod)) = (want_pod, pod) {
        if !refs.iter().any(|r| r.uid == pod_uid) {
            refs.push(owner_ref(pod));
        }
    }
    (refs != before).then_some(refs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(extra: serde_json::Value) -> StatefulSet {
        let mut v = json!({"metadata": {"name": "web", "namespace": "ns", "uid": "s1"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}],
                             "volumes": [{"name": "www", "emptyDir": {}},
                                         {"name": "cache", "emptyDir": {}}]}},
                "volumeClaimTemplates": [{"metadata": {"name": "www", "labels": {"tier": "data"}},
                    "spec": {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "1Gi"}}}}]}});
        if let Some(extra) = extra.as_object() {
            for (k, x) in extra {
                v["spec"][k] = x.clone();
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn ordinals_come_from_the_sets_own_names() {
        let cases = [
            ("web-0", Some(0)),
            ("web-12", Some(12)),
            ("web-x", None),
            ("web-", None),
            ("webby-1", None),
            ("web-1-2", None),
            ("web", None),
            ("web--1", None),
        ];
        for (pod, want) in cases {
            assert_eq!(ordinal_of("web", pod), want, "{pod}");
        }
    }

    #[test]
    fn a_pod_has_a_stable_identity_and_its_claims() {
        let s = set(json!({}));
        let template = s.spec.as_ref().unwrap().template.clone();
        let pod = new_pod(&s, &template, 3, "web-abc");
        assert_eq!(pod.metadata.name.as_deref(), Some("web-3"));
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels[POD_NAME_LABEL], "web-3");
        assert_eq!(labels[POD_INDEX_LABEL], "3");
        assert_eq!(labels[HASH_LABEL], "web-abc");
        assert_eq!(labels["app"], "web");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("web-3"));
        assert_eq!(spec.subdomain.as_deref(), Some("nginx"));
        let volumes: Vec<(String, Option<String>)> = spec
            .volumes
            .unwrap()
            .into_iter()
            .map(|v| (v.name, v.persistent_volume_claim.map(|c| c.claim_name)))
            .collect();
        assert_eq!(
            volumes,
            [
                ("www".to_string(), Some("www-web-3".to_string())),
                ("cache".to_string(), None)
            ]
        );
        let claims = claims_for(&s, 3);
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].metadata.name.as_deref(), Some("www-web-3"));
        let labels = claims[0].metadata.labels.clone().unwrap();
        assert_eq!(
            (labels["tier"].as_str(), labels["app"].as_str()),
            ("data", "web")
        );
    }

    #[test]
    fn the_retention_policy_sets_owners_of_claims() {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "web-4", "uid": "p4"}})).unwrap();
        let claim = |owners: &[&str]| -> PersistentVolumeClaim {
            let refs: Vec<_> = owners
                .iter()
                .map(|u| json!({"apiVersion": "v1", "kind": "X", "name": "x", "uid": u}))
                .collect();
            serde_json::from_value(json!({"metadata": {"name": "www-web-4",
                                                       "ownerReferences": refs}}))
            .unwrap()
        };
        let uids = |r: Option<Vec<OwnerReference>>| {
            r.map(|r| r.into_iter().map(|r| r.uid).collect::<Vec<_>>())
        };
        let policy = |d: &str, s: &str| {
            set(json!({"persistentVolumeClaimRetentionPolicy":
                {"whenDeleted": d, "whenScaled": s}}))
        };
        // (policy, owners before, pod scaled down, owners after or None when unchanged)
        type Case<'a> = (StatefulSet, Vec<&'a str>, bool, Option<Vec<&'a str>>);
        let cases: Vec<Case> = vec![
            (policy("Retain", "Retain"), vec![], false, None),
            (
                policy("Retain", "Retain"),
                vec!["s1", "other"],
                true,
                Some(vec!["other"]),
            ),
            (policy("Delete", "Retain"), vec![], false, Some(vec!["s1"])),
            (policy("Delete", "Retain"), vec!["s1"], true, None),
            (policy("Retain", "Delete"), vec![], false, None),
            (policy("Retain", "Delete"), vec![], true, Some(vec!["p4"])),
            (policy("Retain", "Delete"), vec!["p4"], false, Some(vec![])),
            (policy("Delete", "Delete"), vec![], false, Some(vec!["s1"])),
            (
                policy("Delete", "Delete"),
                vec!["s1"],
                true,
                Some(vec!["p4"]),
            ),
        ];
        for (i, (s, before, down, after)) in cases.into_iter().enumerate() {
            let got = uids(retention_refs(&claim(&before), &s, Some(&pod), down));
            let want = after.map(|a| a.into_iter().map(String::from).collect::<Vec<_>>());
            assert_eq!(got, want, "case {i}");
        }
    }
}
