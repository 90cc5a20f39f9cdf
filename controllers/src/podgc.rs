//! The pod garbage collector, as kube-controller-manager's: a pod bound to a node that no
//! longer exists has no agent to finish it, so it is deleted for good (grace period 0) once
//! its node has been missing at two checks in a row (a node deleted and registered again a
//! moment later keeps its pods); a terminating pod that was never scheduled goes at once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rkube_api::client::LocalClient;
use rkube_core::json::str_at as s;
use serde_json::json;
use tokio::sync::watch;

use crate::ignore_gone;
use rkube_runtime::informer::Informer;

/// kube-controller-manager's --terminated-pod-gc period of checks (gcCheckPeriod).
pub const CHECK_PERIOD: Duration = Duration::from_secs(20);

pub fn run(
    pods: Arc<Informer>,
    nodes: Arc<Informer>,
    client: LocalClient,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        pods.wait_synced().await;
        nodes.wait_synced().await;
        // Nodes found missing at the previous check.
        let mut missing_before: BTreeSet<String> = BTreeSet::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let mut missing_now = BTreeSet::new();
            for pod in pods.list("") {
                let node = s(&pod, "/spec/nodeName");
                let terminating = pod.pointer("/metadata/deletionTimestamp").is_some();
                let orphaned = !node.is_empty() && nodes.get(node).is_none();
                if orphaned {
                    missing_now.insert(node.to_string());
                }
                let collect =
                    (orphaned && missing_before.contains(node)) || (node.is_empty() && terminating);
                if !collect {
                    continue;
                }
                let path = format!(
                    "/api/v1/namespaces/{}/pods/{}",
                    s(&pod, "/metadata/namespace"),
                    s(&pod, "/metadata/name")
                );
                let opts = json!({"kind": "DeleteOptions", "apiVersion": "v1",
                                  "gracePeriodSeconds": 0,
                                  "preconditions": {"uid": s(&pod, "/metadata/uid")}});
                match ignore_gone(client.delete(&path, Some(&opts)).await) {
                    Ok(_) => {
                        tracing::info!(pod = %path, node, "garbage-collected a pod whose node is gone")
                    }
                    Err(e) => {
                        tracing::debug!(pod = %path, error = %e, "pod garbage collection failed")
                    }
                }
            }
            missing_before = missing_now;
        }
    });
}
