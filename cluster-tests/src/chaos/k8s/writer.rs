//! The writers: read-modify-write updates on shared ConfigMaps, and creates, lists and
//! deletes of their own.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::Api;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;
use tokio::sync::watch;

use super::shared::{configmap, member, pause_or_stop, rv_of, Answer, Cursor, Shared};
use super::violation::Violation;
use super::{CM_APP, SHARED_OBJECTS};

/// A writer: read-modify-write updates and deletes of the shared objects, and creates, lists
/// and deletes of its own.
pub(super) struct Writer {
    pub(super) shared: Arc<Shared>,
    pub(super) id: usize,
    pub(super) rng: StdRng,
    pub(super) cursor: Cursor,
    pub(super) seq: u64,
    /// Own objects whose create was acknowledged and that were never deleted: name -> version.
    pub(super) own: BTreeMap<String, i64>,
    pub(super) next_own: u64,
    pub(super) last_list: i64,
}

impl Writer {
    pub(super) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            self.seq += 1;
            let token = format!("w{}-{}", self.id, self.seq);
            let moved = match self.rng.gen_range(0..100) {
                0..=64 => self.update_shared(&token).await,
                65..=74 => self.create_own(&token).await,
                75..=81 => self.delete_own().await,
                82..=91 => self.list_own().await,
                _ => self.delete_shared(&token).await,
            };
            if moved {
                self.cursor.next();
            }
            let pace = Duration::from_millis(self.rng.gen_range(20..80));
            if pause_or_stop(pace, &mut stop).await {
                return;
            }
        }
    }

    fn api(&self) -> Api<ConfigMap> {
        self.shared.api(self.cursor.member)
    }

    fn on(&self) -> String {
        member(self.cursor.member)
    }

    /// Reads a shared object, checking it is not older than its newest acknowledged write;
    /// creates it when it is missing. Err(true): the member failed.
    async fn read_shared(&mut self, name: &str, token: &str) -> Result<Option<ConfigMap>, bool> {
        let floor = self.shared.newest(name);
        match self.shared.call("get", self.api().get(name)).await {
            Answer::Ok(cm) => {
                self.shared.observe(&cm);
                let rv = rv_of(&cm.metadata).unwrap_or(0);
                if rv < floor {
                    self.shared.violation(
                        Violation::StaleRead,
                        format!(
                            "get {name} on {} returned version {rv}, older than the acknowledged {floor}",
                            self.on()
                        ),
                    );
                }
                Ok(Some(cm))
            }
            Answer::NotFound => {
                let cm = configmap(name, json!({"app": CM_APP}), token);
                let (api, pp) = (self.api(), PostParams::default());
                match self.shared.call("create", api.create(&pp, &cm)).await {
                    Answer::Ok(made) => {
                        if let Some(rv) = rv_of(&made.metadata) {
                            self.shared.acked(name, rv);
                        }
                        Ok(None)
                    }
                    Answer::Conflict => {
                        self.shared.conflicted(token);
                        Ok(None)
                    }
                    Answer::Failed => Err(true),
                    Answer::Gone | Answer::NotFound => Ok(None),
                }
            }
            Answer::Failed => Err(true),
            Answer::Conflict | Answer::Gone => Ok(None),
        }
    }

    async fn update_shared(&mut self, token: &str) -> bool {
        let name = format!("race-{}", self.rng.gen_range(0..SHARED_OBJECTS));
        let mut cm = match self.read_shared(&name, token).await {
            Ok(Some(cm)) => cm,
            Ok(None) => return false,
            Err(moved) => return moved,
        };
        let Some(from) = rv_of(&cm.metadata) else {
            return false;
        };
        // The body keeps the resourceVersion it was read at: the update is conditional on it.
        cm.data
            .get_or_insert_default()
            .insert("token".into(), token.into());
        let (api, pp) = (self.api(), PostParams::default());
        match self
            .shared
            .call("update", api.replace(&name, &pp, &cm))
            .await
        {
            Answer::Ok(new) => {
                let to = rv_of(&new.metadata).unwrap_or(0);
                self.shared
                    .wrote_from(&name, from, Some(to), token, self.cursor.member);
                false
            }
            Answer::Conflict => {
                self.shared.conflicted(token);
                false
            }
            Answer::Failed => true,
            Answer::Gone | Answer::NotFound => false,
        }
    }

    async fn delete_shared(&mut self, token: &str) -> bool {
        let name = format!("race-{}", self.rng.gen_range(0..SHARED_OBJECTS));
        let cm = match self.read_shared(&name, token).await {
            Ok(Some(cm)) => cm,
            Ok(None) => return false,
            Err(moved) => return moved,
        };
        let Some(from) = rv_of(&cm.metadata) else {
            return false;
        };
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(from.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match self
            .shared
            .call("delete", self.api().delete(&name, &dp))
            .await
        {
            Answer::Ok(_) => {
                self.shared
                    .wrote_from(&name, from, None, token, self.cursor.member);
                false
            }
            Answer::Failed => true,
            _ => false,
        }
    }

    async fn create_own(&mut self, token: &str) -> bool {
        self.next_own += 1;
        let name = format!("own-{}-{}", self.id, self.next_own);
        let labels = json!({"app": CM_APP, "writer": format!("w{}", self.id)});
        let cm = configmap(&name, labels, token);
        let (api, pp) = (self.api(), PostParams::default());
        match self.shared.call("create", api.create(&pp, &cm)).await {
            Answer::Ok(made) => {
                if let Some(rv) = rv_of(&made.metadata) {
                    self.shared.acked(&name, rv);
                    self.own.insert(name, rv);
                }
                false
            }
            Answer::Conflict => {
                self.shared.conflicted(token);
                false
            }
            Answer::Failed => true,
            Answer::Gone | Answer::NotFound => false,
        }
    }

    async fn delete_own(&mut self) -> bool {
        // Once a delete is tried, its outcome may be unknown: the object leaves `own`.
        let Some((name, _)) = self.own.pop_first() else {
            return false;
        };
        let (api, dp) = (self.api(), DeleteParams::default());
        matches!(
            self.shared.call("delete", api.delete(&name, &dp)).await,
            Answer::Failed
        )
    }

    async fn list_own(&mut self) -> bool {
        let floor = self.shared.newest_acked();
        let expected = self.own.clone();
        let lp = ListParams::default().labels(&format!("app={CM_APP},writer=w{}", self.id));
        let list = match self.shared.call("list", self.api().list(&lp)).await {
            Answer::Ok(list) => list,
            Answer::Failed => return true,
            _ => return false,
        };
        let rv: i64 = list
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let on = self.on();
        let w = self.id;
        if rv < self.last_list {
            self.shared.violation(
                Violation::ListWentBack,
                format!(
                    "writer {w}'s list on {on} was at version {rv} after one at {}",
                    self.last_list
                ),
            );
        }
        self.last_list = self.last_list.max(rv);
        if rv < floor {
            self.shared.violation(
                Violation::StaleRead,
                format!("writer {w}'s list on {on} was at version {rv}, older than the acknowledged {floor}"),
            );
        }
        let names: HashSet<&str> = list
            .items
            .iter()
            .filter_map(|cm| cm.metadata.name.as_deref())
            .collect();
        for cm in &list.items {
            self.shared.observe(cm);
        }
        for (name, created) in &expected {
            if !names.contains(name.as_str()) {
                self.shared.violation(
                    Violation::LostCreate,
                    format!("writer {w}'s list on {on} at version {rv} lacks {name}, created at {created}"),
                );
            }
        }
        false
    }
}
