//! pods/eviction: a deletion that honours the PodDisruptionBudget covering the pod (Kubernetes'
//! `EvictionREST`). A pod that is not running (pending, finished, already being deleted) goes
//! without a budget check; a running one needs its budget's `disruptionsAllowed`, which the
//! eviction decrements with the budget's resourceVersion as precondition (another eviction
//! that won the race makes this one read the budget again), recording the pod in
//! `disruptedPods` until the disruption controller sees it go. An unready pod that the
//! budget's unhealthyPodEvictionPolicy lets go is deleted only if it has not changed since it
//! was read. A dry run decides and writes nothing.
//!
//! Before it deletes the pod, an eviction writes the pod's `DisruptionTarget` condition
//! (reason `EvictionByEvictionAPI`), as kube-apiserver 1.32 does, so that the pod's owner (a
//! Job's podFailurePolicy, for one) can tell an eviction from a failure. A pod that is already
//! being deleted is not marked: an update of it would end it at once here. Nor is one whose
//! eviction carries the client's own resourceVersion precondition: the deletion checks that
//! against the pod as the client read it, which marking it would move.

use rkube_core::selector::LabelSelector;
use serde_json::{json, Map, Value};

use crate::error::{ApiError, Cause};
use crate::query::{FieldSelector, Query};
use crate::storage::{Freshness, Stored};

use super::{now, success_status, Api, Target, UPDATE_RETRIES};

/// Kubernetes refuses an eviction while the budget has this many unconfirmed evictions.
const MAX_DISRUPTED_PODS: usize = 2000;

/// What an eviction does, decided from the pod and the budgets covering it.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Delete the pod without touching a budget.
    Delete,
    /// Delete the pod without touching a budget if it has not changed since it was read (an
    /// unready pod that the budget lets go: it must not have become Ready meanwhile).
    DeleteUnchanged,
    /// Store the budget with this new status, then delete the pod.
    Decrement(Value),
    Refuse(ApiError),
}

/// `pod` with the condition kube-apiserver's eviction writes, as `UpdatePodCondition` sets one:
/// an existing condition of the type is replaced, keeping its transition time while its
/// status holds.
fn with_disruption_target(pod: &Value, now: &str) -> Value {
    let mut pod = pod.clone();
    let mut condition = json!({
        "type": "DisruptionTarget",
        "status": "True",
        "lastProbeTime": null,
        "lastTransitionTime": now,
        "reason": "EvictionByEvictionAPI",
        "message": "Eviction API: evicting",
    });
    let Some(pod_map) = pod.as_object_mut() else {
        return pod;
    };
    let status = pod_map
        .entry("status")
        .or_insert_with(|| json!({}))
        .as_object_mut();
    let Some(status) = status else {
        return pod;
    };
    let conditions = status.entry("conditions").or_insert_with(|| json!([]));
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    let Some(list) = conditions.as_array_mut() else {
        return pod;
    };
    match list
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("DisruptionTarget"))
    {
        Some(old) => {
            if old.get("status").and_then(Value::as_str) == Some("True") {
                if let Some(t) = old.get("lastTransitionTime") {
                    condition["lastTransitionTime"] = t.clone();
                }
            }
            *old = condition;
        }
        None => list.push(condition),
    }
    pod
}

fn pod_ready(pod: &Value) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Whether the budget's selector selects the pod: a budget without a selector selects
/// nothing, an empty one every pod of its namespace (policy/v1).
pub(crate) fn covers(pdb: &Value, pod: &Value) -> bool {
    match pdb.pointer("/spec/selector") {
        Some(sel) if sel.is_object() => LabelSelector::from_json(sel).matches_object(pod),
        _ => false,
    }
}

fn too_many_requests(message: String, causes: Vec<Cause>) -> ApiError {
    let mut e = ApiError::new(429, "TooManyRequests", message);
    e.causes = causes;
    e
}

fn int(v: &Value, ptr: &str) -> i64 {
    v.pointer(ptr).and_then(Value::as_i64).unwrap_or(0)
}

