//! From the replicas the metrics propose to the replicas set, as Kubernetes' HPA controller
//! normalizes them: recommendations are remembered and stabilized (the highest of the
//! scale-down window, the lowest of the scale-up window), then the rate of change is limited
//! — without `behavior` to twice the current count (at least 4) and to the bounds, with it by
//! the policies of the direction (each a number of pods or a percent per period, counted from
//! the scale events of that period; `selectPolicy` Max takes the largest change, Min the
//! smallest, Disabled none). Each step says why, in the AbleToScale and ScalingLimited
//! conditions' reasons and messages.

use super::replicas::Ms;

/// How a policy's value counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Pods,
    Percent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub kind: PolicyKind,
    pub value: i32,
    pub period_seconds: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    Max,
    Min,
    Disabled,
}

/// One direction's rules (`behavior.scaleUp` or `behavior.scaleDown`).
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    pub stabilization_seconds: i64,
    pub select: Select,
    pub policies: Vec<Policy>,
}

/// What one autoscaler remembers between syncs.
#[derive(Debug, Clone, Default)]
pub struct History {
    /// Unstabilized recommendations and when they were made.
    pub recommendations: Vec<(i32, Ms)>,
    /// Replicas added (up) or removed (down) by each rescale, and when.
    pub up: Vec<(i32, Ms)>,
    pub down: Vec<(i32, Ms)>,
}

/// A normalized count and the conditions it sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub replicas: i32,
    /// AbleToScale (True) reason and message.
    pub able: (&'static str, &'static str),
    /// ScalingLimited: whether it limited, reason and message.
    pub limited: (bool, &'static str, &'static str),
}

const READY: (&str, &str) = ("ReadyForNewScale", "recommended size matches current size");
const DOWN_STABILIZED: (&str, &str) = (
    "ScaleDownStabilized",
    "recent recommendations were higher than current one, applying the highest recent recommendation",
);
const UP_STABILIZED: (&str, &str) = (
    "ScaleUpStabilized",
    "recent recommendations were lower than current one, applying the lowest recent recommendation",
);
const WITHIN: (&str, &str) = (
    "DesiredWithinRange",
    "the desired count is within the acceptable range",
);
const TOO_FEW: (&str, &str) = (
    "TooFewReplicas",
    "the desired replica count is less than the minimum replica count",
);
const TOO_MANY: (&str, &str) = (
    "TooManyReplicas",
    "the desired replica count is more than the maximum replica count",
);
const UP_LIMIT: (&str, &str) = (
    "ScaleUpLimit",
    "the desired replica count is increasing faster than the maximum scale rate",
);
const DOWN_LIMIT: (&str, &str) = (
    "ScaleDownLimit",
    "the desired replica count is decreasing faster than the maximum scale rate",
);

impl History {
    /// The first recommendation of an autoscaler is its target's current count.
    pub fn record_initial(&mut self, current: i32, now: Ms) {
        if self.recommendations.is_empty() {
            self.recommendations.push((current, now));
        }
    }

    /// Keeps `desired`, in place of a sample older than every window when there is one.
    fn remember(&mut self, desired: i32, now: Ms, old: Option<usize>) {
        match old {
            Some(i) => self.recommendations[i] = (desired, now),
            None => self.recommendations.push((desired, now)),
        }
    }

    /// A rescale from `from` to `to`, counted against the policies of its direction for
    /// their longest period.
    pub fn record_rescale(&mut self, from: i32, to: i32, rules: (&Rules, &Rules), now: Ms) {
        let longest = |r: &Rules| {
            r.policies
                .iter()
                .map(|p| p.period_seconds)
                .max()
                .unwrap_or(0)
        };
        if to > from {
            let cutoff = now - longest(rules.0) * 1000;
            self.up.retain(|(_, t)| *t > cutoff);
            self.up.push((to - from, now));
        } else if to < from {
            let cutoff = now - longest(rules.1) * 1000;
            self.down.retain(|(_, t)| *t > cutoff);
            self.down.push((from - to, now));
        }
    }
}

fn change_in_period(events: &[(i32, Ms)], period_seconds: i64, now: Ms) -> i32 {
    let cutoff = now - period_seconds * 1000;
    events
        .iter()
        .filter(|(_, t)| *t > cutoff)
        .map(|(c, _)| c)
        .sum()
}

/// Without `behavior`: the highest recommendation of the downscale stabilization window, then
/// at most twice the current count (at least 4), within min and max.
pub fn normalize(
    h: &mut History,
    downscale_window_ms: Ms,
    (min, max): (i32, i32),
    current: i32,
    desired: i32,
    now: Ms,
) -> Normalized {
    let cutoff = now - downscale_window_ms;
    let mut stabilized = desired;
    let mut old = None;
    for (i, (r, t)) in h.recommendations.iter().enumerate() {
        if *t < cutoff {
            old = Some(i);
        } else if *r > stabilized {
            stabilized = *r;
        }
    }
    h.remember(desired, now, old);
    let able = if stabilized != desired {
        DOWN_STABILIZED
    } else {
        READY
    };
    let up_limit = ((2 * current) as f64).max(4.0) as i32;
    let (allowed_max, over) = if max > up_limit {
        (up_limit, UP_LIMIT)
    } else {
        (max, TOO_MANY)
    };
    let (replicas, why) = if stabilized < min {
        (min, TOO_FEW)
    } else if stabilized > allowed_max {
        (allowed_max, over)
    } else {
        (stabilized, WITHIN)
    };
    Normalized {
        replicas,
        able,
        limited: (replicas != stabilized, why.0, why.1),
    }
}

