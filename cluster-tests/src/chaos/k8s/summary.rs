//! What a campaign reports: requests, explicit checks, and the summary with its verdict.

use std::collections::BTreeMap;
use std::time::Duration;

use super::violation::Violation;
use super::{Fault, FaultRecord};
use super::{MAX_SURGE, REPLICAS, WATCHERS};

/// Requests the clients made and how they were answered.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    pub made: u64,
    pub ok: u64,
    /// 409: Conflict (a stale resourceVersion) or AlreadyExists.
    pub conflict: u64,
    /// 410 Gone, as an answer or as a watch's ERROR event.
    pub gone: u64,
    pub not_found: u64,
    /// No answer in time, transport errors, and every other status.
    pub other: u64,
}

/// The explicit checks run after every fault: how many gave a definite answer, of how many.
#[derive(Debug, Clone, Default)]
pub struct Explicit {
    pub stale_update: (u32, u32),
    pub gone_watch: (u32, u32),
    pub gone_continue: (u32, u32),
}

#[derive(Debug)]
pub struct K8sSummary {
    pub seed: u64,
    pub duration: Duration,
    pub elapsed: Duration,
    pub faults: Vec<FaultRecord>,
    pub requests: Requests,
    /// The first few distinct "other" errors, to tell what they were.
    pub other_errors: Vec<String>,
    pub writes_acked: usize,
    pub updates_ok: usize,
    pub conflicts: usize,
    pub watch_sessions: usize,
    pub watch_events: usize,
    pub explicit: Explicit,
    pub image_changes: u32,
    pub pods_seen: usize,
    pub max_pods: usize,
    pub pod_limit: usize,
    pub converged: Option<Duration>,
    /// Per kind: how many, and the first few described.
    pub violations: BTreeMap<Violation, (usize, Vec<String>)>,
}

impl K8sSummary {
    pub fn passed(&self) -> bool {
        let e = &self.explicit;
        self.violations.is_empty()
            && self.converged.is_some()
            && !self.faults.is_empty()
            && self.faults.iter().all(|f| f.injected && f.recovered)
            && self.writes_acked > 0
            && self.updates_ok > 0
            && e.stale_update.0 > 0
            && e.gone_watch.0 > 0
            && e.gone_continue.0 > 0
    }

    pub fn table(&self) -> String {
        let mut out = format!(
            "Kubernetes chaos campaign: seed {}, {:.0} s of faults, {:.0} s in all\n",
            self.seed,
            self.duration.as_secs_f64(),
            self.elapsed.as_secs_f64()
        );
        out += &format!(
            "{:<14}{:>4}  {:>30}\n",
            "fault", "n", "API serving again p50 / max"
        );
        let mut by: BTreeMap<Fault, Vec<&FaultRecord>> = BTreeMap::new();
        for f in &self.faults {
            by.entry(f.fault).or_default().push(f);
        }
        for (kind, recs) in &by {
            let times: Vec<Duration> = recs.iter().filter_map(|r| r.to_write).collect();
            let failed = recs.iter().filter(|r| !r.injected || !r.recovered).count();
            out += &format!(
                "{:<14}{:>4}  {:>30}{}\n",
                kind.name(),
                recs.len(),
                p50_max(&times),
                if failed > 0 {
                    format!("  ({failed} not injected or not recovered)")
                } else {
                    String::new()
                }
            );
        }
        let r = &self.requests;
        out += &format!(
            "requests: {} made, {} ok, {} conflict (409), {} gone (410), {} not found (404), {} other errors\n",
            r.made, r.ok, r.conflict, r.gone, r.not_found, r.other
        );
        for e in &self.other_errors {
            out += &format!("  other error, e.g.: {e}\n");
        }
        out += &format!(
            "writes: {} acknowledged ({} updates with the resourceVersion they read), {} answered 409\n",
            self.writes_acked, self.updates_ok, self.conflicts
        );
        out += &format!(
            "watches: {} ConfigMap watchers, {} sessions, {} events\n",
            WATCHERS, self.watch_sessions, self.watch_events
        );
        let e = &self.explicit;
        out += &format!(
            "explicit checks (definite of run): stale update -> 409 {}/{}, compacted watch -> 410 {}/{}, compacted continue -> 410 {}/{}\n",
            e.stale_update.0, e.stale_update.1, e.gone_watch.0, e.gone_watch.1,
            e.gone_continue.0, e.gone_continue.1
        );
        out += &format!(
            "pods: {} seen, at most {} live at once (limit {} = {} replicas + maxSurge {})\n",
            self.pods_seen, self.max_pods, self.pod_limit, REPLICAS, MAX_SURGE
        );
        out += &format!(
            "deployment: {} image changes during the faults; converged after them: {}\n",
            self.image_changes,
            match self.converged {
                Some(d) => format!("yes, {:.1} s after the last fault healed", d.as_secs_f64()),
                None => "NO".into(),
            }
        );
        out += "violations:\n";
        for v in Violation::ALL {
            let (n, first) = self
                .violations
                .get(&v)
                .map(|(n, f)| (*n, f.as_slice()))
                .unwrap_or((0, &[]));
            out += &format!("  {:<24}{:>5}  {}\n", v.name(), n, v.meaning());
            for d in first {
                out += &format!("      {d}\n");
            }
        }
        out += if self.passed() { "PASS\n" } else { "FAIL\n" };
        out
    }
}

fn p50_max(times: &[Duration]) -> String {
    if times.is_empty() {
        return "-".into();
    }
    let mut t = times.to_vec();
    t.sort();
    format!(
        "{:.1} s / {:.1} s",
        t[(t.len() - 1) / 2].as_secs_f64(),
        t[t.len() - 1].as_secs_f64()
    )
}
