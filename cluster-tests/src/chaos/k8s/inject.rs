//! The Kubernetes campaign's side of the fault injector ([`faults::strike`] on the `rkube up`
//! cluster's members): while a fault holds and after it healed, writes through the API time
//! its serving again and nothing may be acknowledged without quorum; between faults, the
//! explicit 409 and 410 checks.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions, WatchEvent, WatchParams};
use kube::Api;
use rand::rngs::StdRng;
use rand::Rng;
use rkube_store::proto::etcdserverpb as pb;
use serde_json::json;
use tokio::time::Instant;

use super::shared::{configmap, member, rv_of, Answer, Shared};
use super::summary::Explicit;
use super::violation::Violation;
use super::{GONE_APP, NS, PAUSE_FOR, PING_APP, QUORUM_LOSS_FOR, RECOVERY_BOUND};
use crate::chaos::faults::{self, wait_leader_except, Fault, FaultRecord, Injector};
use crate::Cluster;

/// The campaign's checks during the faults and the explicit checks, on the main task.
pub(super) struct Chaos<'a> {
    pub(super) c: &'a Cluster,
    /// The clock of the faults' records.
    pub(super) start: Instant,
    pub(super) shared: Arc<Shared>,
    pub(super) rng: StdRng,
    pub(super) pings: u64,
    pub(super) explicit: Explicit,
}