/// With `behavior`: stabilized within both windows, then limited by the policies.
pub fn normalize_with_behavior(
    h: &mut History,
    (up, down): (&Rules, &Rules),
    (min, max): (i32, i32),
    current: i32,
    desired: i32,
    now: Ms,
) -> Normalized {
    let up_cutoff = now - up.stabilization_seconds * 1000;
    let down_cutoff = now - down.stabilization_seconds * 1000;
    let (mut up_rec, mut down_rec) = (desired, desired);
    let mut old = None;
    for (i, (r, t)) in h.recommendations.iter().enumerate() {
        if *t > up_cutoff {
            up_rec = up_rec.min(*r);
        }
        if *t > down_cutoff {
            down_rec = down_rec.max(*r);
        }
        if *t < up_cutoff && *t < down_cutoff {
            old = Some(i);
        }
    }
    let stabilized = current.max(up_rec).min(down_rec);
    h.remember(desired, now, old);
    let able = if stabilized == desired {
        READY
    } else if desired >= current {
        UP_STABILIZED
    } else {
        DOWN_STABILIZED
    };
    let (replicas, why) = if stabilized > current {
        let limit = policy_limit(current, h, up, true, now).max(current);
        let (allowed, why) = if max > limit {
            (limit, UP_LIMIT)
        } else {
            (max, TOO_MANY)
        };
        if stabilized > allowed {
            (allowed, why)
        } else {
            (stabilized, WITHIN)
        }
    } else if stabilized < current {
        let limit = policy_limit(current, h, down, false, now).min(current);
        let (allowed, why) = if min < limit {
            (limit, DOWN_LIMIT)
        } else {
            (min, TOO_FEW)
        };
        if stabilized < allowed {
            (allowed, why)
        } else {
            (stabilized, WITHIN)
        }
    } else {
        (stabilized, WITHIN)
    };
    Normalized {
        replicas,
        able,
        limited: (replicas != stabilized, why.0, why.1),
    }
}

