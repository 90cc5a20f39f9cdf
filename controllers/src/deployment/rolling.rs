//! The arithmetic of a rolling update, as Kubernetes' deployment controller does it: how far the
//! new ReplicaSet may grow (maxSurge) and how far the old ones may shrink (maxUnavailable).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// An int-or-percent value resolved against `total`; percentages round up for maxSurge and down
/// for maxUnavailable.
pub fn resolve(value: &IntOrString, total: i64, round_up: bool) -> i64 {
    match value {
        IntOrString::Int(n) => i64::from(*n).max(0),
        IntOrString::String(s) => match s.strip_suffix('%') {
            Some(p) => {
                // Saturating: a value written by a user must not overflow the controller.
                let p: i64 = p.trim().parse().unwrap_or(0);
                let scaled = total.saturating_mul(p);
                if round_up {
                    scaled.saturating_add(99) / 100
                } else {
                    scaled / 100
                }
            }
            None => s.trim().parse().unwrap_or(0),
        },
    }
}

/// (maxSurge, maxUnavailable) for `replicas`; both zero would stall a rollout, so
/// maxUnavailable becomes 1 then (as in Kubernetes).
pub fn surge_and_unavailable(
    surge: &IntOrString,
    unavailable: &IntOrString,
    replicas: i64,
) -> (i64, i64) {
    let s = resolve(surge, replicas, true);
    let u = resolve(unavailable, replicas, false);
    if s == 0 && u == 0 {
        (0, 1)
    } else {
        (s, u)
    }
}

/// The new ReplicaSet's next size: grow towards `replicas` while all ReplicaSets together stay
/// within replicas + maxSurge.
pub fn new_rs_replicas(replicas: i64, max_surge: i64, all_pods: i64, new_rs: i64) -> i64 {
    let max_total = replicas.saturating_add(max_surge);
    if all_pods >= max_total {
        return new_rs;
    }
    let up = max_total
        .saturating_sub(all_pods)
        .min(replicas.saturating_sub(new_rs))
        .max(0);
    new_rs.saturating_add(up)
}

/// How many old pods may go now: all pods minus the minimum available, minus the new
/// ReplicaSet's pods that are not available yet (they may never become so).
pub fn old_scale_down_budget(
    replicas: i64,
    max_unavailable: i64,
    all_pods: i64,
    new_rs_replicas: i64,
    new_rs_available: i64,
) -> i64 {
    let min_available = replicas - max_unavailable;
    let new_unavailable = new_rs_replicas - new_rs_available;
    all_pods - min_available - new_unavailable
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(p: &str) -> IntOrString {
        IntOrString::String(p.to_string())
    }

    #[test]
    fn percentages_round_as_kubernetes_rounds_them() {
        assert_eq!(surge_and_unavailable(&pct("25%"), &pct("25%"), 3), (1, 0));
        assert_eq!(surge_and_unavailable(&pct("25%"), &pct("25%"), 4), (1, 1));
        assert_eq!(surge_and_unavailable(&pct("25%"), &pct("25%"), 10), (3, 2));
        assert_eq!(
            surge_and_unavailable(&IntOrString::Int(0), &IntOrString::Int(0), 10),
            (0, 1)
        );
        assert_eq!(
            surge_and_unavailable(&IntOrString::Int(2), &pct("50%"), 5),
            (2, 2)
        );
        // Absurd values saturate instead of overflowing.
        let huge = pct(&format!("{}%", i64::MAX));
        assert!(surge_and_unavailable(&huge, &huge, 10).0 > 0);
    }

    #[test]
    fn a_rollout_stays_inside_surge_and_unavailability() {
        // 3 replicas, surge 1, unavailable 0: the new set grows by one at a time.
        assert_eq!(new_rs_replicas(3, 1, 3, 0), 1);
        assert_eq!(new_rs_replicas(3, 1, 4, 1), 1);
        // Old pods may go only as new ones become available.
        assert_eq!(old_scale_down_budget(3, 0, 4, 1, 0), 0);
        assert_eq!(old_scale_down_budget(3, 0, 4, 1, 1), 1);
        // Scaling an idle deployment up is immediate.
        assert_eq!(new_rs_replicas(6, 2, 2, 2), 6);
    }
}
