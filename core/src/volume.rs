//! Persistent volumes as the PV binder and the scheduler's volume binding both read them:
//! the annotations they exchange, a claim's and a volume's class, whether a volume's node
//! affinity admits a node, and which available volume suits a claim (Kubernetes'
//! `FindMatchingVolume`: the pre-bound one, else of the claim's class, with every access
//! mode the claim asks, matching its selector, at least its size, the fewest access modes
//! and then the smallest size first).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, Pod, VolumeNodeAffinity,
};

use crate::quantity::{parse_quantity, Nanos};
use crate::selector::LabelSelector;

/// On a claim and a volume: the binding was completed by the binder.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// On a claim and a volume: the binder (not a user) chose the other side.
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// On a volume: the provisioner that made it.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// On a claim: the provisioner asked to make its volume (and its beta twin).
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// On a claim: the node the scheduler chose for its first consumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// On a local-path volume: the node it lives on (Rancher's local-path provisioner's name).
pub const LOCAL_PATH_NODE: &str = "local.path.provisioner/selected-node";
/// Held on a local-path volume until its node's agent removed the directory.
pub const LOCAL_PATH_CLEANUP: &str = "local-path.rkube.io/directory";
/// The Node annotation where an agent says under which directory its local-path volumes live.
pub const LOCAL_PATH_DIR: &str = "local-path.rkube.io/dir";
/// The beta annotations that name a class instead of `storageClassName`.
const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// The claims a pod's volumes name.
pub fn pod_claims(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.clone())
        .collect()
}

/// A claim's class: `storageClassName`, else the beta annotation, else "".
pub fn claim_class(claim: &PersistentVolumeClaim) -> &str {
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BETA_CLASS))
        .map(String::as_str)
        .or_else(|| claim.spec.as_ref()?.storage_class_name.as_deref())
        .unwrap_or("")
}

/// A volume's class, read as a claim's.
pub fn volume_class(pv: &PersistentVolume) -> &str {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BETA_CLASS))
        .map(String::as_str)
        .or_else(|| pv.spec.as_ref()?.storage_class_name.as_deref())
        .unwrap_or("")
}

/// The storage a claim requests.
pub fn requested(claim: &PersistentVolumeClaim) -> Nanos {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0)
}

/// The storage a volume holds.
pub fn capacity(pv: &PersistentVolume) -> Nanos {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| parse_quantity(&q.0))
        .unwrap_or(0)
}

fn volume_modes(pv: &PersistentVolume) -> &[String] {
    pv.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or(&[])
}

/// Whether the volume offers every access mode the claim asks for.
pub fn access_modes_fit(claim: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
    let have = volume_modes(pv);
    claim
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or(&[])
        .iter()
        .all(|m| have.contains(m))
}

fn claim_volume_mode(claim: &PersistentVolumeClaim) -> &str {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem")
}

fn volume_mode(pv: &PersistentVolume) -> &str {
    pv.spec
        .as_ref()
        .and_then(|s| s.volume_mode.as_deref())
        .unwrap_or("Filesystem")
}

/// Whether the volume's `claimRef` names this claim (by namespace and name, and by uid when
/// it has one).
pub fn bound_to(pv: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    let Some(r) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return false;
    };
    r.name.as_deref() == claim.metadata.name.as_deref()
        && r.namespace.as_deref() == claim.metadata.namespace.as_deref()
        && r.uid
            .as_deref()
            .is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_deref())
}

/// Whether a node (its name and labels) satisfies a volume's required node affinity; a
/// volume without one is reachable from every node.
pub fn node_affinity_admits(
    affinity: Option<&VolumeNodeAffinity>,
    node: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(required) = affinity.and_then(|a| a.required.as_ref()) else {
        return true;
    };
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        LabelSelector::from_node_selector_requirements(exprs).matches_labels(labels)
            && LabelSelector::from_node_selector_requirements(fields)
                .matches_with(|k| (k == "metadata.name").then_some(node))
    })
}

