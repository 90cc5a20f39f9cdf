//! The next step of a RollingUpdate, as Kubernetes' DaemonSet controller takes it, worked out
//! from what each node holds.
//!
//! Without surge, old pods are deleted while the unavailable pods stay within maxUnavailable
//! (an old pod that is not available anyway is replaced at once); the placing loop then
//! creates the new pod on each emptied node. With surge, a new pod is created beside an old
//! one on at most maxSurge nodes at a time (at once where the old one is not available), and
//! the old one is deleted when the new one is available.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// One daemon pod, as the rolling update sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    pub name: String,
    pub available: bool,
}

/// What one node holds of a DaemonSet (pods being deleted left out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSlot {
    pub node: String,
    pub should_run: bool,
    /// The pod of the current revision, if one.
    pub new: Option<PodState>,
    /// The pod of an older revision, if one.
    pub old: Option<PodState>,
    /// More than one new or more than one old pod: the placing loop cleans this node first.
    pub excess: bool,
}

/// The step: pods to delete and nodes to create a new pod on.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Step {
    pub delete: Vec<String>,
    pub create_on: Vec<String>,
}

/// An int-or-percent of `total`, percentages rounded up (Kubernetes'
/// `GetScaledValueFromIntOrPercent(.., true)`); a malformed value counts as 0.
pub fn scaled(v: Option<&IntOrString>, total: i64) -> i64 {
    match v {
        Some(IntOrString::Int(n)) => i64::from(*n),
        Some(IntOrString::String(s)) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(0, |p| (p * total + 99) / 100),
        None => 0,
    }
}

/// maxSurge and maxUnavailable for `desired` nodes; both zero means one unavailable.
pub fn limits(
    surge: Option<&IntOrString>,
    unavailable: Option<&IntOrString>,
    desired: i64,
) -> (i64, i64) {
    let (surge, unavailable) = (scaled(surge, desired), scaled(unavailable, desired));
    if desired > 0 && surge == 0 && unavailable == 0 {
        return (0, 1);
    }
    (surge, unavailable)
}

/// The next step over `slots` (in node order), with `max_surge` and `max_unavailable` already
/// scaled, and `desired` the number of nodes that should run the pod.
pub fn next_step(slots: &[NodeSlot], max_surge: i64, max_unavailable: i64, desired: i64) -> Step {
    if max_surge == 0 {
        without_surge(slots, max_unavailable)
    } else {
        with_surge(slots, max_surge, desired)
    }
}

fn without_surge(slots: &[NodeSlot], max_unavailable: i64) -> Step {
    let mut unavailable = 0;
    let mut replace_now = Vec::new();
    let mut candidates = Vec::new();
    for slot in slots {
        if slot.excess {
            unavailable += 1;
            continue;
        }
        match (&slot.new, &slot.old) {
            // The placing loop creates or deletes here: unavailable meanwhile.
            (None, None) | (Some(_), Some(_)) => unavailable += 1,
            (Some(new), None) => {
                if !new.available {
                    unavailable += 1;
                }
            }
            (None, Some(old)) => {
                if !old.available {
                    replace_now.push(old.name.clone());
                } else if unavailable < max_unavailable {
                    candidates.push(old.name.clone());
                }
            }
        }
    }
    let room = (max_unavailable - unavailable).clamp(0, candidates.len() as i64) as usize;
    replace_now.extend(candidates.into_iter().take(room));
    Step {
        delete: replace_now,
        create_on: Vec::new(),
    }
}

