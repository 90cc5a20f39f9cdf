//! The Deployment: its maxSurge, its pods as a watcher sees them, its image changes, and
//! whether it has rolled out.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::shared::{member, Answer, Cursor, Shared};
use super::violation::Violation;
use super::watchers::View;
use super::{CONVERGE_BOUND, MAX_SURGE, NS, RECOVERY_BOUND, REPLICAS, WEB_APP};

/// maxSurge as Kubernetes resolves it: a number as it is, a percentage of the replicas rounded
/// up.
pub fn resolve_surge(surge: &IntOrString, replicas: i32) -> Result<i32> {
    match surge {
        IntOrString::Int(n) => Ok(*n),
        IntOrString::String(s) => {
            let pct: i64 = s
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("maxSurge {s:?} is neither a number nor a percentage"))?;
            Ok(((pct * replicas as i64 + 99) / 100) as i32)
        }
    }
}

/// The Deployment's pods as a watcher sees them, checked at every version.
pub(super) struct Pods {
    pub(super) limit: usize,
    /// Pods now: uid -> (name, live).
    pub(super) now: HashMap<String, (String, bool)>,
    /// The node each pod was first bound to.
    pub(super) bound: HashMap<String, String>,
    pub(super) max_live: usize,
    pub(super) over: bool,
}

impl Pods {
    fn note(&mut self, pod: &Pod, rv: i64, shared: &Shared) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty());
        match (self.bound.get(&uid), node) {
            (Some(first), Some(node)) if *first != node => shared.violation(
                Violation::PodOnTwoNodes,
                format!("pod {name} ({uid}) was bound to {first}, at version {rv} to {node}"),
            ),
            (Some(first), None) => shared.violation(
                Violation::PodOnTwoNodes,
                format!("pod {name} ({uid}) was bound to {first}, at version {rv} to no node"),
            ),
            (None, Some(node)) => {
                self.bound.insert(uid.clone(), node);
            }
            _ => {}
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let live = pod.metadata.deletion_timestamp.is_none()
            && !matches!(phase, Some("Failed") | Some("Succeeded"));
        self.now.insert(uid, (name, live));
    }

    fn count(&mut self, rv: i64, shared: &Shared) {
        let live: BTreeSet<&str> = self
            .now
            .values()
            .filter(|(_, live)| *live)
            .map(|(n, _)| n.as_str())
            .collect();
        self.max_live = self.max_live.max(live.len());
        // One violation per excursion above the limit.
        let over = live.len() > self.limit;
        if over && !self.over {
            shared.violation(
                Violation::TooManyPods,
                format!(
                    "{} live pods at version {rv} (limit {}): {}",
                    live.len(),
                    self.limit,
                    live.into_iter().collect::<Vec<_>>().join(" ")
                ),
            );
        }
        self.over = over;
    }
}

impl View<Pod> for Pods {
    fn listed(&mut self, items: &[Pod], rv: i64, shared: &Shared) {
        self.now.clear();
        for p in items {
            self.note(p, rv, shared);
        }
        self.count(rv, shared);
    }

    fn event(&mut self, deleted: bool, pod: &Pod, rv: i64, shared: &Shared) {
        if deleted {
            self.now
                .remove(pod.metadata.uid.as_deref().unwrap_or_default());
        } else {
            self.note(pod, rv, shared);
        }
        self.count(rv, shared);
    }
}

/// Changes the Deployment's image on every request, until the requests end; returns how many
/// changes were acknowledged.
pub(super) async fn roll(shared: Arc<Shared>, mut requests: mpsc::UnboundedReceiver<()>) -> u32 {
    let mut cursor = Cursor {
        member: 0,
        members: shared.clients.len(),
    };
    let mut changes = 0;
    let mut image = 0;
    while requests.recv().await.is_some() {
        image += 1;
        let patch = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "web", "image": format!("chaos.local/web:{image}")}]}}}});
        // Until one member takes it: a failed attempt may have been applied, and applying the
        // same image again changes nothing.
        let started = Instant::now();
        while started.elapsed() < RECOVERY_BOUND {
            let api: Api<Deployment> = shared.api(cursor.member);
            let (pp, merge) = (PatchParams::default(), Patch::Merge(&patch));
            match shared
                .call("patch deployment", api.patch("web", &pp, &merge))
                .await
            {
                Answer::Ok(_) => {
                    changes += 1;
                    break;
                }
                Answer::Failed => cursor.next(),
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    changes
}

pub(super) fn deployment() -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": REPLICAS,
            "selector": {"matchLabels": {"app": WEB_APP}},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": MAX_SURGE, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": WEB_APP}},
                "spec": {"terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "web", "image": "chaos.local/web:0"}]}}}
    }))?)
}

