//! The built-in local-path provisioner, as k3s ships Rancher's: the default StorageClass
//! `local-path` (WaitForFirstConsumer, reclaim Delete) made when a term starts if it is
//! missing, and for a claim of that class whose first consumer was scheduled (the claim's
//! `volume.kubernetes.io/selected-node`), a hostPath volume on that node — a directory
//! `<dir>/pvc-<uid>_<namespace>_<claim>` made by the node's agent when a pod mounts it —
//! pinned there by required node affinity and pre-bound to the claim. `<dir>` is what the
//! node's agent announces in its Node's [`DIR_ANNOTATION`], else [`DEFAULT_DIR`].
//!
//! Deleting such a volume (its claim gone, reclaim policy Delete) is finished by the node's
//! agent: the volume carries [`CLEANUP_FINALIZER`], which the agent removes once it has
//! removed the directory.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_api::strategy::storageclass::DEFAULT_CLASS_ANNOTATION;
use rkube_core::meta::{name, namespace};
use rkube_core::volume::PROVISIONED_BY;

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::Action;
use rkube_runtime::events::{NORMAL, WARNING};

use super::Binder;

/// The provisioner's name, as k3s's StorageClass names it.
pub const PROVISIONER: &str = "rancher.io/local-path";
/// The default StorageClass.
pub const CLASS: &str = "local-path";
/// The Node annotation where an agent says under which directory its volumes live.
pub const DIR_ANNOTATION: &str = rkube_core::volume::LOCAL_PATH_DIR;
/// Where volumes live on a node that does not say.
pub const DEFAULT_DIR: &str = "/var/lib/rkube/storage";
/// Held on a local-path volume until its node's agent removed the directory.
pub const CLEANUP_FINALIZER: &str = rkube_core::volume::LOCAL_PATH_CLEANUP;
/// On a provisioned volume: the node it lives on (Rancher's provisioner's annotation).
const NODE_ANNOTATION: &str = rkube_core::volume::LOCAL_PATH_NODE;

/// The StorageClass k3s makes at start.
pub fn default_class() -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(CLASS.into()),
            annotations: Some(BTreeMap::from([(
                DEFAULT_CLASS_ANNOTATION.to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        provisioner: PROVISIONER.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    }
}

/// Makes the default StorageClass unless it exists.
pub async fn ensure_class(client: &LocalClient) -> Result<(), ApiError> {
    let classes = Objects::<StorageClass>::namespaced(client, "");
    match classes.create(&default_class()).await {
        Ok(_) => Ok(()),
        Err(e) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The volume for `claim` on `node`, whose volumes live under `dir`.
pub fn volume_for(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &str,
    dir: &str,
) -> PersistentVolume {
    let uid = claim.metadata.uid.as_deref().unwrap_or("");
    let pv_name = format!("pvc-{uid}");
    let (ns, claim_name) = (namespace(&claim.metadata), name(&claim.metadata));
    let spec = claim.spec.clone().unwrap_or_default();
    let path = format!("{}/{pv_name}_{ns}_{claim_name}", dir.trim_end_matches('/'));
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name),
            annotations: Some(BTreeMap::from([
                (PROVISIONED_BY.to_string(), PROVISIONER.to_string()),
                (NODE_ANNOTATION.to_string(), node.to_string()),
            ])),
            finalizers: Some(vec![CLEANUP_FINALIZER.to_string()]),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: spec
                .resources
                .and_then(|r| r.requests)
                .map(|r| r.into_iter().filter(|(k, _)| k == "storage").collect()),
            access_modes: spec.access_modes,
            persistent_volume_reclaim_policy: class.reclaim_policy.clone(),
            storage_class_name: class.metadata.name.clone(),
            volume_mode: Some(spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
            host_path: Some(HostPathVolumeSource {
                path,
                type_: Some("DirectoryOrCreate".into()),
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "kubernetes.io/hostname".into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            }),
            claim_ref: Some(ObjectReference {
                kind: Some("PersistentVolumeClaim".into()),
                api_version: Some("v1".into()),
                namespace: Some(ns.to_string()),
                name: Some(claim_name.to_string()),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

impl Binder {
    /// Provisions the volume of a local-path claim on the node chosen for it.
    pub(super) async fn provision(
        &self,
        claim: &PersistentVolumeClaim,
        class: &StorageClass,
        node: Option<&str>,
    ) -> Result<Action, ApiError> {
        let Some(node) = node else {
            let msg = format!(
                "failed to provision volume with StorageClass \"{}\": configuration error, no node was specified",
                name(&class.metadata)
            );
            self.provisioner
                .event_for(claim, WARNING, "ProvisioningFailed", &msg)
                .await;
            return Ok(Action::await_change());
        };
        let uid = claim.metadata.uid.as_deref().unwrap_or("");
        if self.volumes.get(&format!("pvc-{uid}")).is_some() {
            // Made already; the binder binds it once the cache has it.
            return Ok(Action::await_change());
        }
        let msg = format!(
            "External provisioner is provisioning volume for claim \"{}/{}\"",
            namespace(&claim.metadata),
            name(&claim.metadata)
        );
        self.provisioner
            .event_for(claim, NORMAL, "Provisioning", &msg)
            .await;
        let dir = self
            .nodes
            .get(node)
            .and_then(|n| {
                n.metadata
                    .annotations
                    .as_ref()?
                    .get(DIR_ANNOTATION)
                    .cloned()
            })
            .unwrap_or_else(|| DEFAULT_DIR.to_string());
        let pv = volume_for(claim, class, node, &dir);
        let created = ignore_gone(
            Objects::<PersistentVolume>::namespaced(&self.client, "")
                .create(&pv)
                .await,
        )?;
        if let Some(pv) = created {
            let msg = format!("Successfully provisioned volume {}", name(&pv.metadata));
            self.provisioner
                .event_for(claim, NORMAL, "ProvisioningSucceeded", &msg)
                .await;
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    #[test]
    fn a_volume_is_a_directory_on_the_selected_node() {
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("web".into()),
                uid: Some("1234".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pv = volume_for(&claim, &default_class(), "n1", "/srv/storage/");
        let spec = pv.spec.as_ref().unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-1234"));
        assert_eq!(
            spec.host_path.as_ref().unwrap().path,
            "/srv/storage/pvc-1234_web_data"
        );
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("local-path"));
        assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "1Gi");
        let r = spec.claim_ref.as_ref().unwrap();
        assert_eq!(
            (r.namespace.as_deref(), r.uid.as_deref()),
            (Some("web"), Some("1234"))
        );
        assert!(rkube_core::volume::node_affinity_admits(
            spec.node_affinity.as_ref(),
            "n1",
            Some(&[("kubernetes.io/hostname".to_string(), "n1".to_string())].into())
        ));
        assert!(!rkube_core::volume::node_affinity_admits(
            spec.node_affinity.as_ref(),
            "n2",
            Some(&[("kubernetes.io/hostname".to_string(), "n2".to_string())].into())
        ));
    }
}