/// How far the policies of one direction let the count go now: the most replicas going up,
/// the fewest going down. Each policy counts from the count at the start of its period (the
/// rescales within it undone); Max takes the largest change, Min the smallest.
fn policy_limit(current: i32, h: &History, rules: &Rules, up: bool, now: Ms) -> i32 {
    if rules.select == Select::Disabled {
        return current;
    }
    let highest = (rules.select == Select::Max) == up;
    let mut result = if highest { i32::MIN } else { i32::MAX };
    for p in &rules.policies {
        let start = current - change_in_period(&h.up, p.period_seconds, now)
            + change_in_period(&h.down, p.period_seconds, now);
        let value = p.value as f64;
        let proposed = match (p.kind, up) {
            (PolicyKind::Pods, true) => start + p.value,
            (PolicyKind::Pods, false) => start - p.value,
            // Up rounds up, or a small count might never grow.
            (PolicyKind::Percent, true) => (start as f64 * (1.0 + value / 100.0)).ceil() as i32,
            (PolicyKind::Percent, false) => (start as f64 * (1.0 - value / 100.0)) as i32,
        };
        result = if highest {
            result.max(proposed)
        } else {
            result.min(proposed)
        };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(window: i64, select: Select, policies: &[(PolicyKind, i32, i64)]) -> Rules {
        Rules {
            stabilization_seconds: window,
            select,
            policies: policies
                .iter()
                .map(|(kind, value, period)| Policy {
                    kind: *kind,
                    value: *value,
                    period_seconds: *period,
                })
                .collect(),
        }
    }

    fn default_up() -> Rules {
        rules(
            0,
            Select::Max,
            &[(PolicyKind::Pods, 4, 15), (PolicyKind::Percent, 100, 15)],
        )
    }

    fn default_down(window: i64) -> Rules {
        rules(window, Select::Max, &[(PolicyKind::Percent, 100, 15)])
    }

    #[test]
    fn without_behavior() {
        // (history, current, desired, bounds) -> (replicas, able reason, limited, reason)
        type Case = (
            Vec<(i32, Ms)>,
            i32,
            i32,
            (i32, i32),
            (i32, &'static str, bool, &'static str),
        );
        let table: Vec<Case> = vec![
            (
                vec![],
                2,
                3,
                (1, 10),
                (3, "ReadyForNewScale", false, "DesiredWithinRange"),
            ),
            (
                vec![],
                2,
                12,
                (1, 10),
                (4, "ReadyForNewScale", true, "ScaleUpLimit"),
            ),
            (
                vec![],
                8,
                12,
                (1, 10),
                (10, "ReadyForNewScale", true, "TooManyReplicas"),
            ),
            (
                vec![],
                2,
                0,
                (1, 10),
                (1, "ReadyForNewScale", true, "TooFewReplicas"),
            ),
            // A higher recommendation 100 s ago holds a scale-down for 5 minutes...
            (
                vec![(5, 900_000)],
                5,
                2,
                (1, 10),
                (5, "ScaleDownStabilized", false, "DesiredWithinRange"),
            ),
            // ... but not once it is older than the window.
            (
                vec![(5, 500_000)],
                5,
                2,
                (1, 10),
                (2, "ReadyForNewScale", false, "DesiredWithinRange"),
            ),
        ];
        for (recs, current, desired, bounds, want) in table {
            let mut h = History {
                recommendations: recs.clone(),
                ..Default::default()
            };
            let n = normalize(&mut h, 300_000, bounds, current, desired, 1_000_000);
            assert_eq!(
                (n.replicas, n.able.0, n.limited.0, n.limited.1),
                want,
                "{recs:?} {current} -> {desired}"
            );
            assert!(h.recommendations.contains(&(desired, 1_000_000)));
        }
    }

    #[test]
    fn with_behavior() {
        let now = 1_000_000;
        let up = default_up();
        let slow_up = rules(0, Select::Max, &[(PolicyKind::Pods, 1, 60)]);
        let min_up = rules(
            0,
            Select::Min,
            &[(PolicyKind::Pods, 4, 15), (PolicyKind::Percent, 100, 15)],
        );
        let disabled = rules(0, Select::Disabled, &[(PolicyKind::Pods, 1, 15)]);
        let down = default_down(0);
        let held_down = default_down(60);
        let slow_down = rules(0, Select::Max, &[(PolicyKind::Percent, 50, 15)]);
        type Case<'a> = (
            &'a str,
            &'a Rules,
            &'a Rules,
            History,
            i32,
            i32,
            (i32, &'a str, &'a str),
        );
        let table: Vec<Case> = vec![
            (
                "up to the desired count",
                &up,
                &down,
                History::default(),
                2,
                5,
                (5, "ReadyForNewScale", "DesiredWithinRange"),
            ),
            (
                "Max: 4 pods or 100%, the larger",
                &up,
                &down,
                History::default(),
                10,
                40,
                (20, "ReadyForNewScale", "ScaleUpLimit"),
            ),
            (
                "Min: the smaller",
                &min_up,
                &down,
                History::default(),
                10,
                40,
                (14, "ReadyForNewScale", "ScaleUpLimit"),
            ),
            (
                "a policy's period counts the last rescales",
                &slow_up,
                &down,
                History {
                    up: vec![(1, now - 30_000)],
                    ..Default::default()
                },
                3,
                6,
                (3, "ReadyForNewScale", "ScaleUpLimit"),
            ),
            (
                "the bound limits before the policy",
                &up,
                &down,
                History::default(),
                8,
                40,
                (10, "ReadyForNewScale", "TooManyReplicas"),
            ),
            (
                "scaling up disabled",
                &disabled,
                &down,
                History::default(),
                2,
                5,
                (2, "ReadyForNewScale", "ScaleUpLimit"),
            ),
            (
                "down at once",
                &up,
                &down,
                History::default(),
                6,
                2,
                (2, "ReadyForNewScale", "DesiredWithinRange"),
            ),
            (
                "down by half a period",
                &up,
                &slow_down,
                History::default(),
                8,
                1,
                (4, "ReadyForNewScale", "ScaleDownLimit"),
            ),
            (
                "down held by the window",
                &up,
                &held_down,
                History {
                    recommendations: vec![(6, now - 30_000)],
                    ..Default::default()
                },
                6,
                2,
                (6, "ScaleDownStabilized", "DesiredWithinRange"),
            ),
            (
                "down below min",
                &up,
                &down,
                History::default(),
                3,
                0,
                (1, "ReadyForNewScale", "TooFewReplicas"),
            ),
        ];
        for (what, up, down, mut h, current, desired, want) in table {
            // The bound is 10 where a case is about it, else out of the way.
            let max = if what.starts_with("the bound") {
                10
            } else {
                100
            };
            let n = normalize_with_behavior(&mut h, (up, down), (1, max), current, desired, now);
            assert_eq!((n.replicas, n.able.0, n.limited.1), want, "{what}");
        }
    }

    #[test]
    fn rescales_are_remembered_for_the_longest_period() {
        let up = default_up();
        let down = default_down(0);
        let mut h = History::default();
        h.record_rescale(1, 3, (&up, &down), 0);
        h.record_rescale(3, 5, (&up, &down), 10_000);
        assert_eq!(change_in_period(&h.up, 15, 12_000), 4);
        h.record_rescale(5, 7, (&up, &down), 40_000);
        assert_eq!(h.up, vec![(2, 40_000)]);
        h.record_rescale(7, 2, (&up, &down), 41_000);
        assert_eq!(h.down, vec![(5, 41_000)]);
    }
}
