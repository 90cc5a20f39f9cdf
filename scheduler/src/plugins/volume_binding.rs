//! VolumeBinding (kube-scheduler's plugin of that name): a pod's PersistentVolumeClaims decide
//! where it may go. PreFilter rejects the pod outright when a claim is missing, being deleted,
//! or unbound in an Immediate class (the binder binds those first); Filter keeps the nodes that
//! the bound volumes' node affinity admits and, for claims of WaitForFirstConsumer classes,
//! where an available volume fits or the class's provisioner can make one. Once a node is
//! chosen, [`VolumeBinding::bind_volumes`] (the plugin's PreBind) pre-binds the volumes found
//! there or asks for provisioning on it (`volume.kubernetes.io/selected-node`), and waits
//! until every claim is bound before the pod is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::meta::name;
use rkube_core::path;
use rkube_core::volume::{
    claim_class, find_matching_volume, node_affinity_admits, pod_claims, MatchOn,
    BOUND_BY_CONTROLLER, SELECTED_NODE,
};
use rkube_runtime::store::Store;
use serde_json::json;

use crate::framework::{CycleState, FilterPlugin, PreFilterPlugin, PreFilterRejection, Status};
use crate::snapshot::{namespace, NodeInfo};

pub const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
pub const NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const BIND_CONFLICT: &str = "node(s) didn't find available persistent volumes to bind";
pub const PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
/// How long the binding cycle waits for the pod's claims to be bound (kube-scheduler's
/// bindTimeoutSeconds).
const BIND_TIMEOUT: Duration = Duration::from_secs(600);

/// The informer views the plugin reads.
#[derive(Clone)]
pub struct VolumeBinding {
    pub claims: Arc<Store<PersistentVolumeClaim>>,
    pub volumes: Arc<Store<PersistentVolume>>,
    pub classes: Arc<Store<StorageClass>>,
}

/// A pod's claims as PreFilter found them.
struct PodVolumes {
    /// The volumes of its bound claims.
    bound: Vec<Arc<PersistentVolume>>,
    /// A bound claim names a volume that does not exist.
    missing_volume: bool,
    /// Its unbound claims of WaitForFirstConsumer classes.
    delayed: Vec<Arc<PersistentVolumeClaim>>,
}