impl Chaos<'_> {
    fn size(&self) -> usize {
        self.c.members.len()
    }

    /// One write through member `m`'s API: whether it was acknowledged.
    fn ping(&mut self, m: usize) -> BoxFuture<'static, bool> {
        self.pings += 1;
        let cm = configmap(
            &format!("ping-{}", self.pings),
            json!({"app": PING_APP}),
            "ping",
        );
        let shared = self.shared.clone();
        async move {
            let api: Api<ConfigMap> = shared.api(m);
            let pp = PostParams::default();
            matches!(
                shared.call("ping", api.create(&pp, &cm)).await,
                Answer::Ok(_)
            )
        }
        .boxed()
    }

    /// Time from `since` until the API of one of `members` acknowledges a write. A write to
    /// every one of them starts every half second, without waiting for the earlier ones: a
    /// request stuck on a deposed leader must not hide that a newer one would succeed.
    async fn serving(&mut self, members: &[usize], since: Instant) -> Option<Duration> {
        let mut tries = FuturesUnordered::new();
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                _ = every.tick() => {
                    if since.elapsed() > RECOVERY_BOUND {
                        return None;
                    }
                    for &m in members {
                        tries.push(self.ping(m));
                    }
                }
                Some(ok) = tries.next(), if !tries.is_empty() => {
                    if ok {
                        return Some(since.elapsed());
                    }
                }
            }
        }
    }

    /// Waits until every member's API, and the control-plane endpoint, answer reads again.
    pub(super) async fn all_serving(&mut self) -> bool {
        let started = Instant::now();
        let mut pending: Vec<usize> = (0..self.shared.clients.len()).collect();
        while started.elapsed() < RECOVERY_BOUND {
            let mut still = Vec::new();
            for &m in &pending {
                let api: Api<Namespace> = Api::all(self.shared.clients[m].clone());
                if !matches!(
                    self.shared.call("get namespace", api.get(NS)).await,
                    Answer::Ok(_)
                ) {
                    still.push(m);
                }
            }
            if still.is_empty() {
                return true;
            }
            pending = still;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// With `down` killed, nothing may be acknowledged: a write through `survivor`'s API.
    async fn no_write_without_quorum(&mut self, survivor: usize, down: &[usize]) {
        let ping = format!("ping-quorum-{}", self.pings);
        self.pings += 1;
        let cm = configmap(&ping, json!({"app": PING_APP}), "no-quorum");
        let api: Api<ConfigMap> = self.shared.api(survivor);
        if let Answer::Ok(made) = self
            .shared
            .call(
                "write without quorum",
                api.create(&PostParams::default(), &cm),
            )
            .await
        {
            let down: Vec<String> = down.iter().map(|d| member(*d)).collect();
            self.shared.violation(
                Violation::WriteWithoutQuorum,
                format!(
                    "{} acknowledged the create of {ping} at version {:?} with {} down",
                    member(survivor),
                    made.metadata.resource_version,
                    down.join(" and ")
                ),
            );
        }
    }

    pub(super) async fn inject(&mut self, fault: Fault) -> FaultRecord {
        let Some(leader) = wait_leader_except(&self.c, None, Duration::from_secs(30)).await else {
            let mut record =
                FaultRecord::new(fault, "no leader to fault".into(), self.now(), false);
            record.injected = false;
            return record;
        };
        match faults::strike(self, fault, leader).await {
            Ok(record) => record,
            Err(e) => {
                let mut record = FaultRecord::new(fault, format!("{e:#}"), self.now(), false);
                record.injected = false;
                record
            }
        }
    }

    /// An update and a delete from a version known to be old must be 409.
    pub(super) async fn stale_update(&mut self) {
        let m = self.rng.gen_range(0..self.size());
        let api: Api<ConfigMap> = self.shared.api(m);
        let name = "stale-probe";
        self.explicit.stale_update.1 += 1;
        let first = match self.shared.call("get", api.get(name)).await {
            Answer::Ok(cm) => cm,
            Answer::NotFound => {
                let cm = configmap(name, json!({"app": "chaos-stale"}), "stale-0");
                match self
                    .shared
                    .call("create", api.create(&PostParams::default(), &cm))
                    .await
                {
                    Answer::Ok(cm) => cm,
                    _ => return,
                }
            }
            _ => return,
        };
        let Some(old) = rv_of(&first.metadata) else {
            return;
        };
        let mut next = first.clone();
        next.data
            .get_or_insert_default()
            .insert("token".into(), format!("stale-{old}"));
        let now = match self
            .shared
            .call("update", api.replace(name, &PostParams::default(), &next))
            .await
        {
            Answer::Ok(cm) => rv_of(&cm.metadata).unwrap_or(0),
            _ => return,
        };
        // `next` still carries version `old`.
        next.data
            .get_or_insert_default()
            .insert("token".into(), format!("stale-again-{old}"));
        match self
            .shared
            .call(
                "stale update",
                api.replace(name, &PostParams::default(), &next),
            )
            .await
        {
            Answer::Conflict => self.explicit.stale_update.0 += 1,
            Answer::Ok(cm) => {
                self.explicit.stale_update.0 += 1;
                self.shared.violation(
                    Violation::StaleUpdateAccepted,
                    format!(
                        "an update of {name} from version {old} succeeded on {} (current was {now}), making {:?}",
                        member(m),
                        cm.metadata.resource_version
                    ),
                );
            }
            _ => return,
        }
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(old.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        if let Answer::Ok(_) = self
            .shared
            .call("stale delete", api.delete(name, &dp))
            .await
        {
            self.shared.violation(
                Violation::StaleUpdateAccepted,
                format!(
                    "a delete of {name} with precondition version {old} succeeded on {} (current was {now} or later)",
                    member(m)
                ),
            );
        }
    }

    /// A watch and a continue token from before a compaction must be 410 Gone on a member
    /// that has applied the compaction.
    pub(super) async fn gone(&mut self) {
        let n = self.size();
        let (m, j) = (self.rng.gen_range(0..n), self.rng.gen_range(0..n));
        self.explicit.gone_watch.1 += 1;
        self.explicit.gone_continue.1 += 1;
        let api: Api<ConfigMap> = self.shared.api(m);
        let lp = ListParams::default().labels(&format!("app={GONE_APP}"));
        // Two objects exist, so a page of one has a continue token.
        let page = match self
            .shared
            .call("list", api.list(&lp.clone().limit(1)))
            .await
        {
            Answer::Ok(page) => page,
            _ => return,
        };
        let (Some(old), Some(token)) = (
            page.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<i64>().ok()),
            page.metadata.continue_.clone().filter(|t| !t.is_empty()),
        ) else {
            return;
        };
        // Two writes after it, and a compaction to the second: revisions up to it are gone
        // whether or not the compaction revision itself stays readable.
        let mut to = 0;
        for k in 0..2 {
            let name = format!("gone-{}-{k}", old);
            let cm = configmap(&name, json!({"app": "chaos-gone-writes"}), "gone");
            match self
                .shared
                .call("create", api.create(&PostParams::default(), &cm))
                .await
            {
                Answer::Ok(made) => to = rv_of(&made.metadata).unwrap_or(0),
                _ => return,
            }
        }
        let mut kv = self.c.kv(m);
        let compact = kv.compact(pb::CompactionRequest {
            revision: to,
            physical: true,
        });
        match tokio::time::timeout(Duration::from_secs(10), compact).await {
            // Already compacted past it (by the leader's schedule) is as good.
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.code() == tonic::Code::OutOfRange => {}
            _ => return,
        }
        // Member j has applied the compaction once it refuses a read at `old`.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut kv = self.c.kv(j);
            let read = kv.range(pb::RangeRequest {
                key: b"/registry/namespaces/default".to_vec(),
                revision: old,
                serializable: true,
                ..Default::default()
            });
            match tokio::time::timeout(Duration::from_secs(3), read).await {
                Ok(Err(e)) if e.code() == tonic::Code::OutOfRange => break,
                _ if Instant::now() > deadline => return,
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let on = member(j);
        let api: Api<ConfigMap> = self.shared.api(j);
        let wp = WatchParams::default()
            .labels(&format!("app={GONE_APP}"))
            .timeout(30);
        match self
            .shared
            .call(
                "watch from a compacted version",
                api.watch(&wp, &old.to_string()),
            )
            .await
        {
            Answer::Gone => self.explicit.gone_watch.0 += 1,
            Answer::Ok(stream) => {
                let mut stream = stream.boxed();
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match tokio::time::timeout_at(deadline, stream.next()).await {
                        Ok(Some(Ok(WatchEvent::Bookmark(_)))) => continue,
                        Ok(Some(Ok(WatchEvent::Error(s)))) if s.code == 410 => {
                            self.shared.stats.gone.fetch_add(1, Ordering::Relaxed);
                            self.explicit.gone_watch.0 += 1;
                        }
                        Ok(Some(Ok(WatchEvent::Error(s)))) => {
                            self.explicit.gone_watch.0 += 1;
                            self.shared.violation(
                                Violation::NotGone,
                                format!("a watch from version {old} on {on}, compacted to {to}, said {} {}", s.code, s.message),
                            );
                        }
                        Ok(Some(Ok(
                            WatchEvent::Added(cm)
                            | WatchEvent::Modified(cm)
                            | WatchEvent::Deleted(cm),
                        ))) => {
                            self.explicit.gone_watch.0 += 1;
                            self.shared.violation(
                                Violation::NotGone,
                                format!(
                                    "a watch from version {old} on {on}, compacted to {to}, delivered {:?} at version {:?} instead of 410 Gone",
                                    cm.metadata.name, cm.metadata.resource_version
                                ),
                            );
                        }
                        Err(_) => {
                            self.explicit.gone_watch.0 += 1;
                            self.shared.violation(
                                Violation::NotGone,
                                format!("a watch from version {old} on {on}, compacted to {to}, said nothing for 10 s"),
                            );
                        }
                        // The member failed: no answer either way.
                        Ok(Some(Err(_))) | Ok(None) => {}
                    }
                    break;
                }
            }
            Answer::Failed => {}
            Answer::Conflict | Answer::NotFound => {
                self.explicit.gone_watch.0 += 1;
                self.shared.violation(
                    Violation::NotGone,
                    format!("a watch from version {old} on {on}, compacted to {to}, was refused with 409 or 404"),
                );
            }
        }
        match self
            .shared
            .call(
                "list with an old continue token",
                api.list(&lp.limit(1).continue_token(&token)),
            )
            .await
        {
            Answer::Gone => self.explicit.gone_continue.0 += 1,
            Answer::Ok(page) => {
                self.explicit.gone_continue.0 += 1;
                self.shared.violation(
                    Violation::NotGone,
                    format!(
                        "a continue token from version {old} gave a page at version {:?} on {on} after a compaction to {to}",
                        page.metadata.resource_version
                    ),
                );
            }
            _ => {}
        }
    }
}

impl<'a> Injector for Chaos<'a> {
    type Members = &'a Cluster;

    fn members(&mut self) -> &mut &'a Cluster {
        &mut self.c
    }

    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Writes through the API of every member still up (for the endpoint's holder: through
    /// the endpoint) time its serving again; with two of three down, a write through the
    /// third must not be acknowledged. A paused leader stays paused past the election
    /// timeout, two members down [`QUORUM_LOSS_FOR`].
    async fn hold(
        &mut self,
        fault: Fault,
        down: &[usize],
        leader: usize,
        since: Instant,
        record: &mut FaultRecord,
    ) {
        let n = self.size();
        let up: Vec<usize> = (0..n).filter(|i| !down.contains(i)).collect();
        match fault {
            Fault::QuorumLoss => {
                let survivor = up.first().copied().unwrap_or(leader);
                self.no_write_without_quorum(survivor, down).await;
                tokio::time::sleep(QUORUM_LOSS_FOR.saturating_sub(since.elapsed())).await;
                record.detail += &format!(" for {:?}", since.elapsed());
            }
            // The endpoint's client, after the members'.
            Fault::KillEndpoint => record.to_write = self.serving(&[n], since).await,
            _ => {
                record.to_write = self.serving(&up, since).await;
                if fault == Fault::PauseLeader {
                    // Past the election timeout in any case, so the others elect a new leader.
                    tokio::time::sleep(PAUSE_FOR.saturating_sub(since.elapsed())).await;
                    record.detail += &format!(" for {:?}", since.elapsed());
                }
            }
        }
    }

    /// After quorum loss, the API serves again on some member from the restart.
    async fn healed(&mut self, fault: Fault, healed: Instant, record: &mut FaultRecord) {
        if fault == Fault::QuorumLoss {
            let all: Vec<usize> = (0..self.size()).collect();
            record.to_write = self.serving(&all, healed).await;
        }
    }
}
