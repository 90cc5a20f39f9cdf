//! The pod garbage collector, as kube-controller-manager's: a pod bound to a node that no
//! longer exists has no agent to finish it, so it is deleted for good (grace period 0) once
//! its node has been missing at two checks in a row (a node deleted and registered again a
//! moment later keeps its pods); a terminating pod that was never scheduled goes at once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
use rkube_api::client::LocalClient;
use rkube_core::meta::{name, namespace};
use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::store::Store;
use tokio::sync::watch;

/// kube-controller-manager's --terminated-pod-gc period of checks (gcCheckPeriod).
pub const CHECK_PERIOD: Duration = Duration::from_secs(20);

pub fn run(
    pods: Arc<Store<Pod>>,
    nodes: Arc<Store<Node>>,
    client: LocalClient,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        for mut synced in [pods.synced(), nodes.synced()] {
            let _ = synced.wait_for(|s| *s).await;
        }
        // Nodes found missing at the previous check.
        let mut missing_before: BTreeSet<String> = BTreeSet::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let mut missing_now = BTreeSet::new();
            for pod in pods.list("") {
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or("");
                let terminating = pod.metadata.deletion_timestamp.is_some();
                let orphaned = !node.is_empty() && nodes.get(node).is_none();
                if orphaned {
                    missing_now.insert(node.to_string());
                }
                let collect =
                    (orphaned && missing_before.contains(node)) || (node.is_empty() && terminating);
                if !collect {
                    continue;
                }
                let (ns, pod_name) = (namespace(&pod.metadata), name(&pod.metadata));
                let options = DeleteOptions {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: pod.metadata.uid.clone(),
                        resource_version: None,
                    }),
                    ..Default::default()
                };
                let deleted = Objects::<Pod>::namespaced(&client, ns)
                    .delete_with(pod_name, &options)
                    .await;
                match ignore_gone(deleted) {
                    Ok(_) => {
                        tracing::info!(
                            namespace = ns,
                            pod = pod_name,
                            node,
                            "garbage-collected a pod whose node is gone"
                        )
                    }
                    Err(e) => {
                        tracing::debug!(namespace = ns, pod = pod_name, error = %e, "pod garbage collection failed")
                    }
                }
            }
            missing_before = missing_now;
        }
    });
}
