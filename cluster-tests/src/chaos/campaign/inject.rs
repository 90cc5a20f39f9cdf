//! The store campaign's side of the fault injector: the process faults through
//! [`faults::strike`] (the campaign holding each for a fixed time, or until a new leader),
//! and the faults only a [`System`] allows (network faults through the proxies, snapshot
//! catch-up, member replacement, failpoints, power cuts), each applied and then healed; the
//! times to a leader and to a write come from the monitor's and prober's records.

use super::*;
use crate::chaos::faults::{self, wait_leader_except, Injector};

impl Injector for Run {
    type Members = System;

    fn members(&mut self) -> &mut System {
        &mut self.sys
    }

    fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    fn now(&self) -> u64 {
        self.rec.now()
    }

    async fn hold(
        &mut self,
        fault: Fault,
        _down: &[usize],
        leader: usize,
        _since: Instant,
        record: &mut FaultRecord,
    ) {
        match fault {
            Fault::KillLeader => {
                let new = self
                    .wait_leader_except(Some(leader), Duration::from_secs(30))
                    .await;
                record.detail += &format!("; new leader {new:?}");
            }
            Fault::QuorumLoss => {
                tokio::time::sleep(Duration::from_secs(3)).await;
                record.detail += " for 3 s";
            }
            Fault::PauseLeader => {
                let hold = 2 * self.sys.tuning.election_timeout_ms + 1500;
                tokio::time::sleep(Duration::from_millis(hold)).await;
                record.detail += &format!(" for {hold} ms");
            }
            _ => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                record.detail += " for 2 s";
            }
        }
    }

    /// The recovery is timed afterwards from the monitor's and the prober's records.
    async fn healed(&mut self, _: Fault, _: Instant, _: &mut FaultRecord) {}
}

impl Run {
    pub(super) async fn head_revision(&self) -> Option<i64> {
        for i in 0..self.sys.size() {
            if let Some(s) = self.sys.status(i).await {
                return s.header.map(|h| h.revision);
            }
        }
        None
    }

