//! The replica count a Resource metric proposes, as Kubernetes' replica calculator works it
//! out (`GetResourceReplicas`, `GetRawResourceReplicas`): pods being deleted or failed are
//! ignored; pending pods, and for CPU pods not ready yet (or whose sample predates their
//! readiness), count as unready; pods without a sample are missing. The usage ratio of the
//! ready pods to the target decides, within the tolerance; then, conservatively, missing pods
//! count as at the target (scale-down) or idle (scale-up), unready ones as idle on a
//! scale-up, and a change of direction or a ratio within the tolerance keeps the count.

use std::collections::{BTreeMap, BTreeSet};

/// Milliseconds since the epoch.
pub type Ms = i64;

/// What the calculator needs of a pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    pub name: String,
    pub phase: String,
    pub deleting: bool,
    /// The Ready condition: (status is True, its lastTransitionTime).
    pub ready: Option<(bool, Ms)>,
    pub start: Option<Ms>,
    /// The sum of the containers' requests of the resource (milli-units), or the name of a
    /// container without one.
    pub request: Result<i64, String>,
}

/// One pod's sample: milli-units, when, and over how long (ms).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub value: i64,
    pub timestamp: Ms,
    pub window: Ms,
}

/// What the target of a Resource metric is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target {
    /// Percent of the pods' requests.
    Utilization(i64),
    /// Average usage per pod, milli-units.
    AverageValue(i64),
}

/// The calculator's settings (kube-controller-manager's flags).
#[derive(Debug, Clone, Copy)]
pub struct Calculator {
    pub tolerance: f64,
    /// `--horizontal-pod-autoscaler-cpu-initialization-period` (5 minutes).
    pub cpu_initialization: Ms,
    /// `--horizontal-pod-autoscaler-initial-readiness-delay` (30 seconds).
    pub initial_readiness_delay: Ms,
}

impl Default for Calculator {
    fn default() -> Self {
        Calculator {
            tolerance: 0.1,
            cpu_initialization: 300_000,
            initial_readiness_delay: 30_000,
        }
    }
}

/// A proposal: the replica count, and the current utilization (percent, for a Utilization
/// target) and average usage (milli-units) to report.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proposal {
    pub replicas: i32,
    pub utilization: Option<i64>,
    pub average: i64,
}

struct Groups {
    ready: usize,
    unready: BTreeSet<String>,
    missing: BTreeSet<String>,
    ignored: BTreeSet<String>,
}