fn volume_name(c: &PersistentVolumeClaim) -> Option<&str> {
    c.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn failed(e: ApiError) -> String {
    format!("binding volumes: {}", e.message)
}

impl VolumeBinding {
    fn delayed_class(&self, c: &PersistentVolumeClaim) -> bool {
        let class = claim_class(c);
        !class.is_empty()
            && self
                .classes
                .get(class)
                .is_some_and(|k| k.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
    }

    /// Sorts a pod's claims, or the reason no node can take it.
    fn pod_volumes(&self, pod: &Pod) -> Result<Option<PodVolumes>, String> {
        let names = pod_claims(pod);
        if names.is_empty() {
            return Ok(None);
        }
        let ns = namespace(pod);
        let mut v = PodVolumes {
            bound: Vec::new(),
            missing_volume: false,
            delayed: Vec::new(),
        };
        for n in names {
            let Some(c) = self.claims.get(&format!("{ns}/{n}")) else {
                return Err(format!("persistentvolumeclaim \"{n}\" not found"));
            };
            if c.metadata.deletion_timestamp.is_some() {
                return Err(format!("persistentvolumeclaim \"{n}\" is being deleted"));
            }
            match volume_name(&c) {
                Some(pv) => match self.volumes.get(pv) {
                    Some(pv) => v.bound.push(pv),
                    None => v.missing_volume = true,
                },
                None if self.delayed_class(&c) => v.delayed.push(c),
                None => return Err(UNBOUND_IMMEDIATE.to_string()),
            }
        }
        Ok(Some(v))
    }

    /// Whether the class of a delayed claim can make a volume on `node`.
    fn provisionable(&self, c: &PersistentVolumeClaim, node: &Node) -> bool {
        let Some(class) = self.classes.get(claim_class(c)) else {
            return false;
        };
        if class.provisioner == "kubernetes.io/no-provisioner" {
            return false;
        }
        let labels = node.metadata.labels.as_ref();
        class.allowed_topologies.as_deref().is_none_or(|terms| {
            terms.is_empty()
                || terms.iter().any(|t| {
                    t.match_label_expressions.iter().flatten().all(|e| {
                        labels
                            .and_then(|l| l.get(&e.key))
                            .is_some_and(|v| e.values.contains(v))
                    })
                })
        })
    }

    /// The volume each delayed claim would take on `node` (None: to be provisioned), or
    /// false when a claim can have neither.
    fn plan(
        &self,
        delayed: &[Arc<PersistentVolumeClaim>],
        node: &Node,
    ) -> Option<Vec<Option<Arc<PersistentVolume>>>> {
        let node_name = name(&node.metadata);
        let mut volumes = self.volumes.list("");
        let mut out = Vec::new();
        for c in delayed {
            let on = MatchOn {
                node: Some((node_name, node.metadata.labels.as_ref())),
                delay_binding: true,
            };
            let found =
                find_matching_volume(c, &volumes, &on).map(|pv| name(&pv.metadata).to_string());
            match found {
                Some(pv_name) => {
                    let i = volumes.iter().position(|p| name(&p.metadata) == pv_name)?;
                    out.push(Some(volumes.remove(i)));
                }
                None if self.provisionable(c, node) => out.push(None),
                None => return None,
            }
        }
        Some(out)
    }

    /// PreBind: pre-binds the volumes chosen on `node` and asks for the rest to be
    /// provisioned there, then waits until the pod's claims are bound.
    pub async fn bind_volumes(
        &self,
        client: &LocalClient,
        pod: &Pod,
        node: &Node,
        still_pending: impl Fn() -> bool,
    ) -> Result<(), String> {
        let v = match self.pod_volumes(pod) {
            Ok(Some(v)) => v,
            Ok(None) => return Ok(()),
            Err(e) => return Err(e),
        };
        if !v.delayed.is_empty() {
            let plan = self
                .plan(&v.delayed, node)
                .ok_or_else(|| BIND_CONFLICT.to_string())?;
            let node_name = name(&node.metadata);
            for (c, pv) in v.delayed.iter().zip(plan) {
                match pv {
                    Some(pv) => {
                        let patch = json!({
                            "metadata": {"resourceVersion": pv.metadata.resource_version,
                                         "annotations": {BOUND_BY_CONTROLLER: "yes"}},
                            "spec": {"claimRef": {
                                "kind": "PersistentVolumeClaim", "apiVersion": "v1",
                                "namespace": c.metadata.namespace, "name": c.metadata.name,
                                "uid": c.metadata.uid,
                                "resourceVersion": c.metadata.resource_version}},
                        });
                        let p = path::object::<PersistentVolume>("", name(&pv.metadata));
                        client.merge_patch(&p, &patch).await.map_err(failed)?;
                    }
                    None => {
                        let selected = c
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(SELECTED_NODE));
                        if selected.map(String::as_str) != Some(node_name) {
                            let patch =
                                json!({"metadata": {"annotations": {SELECTED_NODE: node_name}}});
                            let p = path::object::<PersistentVolumeClaim>(
                                namespace(pod),
                                name(&c.metadata),
                            );
                            client.merge_patch(&p, &patch).await.map_err(failed)?;
                        }
                    }
                }
            }
        }
        let ns = namespace(pod).to_string();
        let names = pod_claims(pod);
        let deadline = Instant::now() + BIND_TIMEOUT;
        loop {
            let all_bound = names.iter().all(|n| {
                self.claims.get(&format!("{ns}/{n}")).is_some_and(|c| {
                    volume_name(&c).is_some()
                        && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                })
            });
            if all_bound {
                return Ok(());
            }
            if !still_pending() {
                return Err("binding volumes: the pod is gone or was bound meanwhile".into());
            }
            if Instant::now() > deadline {
                return Err("binding volumes: timed out waiting for the condition".into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl PreFilterPlugin for VolumeBinding {
    fn name(&self) -> &'static str {
        "VolumeBinding"
    }

    fn pre_filter(&self, pod: &Pod, _nodes: &[NodeInfo], state: &mut CycleState) {
        match self.pod_volumes(pod) {
            Ok(Some(v)) => state.insert(v),
            Ok(None) => {}
            Err(reason) => state.insert(PreFilterRejection(reason)),
        }
    }
}

impl FilterPlugin for VolumeBinding {
    fn name(&self) -> &'static str {
        "VolumeBinding"
    }

    fn filter(&self, _pod: &Pod, node: &NodeInfo, state: &CycleState) -> Status {
        let Some(v) = state.get::<PodVolumes>() else {
            return Status::success();
        };
        if v.missing_volume {
            return Status::unresolvable(PV_NOT_EXIST);
        }
        let labels = node.node.metadata.labels.as_ref();
        for pv in &v.bound {
            let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
            if !node_affinity_admits(affinity, &node.name, labels) {
                return Status::unresolvable(NODE_CONFLICT);
            }
        }
        if !v.delayed.is_empty() && self.plan(&v.delayed, &node.node).is_none() {
            return Status::unschedulable(BIND_CONFLICT);
        }
        Status::success()
    }
}