    /// Waits until some member accepts a write.
    pub(super) async fn wait_writable(&self, bound: Duration) -> Result<()> {
        let end = Instant::now() + bound;
        while Instant::now() < end {
            for i in 0..self.sys.size() {
                let mut kv = pb::kv_client::KvClient::new(self.sys.channel(i));
                let put = kv.put(pb::PutRequest {
                    key: b"probe".to_vec(),
                    value: b"1".to_vec(),
                    ..Default::default()
                });
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), put).await {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("no member accepted a write within {bound:?}")
    }

    /// Waits (bounded) until a member other than `skip` says it leads; that member, if any.
    pub(super) async fn wait_leader_except(
        &self,
        skip: Option<usize>,
        bound: Duration,
    ) -> Option<usize> {
        wait_leader_except(&self.sys, skip, bound).await
    }

    pub(super) fn term_at(&self, t: u64) -> u64 {
        lock(&self.claims)
            .iter()
            .take_while(|(at, _)| *at <= t)
            .filter_map(|(_, c)| c.map(|(_, term)| term))
            .max()
            .unwrap_or(0)
    }

    /// (to a new leader, to the first successful write) after a fault's reference point.
    pub(super) fn recovery(&self, r: &FaultRecord) -> (Option<Duration>, Option<Duration>) {
        let before = self.term_at(r.reference);
        let leader = lock(&self.claims)
            .iter()
            .find(|(at, c)| {
                *at >= r.reference && c.is_some_and(|(_, term)| !r.deposes || term > before)
            })
            .map(|(at, _)| Duration::from_nanos(at - r.reference));
        let write = lock(&self.probes)
            .iter()
            .filter(|(start, _, ok)| *ok && *start >= r.reference)
            .map(|(_, end, _)| Duration::from_nanos(end - r.reference))
            .min();
        (leader, write)
    }

    pub(super) fn others(&self, m: usize) -> Vec<usize> {
        (0..self.sys.size()).filter(|i| *i != m).collect()
    }

    /// Writes `n` keys as fast as the cluster takes them (20 at a time) through every member
    /// but `cut_off`: enough entries for a snapshot, or to leave a cut-off follower behind.
    pub(super) async fn fill(&self, n: usize, cut_off: Option<usize>) -> usize {
        use futures::StreamExt;
        let channels: Vec<_> = (0..self.sys.size())
            .filter(|i| Some(*i) != cut_off)
            .map(|i| self.sys.channel(i))
            .collect();
        let done = futures::stream::iter(0..n)
            .map(|k| {
                let mut kv = pb::kv_client::KvClient::new(channels[k % channels.len()].clone());
                async move {
                    tokio::time::timeout(
                        Duration::from_secs(3),
                        kv.put(pb::PutRequest {
                            key: format!("fill/{k}").into(),
                            value: vec![b'x'; 100],
                            ..Default::default()
                        }),
                    )
                    .await
                    .is_ok_and(|r| r.is_ok())
                }
            })
            .buffer_unordered(20)
            .filter(|ok| futures::future::ready(*ok))
            .count()
            .await;
        done
    }

    /// Waits until member m answers with a revision at least `rev`.
    pub(super) async fn wait_caught_up(
        &self,
        m: usize,
        rev: i64,
        bound: Duration,
    ) -> Option<Duration> {
        let t = Instant::now();
        while t.elapsed() < bound {
            if let Some(s) = self.sys.status(m).await {
                if s.header.is_some_and(|h| h.revision >= rev) {
                    return Some(t.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    pub(super) async fn inject(&mut self, fault: Fault) -> Result<FaultRecord> {
        let n = self.sys.size();
        let leader = self.wait_leader_except(None, Duration::from_secs(30)).await;
        let l = leader.unwrap_or(0);
        let now = || self.rec.now();
        if fault.is_process() {
            return faults::strike(self, fault, l).await;
        }
        Ok(match fault {
            Fault::PartitionLeader | Fault::PartitionLeaderOut | Fault::PartitionLeaderIn => {
                let (out, inc) = match fault {
                    Fault::PartitionLeader => (true, true),
                    Fault::PartitionLeaderOut => (true, false),
                    _ => (false, true),
                };
                let all: Vec<usize> = (0..n).collect();
                self.sys.proxies.isolate(l, &all, out, inc, LinkFault::Cut);
                let at = now();
                let old_refuses = self.old_leader_refuses(l).await;
                tokio::time::sleep(Duration::from_secs(4)).await;
                self.sys.proxies.heal();
                let dir = match (out, inc) {
                    (true, true) => "both ways",
                    (true, false) => "leader -> followers",
                    _ => "followers -> leader",
                };
                FaultRecord::new(
                    fault,
                    format!("cut leader m{l} off ({dir}) for 4 s; the old leader {old_refuses}"),
                    at,
                    true,
                )
            }
            Fault::DelayPeers | Fault::LossPeers => {
                for a in 0..n {
                    for b in (0..n).filter(|b| *b != a) {
                        let f = if fault == Fault::DelayPeers {
                            LinkFault::Delay(Duration::from_millis(self.rng.gen_range(50..250)))
                        } else {
                            LinkFault::Loss(0.2)
                        };
                        self.sys.proxies.set(a, b, Some(f));
                    }
                }
                let at = now();
                tokio::time::sleep(Duration::from_secs(5)).await;
                self.sys.proxies.heal();
                let what = if fault == Fault::DelayPeers {
                    "50-250 ms delay"
                } else {
                    "20% loss"
                };
                FaultRecord::new(
                    fault,
                    format!("{what} on every peer link for 5 s"),
                    at,
                    false,
                )
            }
            Fault::PartitionFollower => {
                // A follower cut off both ways for two election timeouts and more: with
                // PreVote it never raises its term, so coming back it deposes nobody.
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                let term_of = |s: Option<pb::StatusResponse>| s.map(|s| s.raft_term);
                let before = term_of(self.sys.status(l).await);
                let all: Vec<usize> = (0..n).collect();
                self.sys
                    .proxies
                    .isolate(f, &all, true, true, LinkFault::Cut);
                let at = now();
                let hold = 2 * self.sys.tuning.election_timeout_ms + 1500;
                tokio::time::sleep(Duration::from_millis(hold)).await;
                let head = self.head_revision_of(l).await.unwrap_or(0);
                self.sys.proxies.heal();
                let caught = self.wait_caught_up(f, head, RECOVERY_BOUND).await;
                // A deposed leader shows within an election timeout of the heal.
                tokio::time::sleep(Duration::from_millis(self.sys.tuning.election_timeout_ms))
                    .await;
                let after = term_of(self.sys.status(l).await);
                let still_leads = self.sys.leader().await == Some(l);
                let kept = before.is_some() && before == after && still_leads;
                let mut r = FaultRecord::new(
                    fault,
                    format!(
                        "cut follower m{f} off both ways for {hold} ms; caught up {}; leader m{l} {}",
                        caught.map_or("never".into(), |d| format!("{:.2} s after the heal", d.as_secs_f64())),
                        if kept {
                            format!("kept term {}", before.unwrap_or(0))
                        } else {
                            format!(
                                "did not keep its leadership (term {before:?} -> {after:?}, leads: {still_leads})"
                            )
                        }
                    ),
                    at,
                    false,
                );
                r.leader_kept = Some(kept);
                r
            }
            Fault::SnapshotCatchup => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                let all: Vec<usize> = (0..n).collect();
                self.sys
                    .proxies
                    .isolate(f, &all, true, true, LinkFault::Cut);
                let at = now();
                let t = &self.sys.tuning;
                let wrote = self
                    .fill(
                        (t.snapshot_count + t.snapshot_catchup_entries + 200) as usize,
                        Some(f),
                    )
                    .await;
                let head = self.head_revision_of(l).await.unwrap_or(0);
                self.sys.proxies.heal();
                let caught = self.wait_caught_up(f, head, RECOVERY_BOUND).await;
                FaultRecord::new(
                    fault,
                    format!(
                        "cut follower m{f} off while {wrote} writes went in; caught up {}",
                        caught.map_or("never".into(), |d| format!(
                            "{:.2} s after the heal",
                            d.as_secs_f64()
                        ))
                    ),
                    at,
                    false,
                )
            }
            Fault::ReplaceMember => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                self.sys.kill(f);
                let at = now();
                self.sys.replace(f).await?;
                let head = self.head_revision_of(l).await.unwrap_or(0);
                let caught = self.wait_caught_up(f, head, RECOVERY_BOUND).await;
                FaultRecord::new(
                    fault,
                    format!(
                        "replaced m{f} (removed, wiped, added back); caught up {}",
                        caught.map_or("never".into(), |d| format!("in {:.2} s", d.as_secs_f64()))
                    ),
                    at,
                    false,
                )
            }
            Fault::Failpoint => self.failpoint(l).await?,
            Fault::PowerFollower | Fault::PowerLeader | Fault::PowerTwo | Fault::PowerAll => {
                let others = self.others(l);
                let f = others[self.rng.gen_range(0..others.len())];
                let members = match fault {
                    Fault::PowerFollower => vec![f],
                    Fault::PowerLeader => vec![l],
                    Fault::PowerTwo => vec![l, f],
                    _ => (0..n).collect(),
                };
                self.power_cut(fault, &members, leader).await?
            }
            Fault::KillLeader
            | Fault::KillMember
            | Fault::QuorumLoss
            | Fault::PauseLeader
            | Fault::KillEndpoint => bail!("{} is a process fault, struck above", fault.name()),
            Fault::RollingRestart => {
                let at = now();
                for m in 0..n {
                    self.sys.stop(m).await;
                    self.sys.restart(m, &[])?;
                    let head = self.head_revision_of((m + 1) % n).await.unwrap_or(0);
                    self.wait_caught_up(m, head, RECOVERY_BOUND).await;
                }
                FaultRecord::new(
                    fault,
                    "stopped and restarted every member in turn".into(),
                    at,
                    false,
                )
            }
        })
    }

    /// Cuts the power of `members` at once while the clients write: SIGKILL to all of them
    /// right after the clients' next acknowledged append, each reaped, everything it had not
    /// fsynced thrown away, and each restarted from the same data dir.
    pub(super) async fn power_cut(
        &mut self,
        fault: Fault,
        members: &[usize],
        leader: Option<usize>,
    ) -> Result<FaultRecord> {
        let writing = self.next_acknowledgement(Duration::from_secs(10)).await;
        self.sys.kill_all(members);
        let at = self.rec.now();
        let mut cuts = Vec::new();
        for &m in members {
            let (report, fsyncs) = self.sys.cut_power(m)?;
            cuts.push((m, report, fsyncs));
        }
        for &m in members {
            self.sys.restart(m, &[])?;
        }
        let who: Vec<String> = members
            .iter()
            .map(|&m| {
                if Some(m) == leader {
                    format!("m{m} (leader)")
                } else {
                    format!("m{m}")
                }
            })
            .collect();
        let lost: Vec<String> = cuts
            .iter()
            .map(|(m, report, _)| format!("m{m} {}", describe_cut(report)))
            .collect();
        let mut r = FaultRecord::new(
            fault,
            format!(
                "cut the power of {} {}; {}",
                who.join(", "),
                if writing {
                    "right after an acknowledged append"
                } else {
                    "(no append acknowledged in the 10 s before)"
                },
                lost.join("; ")
            ),
            at,
            leader.is_some_and(|l| members.contains(&l)),
        );
        r.cuts = cuts;
        Ok(r)
    }

    /// Waits (bounded) for the clients' next acknowledged append: whether one came.
    pub(super) async fn next_acknowledgement(&self, bound: Duration) -> bool {
        let seen = lock(&self.rec.acked).len();
        let end = Instant::now() + bound;
        while Instant::now() < end {
            if lock(&self.rec.acked).len() > seen {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Whether a deposed leader refuses writes once a new leader is in charge: asks it for one
    /// write after the others elected someone.
    pub(super) async fn old_leader_refuses(&self, old: usize) -> String {
        let Some(new) = self
            .wait_leader_except(Some(old), Duration::from_secs(10))
            .await
        else {
            return "kept leading (no other leader within 10 s)".into();
        };
        let mut kv = pb::kv_client::KvClient::new(self.sys.channel(old));
        let put = kv.put(pb::PutRequest {
            key: b"probe-old-leader".to_vec(),
            value: b"1".to_vec(),
            ..Default::default()
        });
        match tokio::time::timeout(Duration::from_secs(3), put).await {
            Ok(Ok(_)) => format!("ACCEPTED a write after m{new} took over"),
            Ok(Err(e)) => format!("refused a write after m{new} took over ({})", e.message()),
            Err(_) => format!("did not answer a write after m{new} took over"),
        }
    }

    /// Restarts a member with one crash point armed, drives traffic until it crashes there,
    /// then starts it clean.
    pub(super) async fn failpoint(&mut self, leader: usize) -> Result<FaultRecord> {
        let points = rkube_store::failpoints::FAILPOINTS;
        let point = points[self.rng.gen_range(0..points.len())];
        let others = self.others(leader);
        let leader_only = point == rkube_store::failpoints::RAFT_LOG_LEADER_BEFORE_FSYNC;
        let m = if point.starts_with("snapshot-install") {
            others[self.rng.gen_range(0..others.len())]
        } else if leader_only {
            leader
        } else {
            self.rng.gen_range(0..self.sys.size())
        };
        self.sys.stop(m).await;
        let armed = format!("{point}=return");
        self.sys
            .restart(m, &[("RKUBE_FAILPOINTS", armed.as_str())])?;
        let t = self.sys.tuning.clone();
        let all: Vec<usize> = (0..self.sys.size()).collect();
        if point.starts_with("snapshot-install") {
            // Leave it behind the leader's log so that it is sent a snapshot.
            self.sys
                .proxies
                .isolate(m, &all, true, true, LinkFault::Cut);
            self.fill(
                (t.snapshot_count + t.snapshot_catchup_entries + 200) as usize,
                Some(m),
            )
            .await;
            self.sys.proxies.heal();
        } else if point.starts_with("snapshot-build") {
            self.fill(t.snapshot_count as usize + 100, None).await;
        } else if leader_only {
            // The point is reached only by a leader's own appends: m leads again first.
            self.sys.move_leader(m, Duration::from_secs(20)).await;
            self.fill(50, None).await;
        } else {
            self.fill(50, None).await;
        }
        let end = Instant::now() + Duration::from_secs(30);
        while self.sys.running(m) && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let crashed = !self.sys.running(m);
        let at = self.rec.now();
        // The stop and armed restart may have moved leadership already: the crash deposes a
        // leader only if m led when it crashed.
        let led = lock(&self.claims)
            .iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .and_then(|(_, c)| *c)
            .is_some_and(|(i, _)| i == m);
        if !crashed {
            self.sys.kill(m);
        }
        self.sys.restart(m, &[])?;
        Ok(FaultRecord::new(
            Fault::Failpoint,
            format!(
                "m{m} armed at {point}: {}",
                if crashed {
                    "crashed there"
                } else {
                    "not reached within 30 s (killed)"
                }
            ),
            at,
            led,
        ))
    }
}