/// The eviction's decision for `pod` under `pdbs` (the budgets that cover it), at `now`.
pub(crate) fn decide(pod: &Value, pdbs: &[&Value], now: &str) -> Decision {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
    if deleting || matches!(phase, Some("Succeeded" | "Failed" | "Pending")) {
        return Decision::Delete;
    }
    let pdb = match pdbs {
        [] => return Decision::Delete,
        [one] => *one,
        _ => {
            return Decision::Refuse(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ))
        }
    };
    let status = pdb.get("status").cloned().unwrap_or(json!({}));
    let (current, desired) = (
        int(&status, "/currentHealthy"),
        int(&status, "/desiredHealthy"),
    );
    if !pod_ready(pod) {
        let policy = pdb
            .pointer("/spec/unhealthyPodEvictionPolicy")
            .and_then(Value::as_str);
        // An unready pod does not count towards the budget: AlwaysAllow lets it go, and so
        // does the default IfHealthyBudget while the budget is met without it.
        if policy == Some("AlwaysAllow") || (current >= desired && desired > 0) {
            return Decision::DeleteUnchanged;
        }
    }
    let name = pdb
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let cause = |message: String| Cause {
        reason: "DisruptionBudget",
        field: String::new(),
        message,
    };
    if int(&status, "/observedGeneration") < int(pdb, "/metadata/generation") {
        return Decision::Refuse(too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            vec![cause(format!(
                "The disruption budget {name} is still being processed by the server."
            ))],
        ));
    }
    let allowed = int(&status, "/disruptionsAllowed");
    if allowed < 0 {
        return Decision::Refuse(ApiError::forbidden("pdb disruptions allowed is negative"));
    }
    let disrupted = status
        .get("disruptedPods")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if disrupted.len() > MAX_DISRUPTED_PODS {
        return Decision::Refuse(ApiError::forbidden(
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        ));
    }
    if allowed == 0 {
        return Decision::Refuse(too_many_requests(
            "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            vec![cause(format!(
                "The disruption budget {name} needs {desired} healthy pods and has {current} currently"
            ))],
        ));
    }
    let mut new = pdb.clone();
    let pod_name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut disrupted: Map<String, Value> = disrupted;
    disrupted.insert(pod_name.into(), json!(now));
    crate::value::set(
        &mut new,
        &["status", "disruptionsAllowed"],
        json!(allowed - 1),
    );
    crate::value::set(
        &mut new,
        &["status", "disruptedPods"],
        Value::Object(disrupted),
    );
    if allowed == 1 {
        let conditions = new
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut conditions: Vec<Value> = conditions
            .into_iter()
            .filter(|c| c["type"] != "DisruptionAllowed")
            .collect();
        conditions.push(json!({
            "type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
            "message": "", "lastTransitionTime": now,
            "observedGeneration": int(&status, "/observedGeneration"),
        }));
        crate::value::set(&mut new, &["status", "conditions"], json!(conditions));
    }
    Decision::Decrement(new)
}

impl Api {
    /// pods/eviction: evicts the pod if its budget allows (see the module's notes). Returns
    /// the Status a request answers.
    pub(super) async fn evict(
        &self,
        t: &Target,
        q: &Query,
        eviction: Value,
        fence: super::Fence,
    ) -> Result<Value, ApiError> {
        if let Some(n) = eviction.pointer("/metadata/name").and_then(Value::as_str) {
            if n != t.name() {
                return Err(ApiError::bad_request(
                    "name in URL does not match name in Eviction object",
                ));
            }
        }
        let opts = eviction.get("deleteOptions").cloned();
        let dry_run = q.dry_run()?
            || opts
                .as_ref()
                .and_then(|o| o.get("dryRun"))
                .and_then(Value::as_array)
                .is_some_and(|d| !d.is_empty());
        let Some(pdbs_res) = crate::resources::find("policy", "v1", "poddisruptionbudgets") else {
            return Err(ApiError::internal("poddisruptionbudgets are not served"));
        };
        let pdb_list = Target::new(pdbs_res, t.ns.clone(), None);
        let everything = FieldSelector::parse("", pdbs_res.kind)?;
        let client_rv = opts
            .as_ref()
            .and_then(|o| o.pointer("/preconditions/resourceVersion"))
            .is_some_and(|rv| !rv.is_null());
        for _ in 0..UPDATE_RETRIES {
            let pod = self.get(t, &Query::default()).await?;
            let (pdbs, _, _) = self
                .select(
                    &pdb_list,
                    &Default::default(),
                    &everything,
                    0,
                    None,
                    Freshness::Latest,
                )
                .await?;
            let covering: Vec<&Value> = pdbs.iter().filter(|p| covers(p, &pod.object)).collect();
            let decision = decide(&pod.object, &covering, &now());
            // A dry run (in the query, or in the Eviction's deleteOptions as `kubectl drain
            // --dry-run=server` sends it) decides and writes nothing.
            match decision {
                Decision::Refuse(e) => return Err(e),
                _ if dry_run => return Ok(success_status()),
                Decision::Delete => {}
                Decision::DeleteUnchanged => {
                    // The pod as read is the precondition (unless the client set its own);
                    // a pod that changed meanwhile is decided again. Marking it moves its
                    // resourceVersion, and the deletion's precondition with it.
                    let mut pinned = opts.clone().unwrap_or_else(|| json!({}));
                    if !client_rv {
                        let Some(revision) = self.mark_evicted(t, &pod, fence).await? else {
                            continue;
                        };
                        crate::value::set(
                            &mut pinned,
                            &["preconditions", "resourceVersion"],
                            json!(revision.to_string()),
                        );
                    }
                    match self.delete(t, q, Some(&pinned), fence).await {
                        Err(e) if e.code == 409 && !client_rv => continue,
                        Err(e) => return Err(e),
                        Ok(_) => return Ok(success_status()),
                    }
                }
                Decision::Decrement(new) => {
                    if !self
                        .take_disruption(pdbs_res, t, covering[0], new, fence)
                        .await?
                    {
                        continue;
                    }
                }
            }
            // The budget is taken (or none was needed): the pod goes now. Marking it is retried
            // on the pod as it is, as kube-apiserver's update of the condition is, so that a
            // disruption taken is not taken twice.
            if !client_rv {
                let mut pod = pod;
                for _ in 0..UPDATE_RETRIES {
                    if self.mark_evicted(t, &pod, fence).await?.is_some() {
                        break;
                    }
                    pod = self.get(t, &Query::default()).await?;
                }
            }
            self.delete(t, q, opts.as_ref(), fence).await?;
            return Ok(success_status());
        }
        Err(too_many_requests(
            "Too many concurrent evictions; try again".into(),
            Vec::new(),
        ))
    }