fn with_surge(slots: &[NodeSlot], max_surge: i64, desired: i64) -> Step {
    let mut step = Step::default();
    let mut not_wanted = Vec::new();
    let mut candidates = Vec::new();
    let mut surging = 0;
    let mut available = 0;
    for slot in slots {
        if slot.excess {
            surging += 1;
            continue;
        }
        let counted = slot.old.as_ref().or(slot.new.as_ref());
        if counted.is_some_and(|p| p.available) {
            available += 1;
        }
        match (&slot.new, &slot.old) {
            (_, None) => {}
            (None, Some(old)) if !old.available => {
                if slot.should_run {
                    step.create_on.push(slot.node.clone());
                } else {
                    step.delete.push(old.name.clone());
                }
            }
            (None, Some(old)) => {
                if !slot.should_run {
                    not_wanted.push(old.name.clone());
                } else if surging < max_surge {
                    candidates.push(slot.node.clone());
                }
            }
            (Some(new), Some(old)) => {
                if new.available {
                    step.delete.push(old.name.clone());
                } else {
                    surging += 1;
                }
            }
        }
    }
    // An old pod on a node that no longer wants one goes only once enough others are
    // available: with surge the owner expects every pod to stay up.
    let deletable = (available - desired).clamp(0, not_wanted.len() as i64) as usize;
    step.delete.extend(not_wanted.into_iter().take(deletable));
    let room = (max_surge - surging).clamp(0, candidates.len() as i64) as usize;
    step.create_on.extend(candidates.into_iter().take(room));
    step
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node from a short spelling: "-" nothing, "o"/"O" an old pod unavailable/available,
    /// "n"/"N" a new one, "oN" both; "x" excess pods; a leading "!" when the node should not
    /// run the pod.
    fn slot(i: usize, s: &str) -> NodeSlot {
        let (should_run, s) = match s.strip_prefix('!') {
            Some(rest) => (false, rest),
            None => (true, s),
        };
        let pod = |c: char, kind: &str| {
            s.chars()
                .find(|x| x.eq_ignore_ascii_case(&c))
                .map(|x| PodState {
                    name: format!("{kind}{i}"),
                    available: x.is_ascii_uppercase(),
                })
        };
        NodeSlot {
            node: format!("n{i}"),
            should_run,
            new: pod('n', "new"),
            old: pod('o', "old"),
            excess: s == "x",
        }
    }

    fn slots(spec: &[&str]) -> Vec<NodeSlot> {
        spec.iter().enumerate().map(|(i, s)| slot(i, s)).collect()
    }

    #[test]
    fn limits_scale_percentages_up_and_never_stall() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(
            limits(Some(&IntOrString::Int(0)), Some(&IntOrString::Int(1)), 5),
            (0, 1)
        );
        assert_eq!(
            limits(Some(&pct("10%")), Some(&IntOrString::Int(0)), 5),
            (1, 0)
        );
        assert_eq!(limits(None, Some(&pct("50%")), 5), (0, 3));
        assert_eq!(limits(Some(&pct("0%")), Some(&pct("0%")), 5), (0, 1));
        assert_eq!(limits(None, None, 0), (0, 0));
    }

    #[test]
    fn the_next_step_of_a_rolling_update() {
        // (what the case shows, nodes, maxSurge, maxUnavailable, deleted, created on)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            i64,
            i64,
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: &[Case] = &[
            ("one at a time", &["O", "O", "O"], 0, 1, &["old0"], &[]),
            (
                "two at a time",
                &["O", "O", "O"],
                0,
                2,
                &["old0", "old1"],
                &[],
            ),
            (
                "a new pod not yet available holds the next",
                &["N", "n", "O"],
                0,
                1,
                &[],
                &[],
            ),
            (
                "the next once it is",
                &["N", "N", "O"],
                0,
                1,
                &["old2"],
                &[],
            ),
            (
                "an unavailable old pod is replaced at once",
                &["n", "o", "O"],
                0,
                1,
                &["old1"],
                &[],
            ),
            (
                "an empty node counts as unavailable",
                &["-", "O"],
                0,
                1,
                &[],
                &[],
            ),
            ("done", &["N", "N"], 0, 1, &[], &[]),
            (
                "surge: a new pod beside the old",
                &["O", "O", "O"],
                1,
                0,
                &[],
                &["n0"],
            ),
            ("surge two", &["O", "O", "O"], 2, 0, &[], &["n0", "n1"]),
            ("surge waits for the new pod", &["nO", "O"], 1, 0, &[], &[]),
            (
                "then deletes the old one",
                &["NO", "O"],
                1,
                0,
                &["old0"],
                &["n1"],
            ),
            (
                "surge replaces an unavailable old pod at once",
                &["nO", "o"],
                1,
                0,
                &[],
                &["n1"],
            ),
            ("excess pods hold the surge", &["x", "O"], 1, 0, &[], &[]),
            (
                "an old pod where it no longer belongs waits for availability",
                &["!O", "n"],
                1,
                0,
                &[],
                &[],
            ),
            (
                "and goes when enough others are up",
                &["!O", "N", "N"],
                1,
                0,
                &["old0"],
                &[],
            ),
        ];
        for (what, nodes, surge, unavailable, delete, create_on) in cases {
            let s = slots(nodes);
            let desired = s.iter().filter(|x| x.should_run).count() as i64;
            let step = next_step(&s, *surge, *unavailable, desired);
            assert_eq!(step.delete, *delete, "{what}: deleted");
            assert_eq!(step.create_on, *create_on, "{what}: created on");
        }
    }
}
