//! What a campaign reports: each fault with its recovery, the checks' findings, and the
//! verdict.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Config, Fault, FaultRecord};
use crate::chaos::check;
use crate::powerfs::CutReport;

#[derive(Debug)]
pub struct Summary {
    pub config: Config,
    pub faults: Vec<FaultRecord>,
    pub ops: usize,
    pub answered: usize,
    pub unknown: usize,
    pub appends_tried: u64,
    pub acked: usize,
    /// Acknowledged appends missing from the final state (none when it could not be read).
    pub lost: Vec<String>,
    /// Whether the final state could be read (a cluster that never came back cannot be).
    pub final_state: Result<(), String>,
    pub linearizable: check::Verdict,
    pub check_time: Duration,
    pub watch: check::WatchReport,
    pub revisions: Result<(), String>,
    /// Whether every member has the same HashKV at one revision after the campaign: what
    /// they agreed on, or where they did not.
    pub hashes: Result<String, String>,
    pub elapsed: Duration,
}

impl Summary {
    pub fn passed(&self) -> bool {
        let w = &self.watch;
        self.lost.is_empty()
            && self.final_state.is_ok()
            && self.linearizable.linearizable == Some(true)
            && w.ordered
            && w.unique
            && w.reliable
            && w.atomic
            && w.resumable
            && w.bookmarkable
            && self.revisions.is_ok()
            && self.hashes.is_ok()
            && self
                .faults
                .iter()
                .all(|f| f.recovered && f.injected && f.leader_kept != Some(false))
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let c = &self.config;
        let mut out = format!(
            "chaos campaign: {}, seed {}, {:.0} s of faults ({:.0} s in all), {} clients, {} watchers\n",
            c.system.name(),
            c.seed,
            c.duration.as_secs_f64(),
            self.elapsed.as_secs_f64(),
            c.clients,
            c.watchers
        );
        out += &format!(
            "{:<22}{:>5}  {:>26}  {:>26}\n",
            "fault", "n", "new leader p50/p99/max s", "first write p50/p99/max s"
        );
        let mut by: BTreeMap<Fault, Vec<&FaultRecord>> = BTreeMap::new();
        for f in &self.faults {
            by.entry(f.fault).or_default().push(f);
        }
        for (fault, recs) in &by {
            let leader: Vec<Duration> = recs
                .iter()
                .filter(|r| r.deposes)
                .filter_map(|r| r.to_leader)
                .collect();
            let write: Vec<Duration> = recs.iter().filter_map(|r| r.to_write).collect();
            let failed = recs.iter().filter(|r| !r.recovered || !r.injected).count();
            out += &format!(
                "{:<22}{:>5}  {:>26}  {:>26}{}\n",
                fault.name(),
                recs.len(),
                percentiles(&leader),
                percentiles(&write),
                if failed > 0 {
                    format!("  ({failed} not injected or not recovered)")
                } else {
                    String::new()
                }
            );
        }
        let cuts: Vec<&FaultRecord> = self.faults.iter().filter(|f| !f.cuts.is_empty()).collect();
        if !cuts.is_empty() {
            out +=
                "power cuts (what each member's filesystem threw away; its fsyncs until then):\n";
        }
        for r in cuts {
            let each: Vec<String> = r
                .cuts
                .iter()
                .map(|(m, report, fsyncs)| {
                    format!("m{m} {}, {fsyncs} fsyncs", describe_cut(report))
                })
                .collect();
            out += &format!(
                "  {:<14} at {:>6.1} s: {}\n",
                r.fault.name(),
                r.reference as f64 / 1e9,
                each.join("; ")
            );
        }
        let yes = |b: bool| if b { "yes" } else { "NO" };
        out += &format!(
            "operations: {} register/txn ({} answered, {} unknown outcome); appends {} ({} acknowledged)\n",
            self.ops, self.answered, self.unknown, self.appends_tried, self.acked
        );
        out += &match &self.final_state {
            Ok(()) if self.lost.is_empty() => "acknowledged writes lost: 0\n".to_string(),
            Ok(()) => format!(
                "acknowledged writes lost: {} ({}{})\n",
                self.lost.len(),
                self.lost[..self.lost.len().min(5)].join(", "),
                if self.lost.len() > 5 { ", ..." } else { "" }
            ),
            Err(e) => format!("acknowledged writes lost: unknown: {e}\n"),
        };
        out += &format!(
            "linearizable: {} ({} ops in {} key groups, checked in {:.2} s){}\n",
            match self.linearizable.linearizable {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "unknown (checker budget exceeded)",
            },
            self.linearizable.ops,
            self.linearizable.groups,
            self.check_time.as_secs_f64(),
            self.linearizable
                .failure
                .as_ref()
                .map(|f| format!(": {f}"))
                .unwrap_or_default()
        );
        let w = &self.watch;
        out += &format!(
            "watches: {} watchers, {} events: ordered {}, unique {}, reliable {}, atomic {}, resumable {}, bookmarkable {}\n",
            w.watchers,
            w.events,
            yes(w.ordered),
            yes(w.unique),
            yes(w.reliable),
            yes(w.atomic),
            yes(w.resumable),
            yes(w.bookmarkable)
        );
        for p in w.problems.iter().take(5) {
            out += &format!("  watch problem: {p}\n");
        }
        out += &format!(
            "revisions never decrease: {}\n",
            match &self.revisions {
                Ok(()) => "yes".to_string(),
                Err(e) => format!("NO: {e}"),
            }
        );
        out += &format!(
            "members agree (HashKV): {}\n",
            match &self.hashes {
                Ok(what) => format!("yes, {what}"),
                Err(e) => format!("NO: {e}"),
            }
        );
        out += &format!("result: {}\n", if self.passed() { "PASS" } else { "FAIL" });
        out
    }
}

/// "dropped 12.0 KiB in 3 files, 0 directory entries".
pub fn describe_cut(r: &CutReport) -> String {
    format!(
        "dropped {:.1} KiB in {} files, {} directory entries",
        r.bytes_dropped as f64 / 1024.0,
        r.files_reverted,
        r.entries_reverted
    )
}

pub fn percentiles(xs: &[Duration]) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    let mut v: Vec<f64> = xs.iter().map(|d| d.as_secs_f64()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    format!("{:.2} / {:.2} / {:.2}", at(0.5), at(0.99), v[v.len() - 1])
}