/// Where a match is looked for: a node (the scheduler's question, access modes checked and
/// node affinity required) or none (the binder's; `delay_binding` for WaitForFirstConsumer
/// classes, where only a pre-bound volume is taken).
pub struct MatchOn<'a> {
    pub node: Option<(&'a str, Option<&'a BTreeMap<String, String>>)>,
    pub delay_binding: bool,
}

/// The volume that suits the claim best, as Kubernetes' `FindMatchingVolume` chooses it.
pub fn find_matching_volume<'a, P: AsRef<PersistentVolume>>(
    claim: &PersistentVolumeClaim,
    volumes: &'a [P],
    on: &MatchOn<'_>,
) -> Option<&'a PersistentVolume> {
    let want = requested(claim);
    let class = claim_class(claim);
    let selector = claim
        .spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .map(LabelSelector::from_selector);
    let mut best: Option<(&PersistentVolume, usize, Nanos)> = None;
    for pv in volumes.iter().map(AsRef::as_ref) {
        let size = capacity(pv);
        if size < want
            || volume_mode(pv) != claim_volume_mode(claim)
            || pv.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
        let affinity_ok = on
            .node
            .is_none_or(|(name, labels)| node_affinity_admits(affinity, name, labels));
        if bound_to(pv, claim) {
            return affinity_ok.then_some(pv);
        }
        if on.node.is_none() && on.delay_binding {
            continue;
        }
        let available = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available");
        let free = pv.spec.as_ref().is_none_or(|s| s.claim_ref.is_none());
        if !available || !free || volume_class(pv) != class || !affinity_ok {
            continue;
        }
        if let Some(sel) = &selector {
            if !sel.matches_labels(pv.metadata.labels.as_ref()) {
                continue;
            }
        }
        if !access_modes_fit(claim, pv) {
            continue;
        }
        let modes = volume_modes(pv).len();
        if best.is_none_or(|(_, m, s)| (modes, size) < (m, s)) {
            best = Some((pv, modes, size));
        }
    }
    best.map(|(pv, _, _)| pv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
        PersistentVolumeClaimSpec, PersistentVolumeSpec, PersistentVolumeStatus,
        VolumeResourceRequirements,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector as Sel, ObjectMeta};

    struct Pv(PersistentVolume);

    impl Pv {
        fn new(name: &str, size: &str, modes: &[&str]) -> Pv {
            Pv(PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeSpec {
                    capacity: Some([("storage".to_string(), Quantity(size.into()))].into()),
                    access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                    ..Default::default()
                }),
                status: Some(PersistentVolumeStatus {
                    phase: Some("Available".into()),
                    ..Default::default()
                }),
            })
        }
        fn class(mut self, c: &str) -> Pv {
            self.0.spec.as_mut().unwrap().storage_class_name = Some(c.into());
            self
        }
        fn label(mut self, k: &str, v: &str) -> Pv {
            self.0.metadata.labels = Some([(k.to_string(), v.to_string())].into());
            self
        }
        fn claimed(mut self, ns: &str, name: &str) -> Pv {
            self.0.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            });
            self
        }
        fn on_node(mut self, node: &str) -> Pv {
            self.0.spec.as_mut().unwrap().node_affinity = Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![node.into()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            });
            self
        }
        fn phase(mut self, p: &str) -> Pv {
            self.0.status.as_mut().unwrap().phase = Some(p.into());
            self
        }
    }

    impl AsRef<PersistentVolume> for Pv {
        fn as_ref(&self) -> &PersistentVolume {
            &self.0
        }
    }

    fn claim(size: &str, modes: &[&str], class: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(modes.iter().map(|m| m.to_string()).collect()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity(size.into()))].into()),
                    ..Default::default()
                }),
                storage_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const BINDER: MatchOn<'static> = MatchOn {
        node: None,
        delay_binding: false,
    };

    fn found<'a>(c: &PersistentVolumeClaim, pvs: &'a [Pv], on: &MatchOn<'_>) -> Option<&'a str> {
        find_matching_volume(c, pvs, on).and_then(|p| p.metadata.name.as_deref())
    }

    #[test]
    fn the_smallest_volume_that_fits_wins() {
        let pvs = [
            Pv::new("big", "10Gi", &["ReadWriteOnce"]),
            Pv::new("small", "1Gi", &["ReadWriteOnce"]),
            Pv::new("fit", "2Gi", &["ReadWriteOnce"]),
        ];
        let c = claim("1500Mi", &["ReadWriteOnce"], Some(""));
        assert_eq!(found(&c, &pvs, &BINDER), Some("fit"));
        let too_big = claim("20Gi", &["ReadWriteOnce"], Some(""));
        assert_eq!(found(&too_big, &pvs, &BINDER), None);
    }

    #[test]
    fn class_access_modes_selector_and_phase_must_match() {
        let pvs = [
            Pv::new("fast", "1Gi", &["ReadWriteOnce"]).class("fast"),
            Pv::new("rox", "1Gi", &["ReadOnlyMany"]),
            Pv::new("both", "5Gi", &["ReadWriteOnce", "ReadOnlyMany"]).label("tier", "gold"),
            Pv::new("released", "1Gi", &["ReadWriteOnce"]).phase("Released"),
            Pv::new("taken", "1Gi", &["ReadWriteOnce"]).claimed("default", "other"),
        ];
        assert_eq!(
            found(
                &claim("1Gi", &["ReadWriteOnce"], Some("fast")),
                &pvs,
                &BINDER
            ),
            Some("fast")
        );
        assert_eq!(
            found(&claim("1Gi", &["ReadWriteOnce"], Some("")), &pvs, &BINDER),
            Some("both")
        );
        assert_eq!(
            found(&claim("1Gi", &["ReadOnlyMany"], None), &pvs, &BINDER),
            Some("rox")
        );
        let mut gold = claim("1Gi", &["ReadOnlyMany"], Some(""));
        gold.spec.as_mut().unwrap().selector = Some(Sel {
            match_labels: Some([("tier".to_string(), "gold".to_string())].into()),
            ..Default::default()
        });
        assert_eq!(found(&gold, &pvs, &BINDER), Some("both"));
        assert_eq!(
            found(&claim("1Gi", &["ReadWriteMany"], Some("")), &pvs, &BINDER),
            None
        );
    }

    #[test]
    fn a_prebound_volume_is_taken_even_when_binding_waits() {
        let pvs = [
            Pv::new("any", "1Gi", &["ReadWriteOnce"]).class("local"),
            Pv::new("mine", "1Gi", &["ReadWriteOnce"])
                .class("other")
                .claimed("default", "data")
                .phase("Available"),
        ];
        let c = claim("1Gi", &["ReadWriteOnce"], Some("local"));
        let waiting = MatchOn {
            node: None,
            delay_binding: true,
        };
        assert_eq!(found(&c, &pvs, &waiting), Some("mine"));
        assert_eq!(found(&c, &pvs[..1], &waiting), None);
        assert_eq!(found(&c, &pvs[..1], &BINDER), Some("any"));
    }

    #[test]
    fn node_affinity_filters_on_the_scheduler_path() {
        let pvs = [Pv::new("n1-disk", "1Gi", &["ReadWriteOnce"]).on_node("n1")];
        let c = claim("1Gi", &["ReadWriteOnce"], Some(""));
        let labels =
            |n: &str| BTreeMap::from([("kubernetes.io/hostname".to_string(), n.to_string())]);
        let (l1, l2) = (labels("n1"), labels("n2"));
        let on = |name, l| MatchOn {
            node: Some((name, Some(l))),
            delay_binding: true,
        };
        assert_eq!(found(&c, &pvs, &on("n1", &l1)), Some("n1-disk"));
        assert_eq!(found(&c, &pvs, &on("n2", &l2)), None);
        assert!(node_affinity_admits(None, "n9", None));
    }
}
