//! A Deployment's status from its ReplicaSets, with the conditions `kubectl rollout status`
//! reads: Available (enough pods available) and Progressing (what the rollout is doing, or that
//! it missed its progress deadline).

use rkube_core::json::int_at as int;
use serde_json::{json, Value};

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn condition(ty: &str, status: &str, reason: &str, message: &str, old: Option<&Value>) -> Value {
    let stamp = now();
    // The transition time moves only when the status does; the update time with any change.
    let transition = match old {
        Some(o) if o.get("status").and_then(Value::as_str) == Some(status) => {
            o.get("lastTransitionTime").cloned().unwrap_or(json!(stamp))
        }
        _ => json!(stamp),
    };
    let same = old.is_some_and(|o| {
        o.get("reason").and_then(Value::as_str) == Some(reason)
            && o.get("message").and_then(Value::as_str) == Some(message)
            && o.get("status").and_then(Value::as_str) == Some(status)
    });
    let update = match old {
        Some(o) if same => o.get("lastUpdateTime").cloned().unwrap_or(json!(stamp)),
        _ => json!(stamp),
    };
    json!({"type": ty, "status": status, "reason": reason, "message": message,
           "lastUpdateTime": update, "lastTransitionTime": transition})
}

/// The status, and whether the rollout is complete.
pub fn compute(
    d: &Value,
    new_rs: Option<&Value>,
    olds: &[Value],
    replicas: i64,
    max_unavailable: i64,
    created: Option<String>,
) -> (Value, bool) {
    let all: Vec<&Value> = olds.iter().chain(new_rs).collect();
    let actual: i64 = all.iter().map(|r| int(r, "/status/replicas")).sum();
    let spec_total: i64 = all.iter().map(|r| int(r, "/spec/replicas")).sum();
    let ready: i64 = all.iter().map(|r| int(r, "/status/readyReplicas")).sum();
    let available: i64 = all
        .iter()
        .map(|r| int(r, "/status/availableReplicas"))
        .sum();
    let updated = new_rs.map(|r| int(r, "/status/replicas")).unwrap_or(0);
    let new_available = new_rs
        .map(|r| int(r, "/status/availableReplicas"))
        .unwrap_or(0);
    let old_conditions: Vec<Value> = d
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let old = |ty: &str| {
        old_conditions
            .iter()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    };
    let generation = d
        .pointer("/metadata/generation")
        .cloned()
        .unwrap_or(json!(1));
    let complete = new_rs.is_some()
        && updated == replicas
        && actual == replicas
        && new_available == replicas
        && olds.iter().all(|r| int(r, "/status/replicas") == 0);
    let available_cond = if available >= replicas - max_unavailable {
        condition(
            "Available",
            "True",
            "MinimumReplicasAvailable",
            "Deployment has minimum availability.",
            old("Available"),
        )
    } else {
        condition(
            "Available",
            "False",
            "MinimumReplicasUnavailable",
            "Deployment does not have minimum availability.",
            old("Available"),
        )
    };
    let rs_name = new_rs
        .and_then(|r| r.pointer("/metadata/name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let previous = d.get("status");
    let progressed = previous.is_none_or(|p| {
        int(p, "/updatedReplicas") != updated
            || int(p, "/availableReplicas") != available
            || int(p, "/replicas") != actual
            || int(p, "/readyReplicas") != ready
    });
    let deadline = d
        .pointer("/spec/progressDeadlineSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(600);
    let last_update = old("Progressing")
        .and_then(|c| c.get("lastUpdateTime"))
        .and_then(Value::as_str)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    let timed_out = !complete
        && !progressed
        && last_update.is_some_and(|t| {
            (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds() > deadline
        });
    let progressing = if let Some(name) = &created {
        condition(
            "Progressing",
            "True",
            "NewReplicaSetCreated",
            &format!("Created new replica set \"{name}\""),
            old("Progressing"),
        )
    } else if complete {
        condition(
            "Progressing",
            "True",
            "NewReplicaSetAvailable",
            &format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            old("Progressing"),
        )
    } else if timed_out
        || old("Progressing")
            .and_then(|c| c.get("reason"))
            .and_then(Value::as_str)
            == Some("ProgressDeadlineExceeded")
            && !progressed
    {
        condition(
            "Progressing",
            "False",
            "ProgressDeadlineExceeded",
            &format!("ReplicaSet \"{rs_name}\" has timed out progressing."),
            old("Progressing"),
        )
    } else if progressed || old("Progressing").is_none() {
        // Any change restarts the deadline, even with the same reason.
        let mut c = condition(
            "Progressing",
            "True",
            "ReplicaSetUpdated",
            &format!("ReplicaSet \"{rs_name}\" is progressing."),
            old("Progressing"),
        );
        c["lastUpdateTime"] = json!(now());
        c
    } else {
        old("Progressing").cloned().unwrap_or(Value::Null)
    };
    let mut status = json!({
        "observedGeneration": generation,
        "replicas": actual,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
        "unavailableReplicas": (spec_total - available).max(0),
        "conditions": [available_cond, progressing],
    });
    // Kubernetes omits zero counts.
    for f in [
        "replicas",
        "updatedReplicas",
        "readyReplicas",
        "availableReplicas",
        "unavailableReplicas",
    ] {
        if status[f] == json!(0) {
            status.as_object_mut().map(|o| o.remove(f));
        }
    }
    if let Some(c) = d.pointer("/status/collisionCount") {
        status["collisionCount"] = c.clone();
    }
    (status, complete)
}