/// Whether the Deployment has rolled out its current template to exactly its replicas, with
/// every live pod on it; Err says what is still missing.
async fn rolled_out(shared: &Shared, on: usize) -> Result<(), String> {
    let api: Api<Deployment> = shared.api(on);
    let d = match shared.call("get deployment", api.get("web")).await {
        Answer::Ok(d) => d,
        _ => return Err(format!("{} did not answer", member(on))),
    };
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let st = d.status.clone().unwrap_or_default();
    let status = format!(
        "generation {:?} observed {:?}, replicas {want}: status replicas {:?} updated {:?} ready {:?} available {:?}",
        d.metadata.generation,
        st.observed_generation,
        st.replicas,
        st.updated_replicas,
        st.ready_replicas,
        st.available_replicas
    );
    let done = d.metadata.generation.is_some()
        && st.observed_generation == d.metadata.generation
        && [
            st.replicas,
            st.updated_replicas,
            st.ready_replicas,
            st.available_replicas,
        ]
        .iter()
        .all(|n| *n == Some(want));
    if !done {
        return Err(status);
    }
    let image = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.image)
        .unwrap_or_default();
    let pods: Api<Pod> = shared.api(on);
    let lp = ListParams::default().labels(&format!("app={WEB_APP}"));
    let list = match shared.call("list pods", pods.list(&lp)).await {
        Answer::Ok(l) => l,
        _ => return Err(format!("{status}; pods not listed")),
    };
    let live: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let current = live
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.as_deref())
                == Some(image.as_str())
        })
        .count();
    if live.len() != want as usize || current != live.len() {
        return Err(format!(
            "{status}; {} live pods, {current} with {image}",
            live.len()
        ));
    }
    Ok(())
}

/// Waits (bounded) until the Deployment has rolled out; how long since `started`, or Err: the
/// last thing missing.
pub(super) async fn converge(shared: &Shared, started: Instant) -> Result<Duration, String> {
    let mut i = 0;
    loop {
        match rolled_out(shared, i % shared.clients.len()).await {
            Ok(()) => return Ok(started.elapsed()),
            Err(missing) if started.elapsed() > CONVERGE_BOUND => return Err(missing),
            Err(_) => {}
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicI64;
    use std::sync::Mutex;

    use super::super::shared::{lock, History, Stats};
    use super::*;

    #[test]
    fn max_surge_resolves_as_kubernetes_does() {
        let cases = [
            (IntOrString::Int(1), 6, 1),
            (IntOrString::Int(0), 6, 0),
            (IntOrString::String("25%".into()), 6, 2),
            (IntOrString::String("25%".into()), 4, 1),
            (IntOrString::String("25%".into()), 3, 1),
            (IntOrString::String("50%".into()), 3, 2),
            (IntOrString::String("0%".into()), 6, 0),
            (IntOrString::String("100%".into()), 6, 6),
        ];
        for (surge, replicas, want) in cases {
            assert_eq!(
                resolve_surge(&surge, replicas).expect("resolves"),
                want,
                "{surge:?} of {replicas}"
            );
        }
        assert!(resolve_surge(&IntOrString::String("lots".into()), 6).is_err());
    }

    #[test]
    fn pods_over_the_limit_are_one_violation_per_excursion() {
        let shared = Shared {
            clients: Vec::new(),
            stats: Stats::default(),
            other_errors: Mutex::new(Vec::new()),
            found: Mutex::new(BTreeMap::new()),
            history: Mutex::new(History::default()),
            newest_acked: AtomicI64::new(0),
        };
        let pod = |uid: &str, node: Option<&str>, deleting: bool| -> Pod {
            let mut p = json!({"metadata": {"name": format!("p-{uid}"), "uid": uid},
                               "spec": {"containers": []}});
            if let Some(node) = node {
                p["spec"]["nodeName"] = json!(node);
            }
            if deleting {
                p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(p).expect("a pod")
        };
        let mut v = Pods {
            limit: 2,
            now: HashMap::new(),
            bound: HashMap::new(),
            max_live: 0,
            over: false,
        };
        v.listed(
            &[pod("1", Some("a"), false), pod("2", None, false)],
            1,
            &shared,
        );
        v.event(false, &pod("3", None, false), 2, &shared);
        v.event(false, &pod("4", None, false), 3, &shared);
        v.event(false, &pod("1", Some("a"), true), 4, &shared);
        v.event(true, &pod("1", Some("a"), true), 5, &shared);
        v.event(true, &pod("4", None, false), 6, &shared);
        v.event(false, &pod("5", None, false), 7, &shared);
        v.event(false, &pod("2", Some("b"), false), 8, &shared);
        v.event(false, &pod("2", Some("a"), false), 9, &shared);
        let found = lock(&shared.found).clone();
        assert_eq!(v.max_live, 4);
        assert_eq!(
            found.get(&Violation::TooManyPods).map(|f| f.0),
            Some(2),
            "{found:?}"
        );
        assert_eq!(
            found.get(&Violation::PodOnTwoNodes).map(|f| f.0),
            Some(1),
            "{found:?}"
        );
    }
}