fn group(
    calc: &Calculator,
    pods: &[PodInfo],
    samples: &BTreeMap<String, Sample>,
    cpu: bool,
    now: Ms,
) -> Groups {
    let mut g = Groups {
        ready: 0,
        unready: BTreeSet::new(),
        missing: BTreeSet::new(),
        ignored: BTreeSet::new(),
    };
    for p in pods {
        if p.deleting || p.phase == "Failed" {
            g.ignored.insert(p.name.clone());
            continue;
        }
        if p.phase == "Pending" {
            g.unready.insert(p.name.clone());
            continue;
        }
        let Some(sample) = samples.get(&p.name) else {
            g.missing.insert(p.name.clone());
            continue;
        };
        if cpu {
            let unready = match (p.ready, p.start) {
                (Some((ready, since)), Some(start)) => {
                    if start + calc.cpu_initialization > now {
                        !ready || sample.timestamp < since + sample.window
                    } else {
                        !ready && start + calc.initial_readiness_delay > since
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.insert(p.name.clone());
                continue;
            }
        }
        g.ready += 1;
    }
    g
}

/// (usage ratio, utilization percent, average milli-units) of `samples` against the pods'
/// requests (Kubernetes' GetResourceUtilizationRatio).
fn utilization_ratio(
    samples: &BTreeMap<String, Sample>,
    requests: &BTreeMap<String, i64>,
    target: i64,
) -> Result<(f64, i64, i64), String> {
    let (mut used, mut requested, mut n) = (0i64, 0i64, 0i64);
    for (pod, s) in samples {
        let Some(r) = requests.get(pod) else {
            continue;
        };
        used += s.value;
        requested += r;
        n += 1;
    }
    if requested == 0 {
        return Err("no metrics returned matched known pods".into());
    }
    let utilization = used * 100 / requested;
    Ok((utilization as f64 / target as f64, utilization, used / n))
}

/// (usage ratio, average) of `samples` against a per-pod target (GetMetricUsageRatio).
fn usage_ratio(samples: &BTreeMap<String, Sample>, target: i64) -> (f64, i64) {
    let total: i64 = samples.values().map(|s| s.value).sum();
    let average = total / samples.len().max(1) as i64;
    (average as f64 / target as f64, average)
}

/// The replicas a metric of `resource` proposes for `current` replicas over `pods`, or why it
/// cannot.
pub fn resource_replicas(
    calc: &Calculator,
    current: i32,
    target: Target,
    resource: &str,
    pods: &[PodInfo],
    samples: &BTreeMap<String, Sample>,
    now: Ms,
) -> Result<Proposal, String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    let g = group(calc, pods, samples, resource == "cpu", now);
    let mut samples: BTreeMap<String, Sample> = samples
        .iter()
        .filter(|(n, _)| {
            pods.iter().any(|p| &p.name == *n) && !g.ignored.contains(*n) && !g.unready.contains(*n)
        })
        .map(|(n, s)| (n.clone(), *s))
        .collect();
    if samples.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let zero = |value| Sample {
        value,
        timestamp: now,
        window: 0,
    };
    let tolerance = calc.tolerance;
    let mut requests = BTreeMap::new();
    if let Target::Utilization(_) = target {
        for p in pods {
            match &p.request {
                Ok(r) => {
                    requests.insert(p.name.clone(), *r);
                }
                Err(container) => {
                    return Err(format!(
                        "missing request for {resource} in container {container} of Pod {}",
                        p.name
                    ))
                }
            }
        }
    }
    // (usage ratio, utilization percent, average) of some samples against the target.
    let ratio_of = |samples: &BTreeMap<String, Sample>| match target {
        Target::Utilization(t) => {
            utilization_ratio(samples, &requests, t).map(|(r, u, a)| (r, Some(u), a))
        }
        Target::AverageValue(t) => {
            let (r, a) = usage_ratio(samples, t);
            Ok((r, None, a))
        }
    };
    let (ratio, utilization, average) = ratio_of(&samples)?;
    let proposal = |replicas| Proposal {
        replicas,
        utilization,
        average,
    };
    let with_unready = !g.unready.is_empty() && ratio > 1.0;
    if !with_unready && g.missing.is_empty() {
        if (1.0 - ratio).abs() <= tolerance {
            return Ok(proposal(current));
        }
        return Ok(proposal((ratio * g.ready as f64).ceil() as i32));
    }
    // Missing pods count as at the target (at least their whole request) on a scale-down,
    // as idle on a scale-up.
    for m in &g.missing {
        let assumed = match target {
            Target::Utilization(t) if ratio < 1.0 => {
                Some(requests.get(m).copied().unwrap_or(0) * t.max(100) / 100)
            }
            Target::Utilization(_) => (ratio > 1.0).then_some(0),
            Target::AverageValue(t) => Some(if ratio < 1.0 { t } else { 0 }),
        };
        if let Some(value) = assumed {
            samples.insert(m.clone(), zero(value));
        }
    }
    if with_unready {
        for u in &g.unready {
            samples.insert(u.clone(), zero(0));
        }
    }
    let (new_ratio, _, _) = ratio_of(&samples)?;
    Ok(proposal(settle(
        current,
        ratio,
        new_ratio,
        samples.len(),
        tolerance,
    )))
}

/// The count after the conservative pass: unchanged within the tolerance or when the
/// direction flipped, else the new ratio over the pods counted.
fn settle(current: i32, ratio: f64, new_ratio: f64, pods: usize, tolerance: f64) -> i32 {
    if (1.0 - new_ratio).abs() <= tolerance
        || (ratio < 1.0 && new_ratio > 1.0)
        || (ratio > 1.0 && new_ratio < 1.0)
    {
        return current;
    }
    let replicas = (new_ratio * pods as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return current;
    }
    replicas
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Ms = 1_000_000_000;

    /// A running pod, Ready since long ago, requesting 100m.
    fn pod(name: &str) -> PodInfo {
        PodInfo {
            name: name.into(),
            phase: "Running".into(),
            deleting: false,
            ready: Some((true, NOW - 600_000)),
            start: Some(NOW - 600_000),
            request: Ok(100),
        }
    }

    fn samples(values: &[(&str, i64)]) -> BTreeMap<String, Sample> {
        values
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    Sample {
                        value: *v,
                        timestamp: NOW,
                        window: 15_000,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn proposals() {
        let calc = Calculator::default();
        let mut pending = pod("c");
        pending.phase = "Pending".into();
        let mut deleting = pod("c");
        deleting.deleting = true;
        let mut fresh_unready = pod("c");
        fresh_unready.start = Some(NOW - 10_000);
        fresh_unready.ready = Some((false, NOW - 10_000));
        let mut sample_before_ready = pod("b");
        sample_before_ready.start = Some(NOW - 20_000);
        sample_before_ready.ready = Some((true, NOW - 5_000));
        type Case = (
            &'static str,
            i32,
            Target,
            Vec<PodInfo>,
            Vec<(&'static str, i64)>,
            Result<Proposal, &'static str>,
        );
        let table: Vec<Case> = vec![
            (
                "within the tolerance: no change",
                2,
                Target::Utilization(50),
                vec![pod("a"), pod("b")],
                vec![("a", 54), ("b", 54)],
                Ok(Proposal {
                    replicas: 2,
                    utilization: Some(54),
                    average: 54,
                }),
            ),
            (
                "double the target: twice the pods",
                2,
                Target::Utilization(50),
                vec![pod("a"), pod("b")],
                vec![("a", 100), ("b", 100)],
                Ok(Proposal {
                    replicas: 4,
                    utilization: Some(100),
                    average: 100,
                }),
            ),
            (
                "the ratio is rounded up",
                3,
                Target::Utilization(50),
                vec![pod("a"), pod("b"), pod("c")],
                vec![("a", 70), ("b", 70), ("c", 70)],
                Ok(Proposal {
                    replicas: 5,
                    utilization: Some(70),
                    average: 70,
                }),
            ),
            (
                "idle: scale down",
                4,
                Target::Utilization(50),
                vec![pod("a"), pod("b"), pod("c"), pod("d")],
                vec![("a", 10), ("b", 10), ("c", 10), ("d", 10)],
                Ok(Proposal {
                    replicas: 1,
                    utilization: Some(10),
                    average: 10,
                }),
            ),
            (
                "a missing pod counts at 100% on a scale-down",
                3,
                Target::Utilization(50),
                vec![pod("a"), pod("b"), pod("c")],
                vec![("a", 10), ("b", 10)],
                Ok(Proposal {
                    replicas: 3,
                    utilization: Some(10),
                    average: 10,
                }),
            ),
            (
                "a missing pod counts as idle on a scale-up",
                2,
                Target::Utilization(50),
                vec![pod("a"), pod("b")],
                vec![("a", 200)],
                Ok(Proposal {
                    replicas: 4,
                    utilization: Some(200),
                    average: 200,
                }),
            ),
            (
                "a pending pod counts as idle on a scale-up",
                2,
                Target::Utilization(50),
                vec![pod("a"), pod("b"), pending.clone()],
                vec![("a", 100), ("b", 100)],
                Ok(Proposal {
                    replicas: 4,
                    utilization: Some(100),
                    average: 100,
                }),
            ),
            (
                "a pending pod is left out of a scale-down",
                3,
                Target::Utilization(50),
                vec![pod("a"), pod("b"), pending],
                vec![("a", 10), ("b", 10)],
                Ok(Proposal {
                    replicas: 1,
                    utilization: Some(10),
                    average: 10,
                }),
            ),
            (
                "a pod being deleted is ignored",
                3,
                Target::Utilization(50),
                vec![pod("a"), pod("b"), deleting],
                vec![("a", 100), ("b", 100), ("c", 500)],
                Ok(Proposal {
                    replicas: 4,
                    utilization: Some(100),
                    average: 100,
                }),
            ),
            (
                "a starting pod not ready is unready",
                2,
                Target::Utilization(50),
                vec![pod("a"), fresh_unready],
                vec![("a", 100), ("c", 900)],
                Ok(Proposal {
                    replicas: 2,
                    utilization: Some(100),
                    average: 100,
                }),
            ),
            (
                "a sample from before the pod was ready is unready",
                2,
                Target::Utilization(50),
                vec![pod("a"), sample_before_ready],
                vec![("a", 100), ("b", 900)],
                Ok(Proposal {
                    replicas: 2,
                    utilization: Some(100),
                    average: 100,
                }),
            ),
            (
                "average value",
                2,
                Target::AverageValue(100),
                vec![pod("a"), pod("b")],
                vec![("a", 300), ("b", 300)],
                Ok(Proposal {
                    replicas: 6,
                    utilization: None,
                    average: 300,
                }),
            ),
            (
                "no pods",
                1,
                Target::Utilization(50),
                vec![],
                vec![],
                Err("no pods returned by selector while calculating replica count"),
            ),
            (
                "no samples",
                1,
                Target::Utilization(50),
                vec![pod("a")],
                vec![],
                Err("did not receive metrics for targeted pods (pods might be unready)"),
            ),
        ];
        for (what, current, target, pods, values, want) in table {
            let got =
                resource_replicas(&calc, current, target, "cpu", &pods, &samples(&values), NOW);
            assert_eq!(got, want.map_err(String::from), "{what}");
        }
    }

    #[test]
    fn a_container_without_a_request_is_an_error() {
        let mut p = pod("a");
        p.request = Err("web".into());
        let got = resource_replicas(
            &Calculator::default(),
            1,
            Target::Utilization(50),
            "cpu",
            &[p],
            &samples(&[("a", 10)]),
            NOW,
        );
        assert_eq!(
            got,
            Err("missing request for cpu in container web of Pod a".into())
        );
    }
}
