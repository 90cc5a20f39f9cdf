//! Keeping the policy current: each followed store folder listed at a revision, then watched
//! from the next one, and listed again when its watch ends.

use std::sync::Arc;
use std::time::Duration;

use rkube_store::mvcc::types::{EventKind, KeyRange};
use rkube_store::mvcc::watch::{self as store_watch, WatchMessage, WatchSpec};
use rkube_store::server::node::Node;
#[cfg(test)]
use serde_json::Value;

use super::Authorizer;
use crate::error::ApiError;
use crate::storage::{decode, Freshness, ObjectStore};

/// The store folders the authorizer follows, and what each holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    ClusterRole,
    Role,
    ClusterRoleBinding,
    RoleBinding,
}

const FOLLOWED: &[(Kind, &str)] = &[
    (Kind::ClusterRole, "/registry/clusterroles/"),
    (Kind::Role, "/registry/roles/"),
    (Kind::ClusterRoleBinding, "/registry/clusterrolebindings/"),
    (Kind::RoleBinding, "/registry/rolebindings/"),
];

impl Authorizer {
    /// Loads the policy from the member's store and follows it with a watch per kind.
    pub fn start(self: &Arc<Self>, node: Arc<Node>) {
        for &(kind, prefix) in FOLLOWED {
            let this = self.clone();
            let node = node.clone();
            tokio::spawn(async move {
                loop {
                    if let Err(e) = this.follow(&node, kind, prefix).await {
                        tracing::warn!(error = %e, prefix, "following RBAC objects failed; reloading");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
        }
    }

    /// Lists one folder at a revision, then applies its changes from the next revision on,
    /// until the watch ends (compaction), which the caller answers by listing again.
    async fn follow(&self, node: &Arc<Node>, kind: Kind, prefix: &str) -> Result<(), ApiError> {
        let store = ObjectStore::new(node.clone());
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, rev, _) = store.range(prefix, &end, 0, Freshness::Any).await?;
        {
            let mut p = self.policy.write().unwrap_or_else(|e| e.into_inner());
            p.clear(kind);
            for kv in &kvs {
                let key = String::from_utf8_lossy(&kv.key);
                if let (Some(rest), Ok(s)) = (key.strip_prefix(prefix), decode(kv)) {
                    p.set(kind, rest, Some(&s.object));
                }
            }
        }
        let spec = WatchSpec {
            range: KeyRange::prefix(prefix.as_bytes().to_vec()),
            start_revision: rev + 1,
            ..Default::default()
        };
        let mut events = store_watch::start(node.mvcc.clone(), spec, 256);
        while let Some(msg) = events.recv().await {
            match msg {
                WatchMessage::Events { events, .. } => {
                    let mut p = self.policy.write().unwrap_or_else(|e| e.into_inner());
                    for ev in events {
                        let key = String::from_utf8_lossy(&ev.kv.key).to_string();
                        let Some(rest) = key.strip_prefix(prefix) else {
                            continue;
                        };
                        match ev.kind {
                            EventKind::Put => {
                                if let Ok(s) = decode(&ev.kv) {
                                    p.set(kind, rest, Some(&s.object));
                                }
                            }
                            EventKind::Delete => p.set(kind, rest, None),
                        }
                    }
                }
                WatchMessage::Progress { .. } => {}
                WatchMessage::Compacted { .. } => return Ok(()),
            }
        }
        Ok(())
    }

    /// Records an object as the watch of `folder` (a /registry/... prefix) would.
    #[cfg(test)]
    pub(crate) fn load_at(&self, folder: &str, rest: &str, object: &Value) {
        if let Some((kind, _)) = FOLLOWED.iter().find(|(_, p)| *p == folder) {
            let mut p = self.policy.write().unwrap();
            p.set(*kind, rest, Some(object));
        }
    }

    #[cfg(test)]
    pub(super) fn load(&self, objects: &[(Kind, &str, Value)]) {
        let mut p = self.policy.write().unwrap();
        for (kind, rest, o) in objects {
            p.set(*kind, rest, Some(o));
        }
    }
}
