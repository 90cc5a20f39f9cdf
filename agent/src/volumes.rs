//! The node's side of local-path volumes' deletion: a local-path PersistentVolume provisioned
//! on one of this process's nodes and being deleted holds `local-path.rkube.io/directory`
//! until its directory is gone. The agent watches PersistentVolumes, removes the directory
//! (only ever under the node's own volumes dir) and then the finalizer. Simulated nodes have
//! no directories and only remove the finalizer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use rkube_core::volume::{LOCAL_PATH_CLEANUP, LOCAL_PATH_NODE};
use serde_json::json;

use crate::join::Clients;
use crate::NodeConfig;

/// The directory a volume being deleted leaves to its node, and the node, or None when the
/// volume is not such a volume of one of `nodes`.
fn to_clean<'a>(
    pv: &PersistentVolume,
    nodes: &'a HashMap<String, (Arc<Clients>, Arc<NodeConfig>)>,
) -> Option<&'a (Arc<Clients>, Arc<NodeConfig>)> {
    pv.metadata.deletion_timestamp.as_ref()?;
    if !pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == LOCAL_PATH_CLEANUP)
    {
        return None;
    }
    let node = pv.metadata.annotations.as_ref()?.get(LOCAL_PATH_NODE)?;
    nodes.get(node)
}

/// The volume's directory when it is inside `root` (a volume naming anything else is not
/// this agent's to remove).
pub fn directory_within(pv: &PersistentVolume, root: &Path) -> Option<PathBuf> {
    let path = PathBuf::from(&pv.spec.as_ref()?.host_path.as_ref()?.path);
    let inside = path.parent() == Some(root)
        && path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("pvc-"));
    inside.then_some(path)
}

async fn clean(pv: &PersistentVolume, clients: &Clients, cfg: &NodeConfig) {
    let name = pv.metadata.name.clone().unwrap_or_default();
    if let Some(root) = &cfg.volumes_dir {
        if let Some(dir) = directory_within(pv, root) {
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(volume = name, dir = %dir.display(), error = %e, "removing a volume's directory failed");
                    return;
                }
            }
        }
    }
    let left: Vec<&String> = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != LOCAL_PATH_CLEANUP)
        .collect();
    let patch = json!({"metadata": {"finalizers": left,
                                    "resourceVersion": pv.metadata.resource_version}});
    let api: Api<PersistentVolume> = Api::all(clients.get());
    if let Err(e) = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::debug!(volume = name, error = %e, "releasing a local-path volume failed; the watch brings it again");
    }
}

/// Watches PersistentVolumes for the nodes of this process and finishes the deletion of their
/// local-path volumes, for as long as the agent runs.
pub async fn clean_up(nodes: Vec<(Arc<Clients>, Arc<NodeConfig>)>) {
    let Some(watcher) = nodes.first().map(|(c, _)| c.clone()) else {
        return;
    };
    let by_name: HashMap<String, (Arc<Clients>, Arc<NodeConfig>)> = nodes
        .into_iter()
        .map(|(c, cfg)| (cfg.name.clone(), (c, cfg)))
        .collect();
    loop {
        let api: Api<PersistentVolume> = Api::all(watcher.get());
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "listing persistent volumes failed");
                watcher.fail_over().await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut rv = list.metadata.resource_version.unwrap_or_default();
        for pv in &list.items {
            if let Some((c, cfg)) = to_clean(pv, &by_name) {
                clean(pv, c, cfg).await;
            }
        }
        // Watched from the list's revision, again from the last one seen when a watch ends;
        // listed again when the watch cannot go on.
        loop {
            let stream = match api.watch(&WatchParams::default().timeout(290), &rv).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "watching persistent volumes failed");
                    break;
                }
            };
            let mut stream = Box::pin(stream);
            let mut relist = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(WatchEvent::Added(pv)) | Ok(WatchEvent::Modified(pv)) => {
                        rv = pv.metadata.resource_version.clone().unwrap_or(rv);
                        if let Some((c, cfg)) = to_clean(&pv, &by_name) {
                            clean(&pv, c, cfg).await;
                        }
                    }
                    Ok(WatchEvent::Deleted(pv)) => {
                        rv = pv.metadata.resource_version.clone().unwrap_or(rv);
                    }
                    Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                    Ok(WatchEvent::Error(_)) => {
                        relist = true;
                        break;
                    }
                    Err(_) => break,
                }
            }
            if relist {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostPathVolumeSource, PersistentVolumeSpec};

    #[test]
    fn only_a_volume_directory_under_the_root_is_removed() {
        let pv = |path: &str| PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: path.into(),
                    type_: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let root = Path::new("/srv/agent/storage");
        assert_eq!(
            directory_within(&pv("/srv/agent/storage/pvc-1_default_data"), root),
            Some(PathBuf::from("/srv/agent/storage/pvc-1_default_data"))
        );
        assert_eq!(directory_within(&pv("/srv/agent/storage"), root), None);
        assert_eq!(directory_within(&pv("/etc"), root), None);
        assert_eq!(
            directory_within(&pv("/srv/agent/storage/../pvc-x"), root),
            None
        );
        assert_eq!(
            directory_within(&pv("/srv/agent/storage/other"), root),
            None
        );
    }
}
