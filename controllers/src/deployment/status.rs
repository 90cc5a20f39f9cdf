//! A Deployment's status from its ReplicaSets, with the conditions `kubectl rollout status`
//! reads: Available (enough pods available) and Progressing (what the rollout is doing, or that
//! it missed its progress deadline).

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{available, spec_replicas, status_replicas};

fn condition(
    ty: &str,
    status: &str,
    reason: &str,
    message: &str,
    old: Option<&DeploymentCondition>,
) -> DeploymentCondition {
    let stamp = Time(crate::pods::now());
    // The transition time moves only when the status does; the update time with any change.
    let transition = match old {
        Some(o) if o.status == status => o.last_transition_time.clone(),
        _ => None,
    };
    let same = old.is_some_and(|o| {
        o.reason.as_deref() == Some(reason)
            && o.message.as_deref() == Some(message)
            && o.status == status
    });
    let update = match old {
        Some(o) if same => o.last_update_time.clone(),
        _ => None,
    };
    DeploymentCondition {
        type_: ty.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        last_update_time: Some(update.unwrap_or_else(|| stamp.clone())),
        last_transition_time: Some(transition.unwrap_or(stamp)),
    }
}

/// Kubernetes omits zero counts.
fn nonzero(n: i64) -> Option<i32> {
    (n != 0).then(|| i32::try_from(n).unwrap_or(i32::MAX))
}

/// The status, and whether the rollout is complete.
pub fn compute(
    d: &Deployment,
    new_rs: Option<&ReplicaSet>,
    olds: &[ReplicaSet],
    replicas: i64,
    max_unavailable: i64,
    created: Option<String>,
) -> (DeploymentStatus, bool) {
    let all: Vec<&ReplicaSet> = olds.iter().chain(new_rs).collect();
    let ready_of = |r: &ReplicaSet| {
        i64::from(
            r.status
                .as_ref()
                .and_then(|s| s.ready_replicas)
                .unwrap_or(0),
        )
    };
    let actual: i64 = all.iter().map(|r| status_replicas(r)).sum();
    let spec_total: i64 = all.iter().map(|r| spec_replicas(r)).sum();
    let ready: i64 = all.iter().map(|r| ready_of(r)).sum();
    let available_total: i64 = all.iter().map(|r| available(r)).sum();
    let updated = new_rs.map(status_replicas).unwrap_or(0);
    let new_available = new_rs.map(available).unwrap_or(0);
    let previous = d.status.as_ref();
    let old = |ty: &str| {
        previous
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == ty))
    };
    let complete = new_rs.is_some()
        && updated == replicas
        && actual == replicas
        && new_available == replicas
        && olds.iter().all(|r| status_replicas(r) == 0);
    let available_cond = if available_total >= replicas - max_unavailable {
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
        .and_then(|r| r.metadata.name.as_deref())
        .unwrap_or("");
    let count = |f: Option<i32>| i64::from(f.unwrap_or(0));
    let progressed = previous.is_none_or(|p| {
        count(p.updated_replicas) != updated
            || count(p.available_replicas) != available_total
            || count(p.replicas) != actual
            || count(p.ready_replicas) != ready
    });
    let deadline = i64::from(
        d.spec
            .as_ref()
            .and_then(|s| s.progress_deadline_seconds)
            .unwrap_or(600),
    );
    let last_update = old("Progressing").and_then(|c| c.last_update_time.as_ref());
    let timed_out = !complete
        && !progressed
        && last_update.is_some_and(|t| crate::pods::now().as_second() - t.0.as_second() > deadline);
    let old_reason = old("Progressing").and_then(|c| c.reason.as_deref());
    let progressing = if let Some(name) = &created {
        Some(condition(
            "Progressing",
            "True",
            "NewReplicaSetCreated",
            &format!("Created new replica set \"{name}\""),
            old("Progressing"),
        ))
    } else if complete {
        Some(condition(
            "Progressing",
            "True",
            "NewReplicaSetAvailable",
            &format!("ReplicaSet \"{rs_name}\" has successfully progressed."),
            old("Progressing"),
        ))
    } else if timed_out || old_reason == Some("ProgressDeadlineExceeded") && !progressed {
        Some(condition(
            "Progressing",
            "False",
            "ProgressDeadlineExceeded",
            &format!("ReplicaSet \"{rs_name}\" has timed out progressing."),
            old("Progressing"),
        ))
    } else if progressed || old("Progressing").is_none() {
        // Any change restarts the deadline, even with the same reason.
        let mut c = condition(
            "Progressing",
            "True",
            "ReplicaSetUpdated",
            &format!("ReplicaSet \"{rs_name}\" is progressing."),
            old("Progressing"),
        );
        c.last_update_time = Some(Time(crate::pods::now()));
        Some(c)
    } else {
        old("Progressing").cloned()
    };
    let status = DeploymentStatus {
        observed_generation: Some(d.metadata.generation.unwrap_or(1)),
        replicas: nonzero(actual),
        updated_replicas: nonzero(updated),
        ready_replicas: nonzero(ready),
        available_replicas: nonzero(available_total),
        unavailable_replicas: nonzero((spec_total - available_total).max(0)),
        conditions: Some(std::iter::once(available_cond).chain(progressing).collect()),
        collision_count: previous.and_then(|s| s.collision_count),
    };
    (status, complete)
}