    /// Writes the `DisruptionTarget` condition onto `pod` if it has not changed since it was
    /// read, and answers its new resourceVersion (`None`: it changed). A pod already being
    /// deleted is left as it is (its revision is answered).
    async fn mark_evicted(
        &self,
        t: &Target,
        pod: &Stored,
        fence: super::Fence,
    ) -> Result<Option<i64>, ApiError> {
        if pod.object.pointer("/metadata/deletionTimestamp").is_some() {
            return Ok(Some(pod.revision));
        }
        let marked = with_disruption_target(&pod.object, &now());
        Ok(self
            .commit(t, pod, marked, false, fence)
            .await?
            .map(|s| s.revision))
    }

    /// Stores the budget `read` as `new` if it has not changed since it was read. Answers
    /// whether it was stored (false: another writer moved it first).
    async fn take_disruption(
        &self,
        pdbs: &'static crate::resources::Resource,
        pod: &Target,
        read: &Value,
        new: Value,
        fence: super::Fence,
    ) -> Result<bool, ApiError> {
        let name = new
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let target = Target::new(pdbs, pod.ns.clone(), Some(name));
        // The budget as read: its resourceVersion is the write's precondition.
        let revision = read
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .and_then(|rv| rv.parse::<i64>().ok())
            .unwrap_or(0);
        let current = Stored {
            object: read.clone(),
            revision,
        };
        Ok(self
            .commit(&target, &current, new, false, fence)
            .await?
            .is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, ready: bool) -> Value {
        json!({"metadata": {"name": "web-1", "labels": {"app": "web"}},
               "status": {"phase": phase, "conditions": [
                   {"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    fn pdb(allowed: i64, current: i64, desired: i64, extra: Value) -> Value {
        let mut p = json!({"metadata": {"name": "web", "generation": 1},
               "spec": {"selector": {"matchLabels": {"app": "web"}}},
               "status": {"observedGeneration": 1, "disruptionsAllowed": allowed,
                          "currentHealthy": current, "desiredHealthy": desired,
                          "expectedPods": 2}});
        if let Some(e) = extra.as_object() {
            for (k, v) in e {
                crate::value::set(&mut p, &["spec", k], v.clone());
            }
        }
        p
    }

    #[derive(Debug, PartialEq)]
    enum Want {
        Delete,
        DeleteUnchanged,
        Decrement(i64),
        Refuse(u16, &'static str),
    }

    #[test]
    fn decisions_are_kubernetes_ones() {
        let one = pdb(1, 2, 1, json!({}));
        let none = pdb(0, 1, 1, json!({}));
        let unmet = pdb(0, 0, 1, json!({}));
        let always = pdb(
            0,
            0,
            1,
            json!({"unhealthyPodEvictionPolicy": "AlwaysAllow"}),
        );
        let mut stale = pdb(1, 2, 1, json!({}));
        stale["metadata"]["generation"] = json!(2);
        let mut terminating = pod("Running", true);
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let cases: Vec<(&str, Value, Vec<&Value>, Want)> = vec![
            ("no budget", pod("Running", true), vec![], Want::Delete),
            ("budget allows", pod("Running", true), vec![&one], Want::Decrement(0)),
            (
                "budget exhausted",
                pod("Running", true),
                vec![&none],
                Want::Refuse(429, "Cannot evict pod as it would violate the pod's disruption budget."),
            ),
            ("pending pod", pod("Pending", false), vec![&none], Want::Delete),
            ("terminating pod", terminating, vec![&none], Want::Delete),
            ("finished pod", pod("Succeeded", false), vec![&none], Want::Delete),
            (
                "unready pod, budget met without it",
                pod("Running", false),
                vec![&none],
                Want::DeleteUnchanged,
            ),
            (
                "unready pod, budget unmet",
                pod("Running", false),
                vec![&unmet],
                Want::Refuse(429, "Cannot evict pod"),
            ),
            (
                "unready pod, AlwaysAllow",
                pod("Running", false),
                vec![&always],
                Want::DeleteUnchanged,
            ),
            (
                "two budgets",
                pod("Running", true),
                vec![&one, &one],
                Want::Refuse(500, "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."),
            ),
            (
                "budget not yet observed",
                pod("Running", true),
                vec![&stale],
                Want::Refuse(429, "Cannot evict pod"),
            ),
        ];
        for (name, pod, pdbs, want) in cases {
            let got = match decide(&pod, &pdbs, "2026-01-01T00:00:00Z") {
                Decision::Delete => Want::Delete,
                Decision::DeleteUnchanged => Want::DeleteUnchanged,
                Decision::Decrement(new) => {
                    assert_eq!(
                        new["status"]["disruptedPods"]["web-1"], "2026-01-01T00:00:00Z",
                        "{name}"
                    );
                    Want::Decrement(int(&new, "/status/disruptionsAllowed"))
                }
                Decision::Refuse(e) => {
                    let Want::Refuse(code, msg) = want else {
                        panic!("{name}: refused with {e:?}");
                    };
                    assert_eq!(e.code, code, "{name}");
                    assert!(e.message.starts_with(msg), "{name}: {}", e.message);
                    continue;
                }
            };
            assert_eq!(got, want, "{name}");
        }
        // The refusal names the budget's numbers, as Kubernetes' cause does.
        let Decision::Refuse(e) = decide(&pod("Running", true), &[&none], "now") else {
            panic!("not refused");
        };
        let status = e.status();
        assert_eq!(
            (&status["code"], &status["reason"]),
            (&json!(429), &json!("TooManyRequests"))
        );
        assert_eq!(
            status["details"]["causes"],
            json!([{"reason": "DisruptionBudget",
                    "message": "The disruption budget web needs 1 healthy pods and has 1 currently"}])
        );
    }

    #[test]
    fn the_disruption_target_condition_is_written_as_kubernetes_writes_it() {
        let fresh = with_disruption_target(&pod("Running", true), "2026-12-06T02:00:00Z");
        let conditions = fresh["status"]["conditions"]
            .as_array()
            .expect("conditions");
        assert_eq!(conditions.len(), 2);
        assert_eq!(
            conditions[1],
            json!({"type": "DisruptionTarget", "status": "True", "lastProbeTime": null,
                   "lastTransitionTime": "2026-12-06T02:00:00Z",
                   "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"})
        );
        // Marked again (a retried eviction): replaced in place, the transition time kept.
        let again = with_disruption_target(&fresh, "2026-12-06T03:00:00Z");
        let conditions = again["status"]["conditions"]
            .as_array()
            .expect("conditions");
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[1]["lastTransitionTime"], "2026-12-06T02:00:00Z");
        // A pod without a status gets one.
        let bare = with_disruption_target(&json!({"metadata": {"name": "p"}}), "t");
        assert_eq!(
            bare["status"]["conditions"][0]["reason"],
            "EvictionByEvictionAPI"
        );
    }

    #[test]
    fn selectors_cover_as_policy_v1() {
        let p = pod("Running", true);
        assert!(covers(&json!({"spec": {"selector": {}}}), &p));
        assert!(!covers(&json!({"spec": {}}), &p));
        assert!(covers(&pdb(0, 0, 0, json!({})), &p));
        assert!(!covers(
            &json!({"spec": {"selector": {"matchLabels": {"app": "db"}}}}),
            &p
        ));
    }
}
