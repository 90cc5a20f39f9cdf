//! The fault model and injector that both campaigns use: the fault kinds (one enum; a fault
//! applies to the systems it makes sense for), the record of an injected fault (what, when, the
//! recovery times), the process-level actions on a cluster's members ([`Members`], which the
//! store campaign's [`System`] and the Kubernetes campaign's [`Cluster`] implement), and the
//! process faults themselves ([`strike`]: kill the leader, a member, the endpoint's holder,
//! two of three; pause the leader), each campaign checking what it checks while the fault
//! holds and after it healed ([`Injector`]). The faults only the store campaign can inject
//! (network faults through the proxies, power cuts, failpoints, member replacement) are
//! injected by it (`campaign/inject.rs`) on [`System`] and recorded the same way.

use std::time::Duration;

use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use super::system::{Kind, System};
use crate::powerfs::CutReport;
use crate::Cluster;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fault {
    KillLeader,
    KillMember,
    QuorumLoss,
    PauseLeader,
    PartitionLeader,
    PartitionLeaderOut,
    PartitionLeaderIn,
    DelayPeers,
    LossPeers,
    SnapshotCatchup,
    PartitionFollower,
    ReplaceMember,
    Failpoint,
    RollingRestart,
    PowerFollower,
    PowerLeader,
    PowerTwo,
    PowerAll,
    /// SIGKILL of the member holding the control-plane endpoint (the admin kubeconfig's
    /// current context): only a Kubernetes cluster has one.
    KillEndpoint,
}

impl Fault {
    pub const ALL: [Fault; 19] = [
        Fault::KillLeader,
        Fault::KillMember,
        Fault::QuorumLoss,
        Fault::PauseLeader,
        Fault::PartitionLeader,
        Fault::PartitionLeaderOut,
        Fault::PartitionLeaderIn,
        Fault::DelayPeers,
        Fault::LossPeers,
        Fault::SnapshotCatchup,
        Fault::PartitionFollower,
        Fault::ReplaceMember,
        Fault::Failpoint,
        Fault::RollingRestart,
        Fault::PowerFollower,
        Fault::PowerLeader,
        Fault::PowerTwo,
        Fault::PowerAll,
        Fault::KillEndpoint,
    ];

    /// The power cuts: they need the members' data dirs on powerfs ([`Config::power_fs`]).
    pub const POWER: [Fault; 4] = [
        Fault::PowerFollower,
        Fault::PowerLeader,
        Fault::PowerTwo,
        Fault::PowerAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::KillMember => "kill-member",
            Fault::QuorumLoss => "quorum-loss",
            Fault::PauseLeader => "pause-leader",
            Fault::PartitionLeader => "partition-leader",
            Fault::PartitionLeaderOut => "partition-leader-out",
            Fault::PartitionLeaderIn => "partition-leader-in",
            Fault::DelayPeers => "delay-peers",
            Fault::LossPeers => "loss-peers",
            Fault::SnapshotCatchup => "snapshot-catchup",
            Fault::PartitionFollower => "partition-follower",
            Fault::ReplaceMember => "replace-member",
            Fault::Failpoint => "failpoint",
            Fault::RollingRestart => "rolling-restart",
            Fault::PowerFollower => "power-follower",
            Fault::PowerLeader => "power-leader",
            Fault::PowerTwo => "power-two",
            Fault::PowerAll => "power-all",
            Fault::KillEndpoint => "kill-endpoint",
        }
    }

    pub fn is_power_cut(self) -> bool {
        Fault::POWER.contains(&self)
    }

    pub fn parse(s: &str) -> anyhow::Result<Fault> {
        Fault::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .with_context(|| {
                let all: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
                format!("unknown fault {s:?}; the faults are {}", all.join(", "))
            })
    }

    /// Whether the fault is one of [`strike`]'s: killing or pausing members, which both
    /// campaigns can do.
    pub fn is_process(self) -> bool {
        matches!(
            self,
            Fault::KillLeader
                | Fault::KillMember
                | Fault::QuorumLoss
                | Fault::PauseLeader
                | Fault::KillEndpoint
        )
    }

    /// Whether the fault can be applied to this system: etcd's failpoints need a special
    /// build; only a Kubernetes cluster has a control-plane endpoint; the Kubernetes campaign's
    /// members (an `rkube up` cluster) have neither fault proxies nor powerfs, so it injects
    /// the process faults alone.
    pub fn applies(self, kind: Kind) -> bool {
        match kind {
            Kind::Kubernetes => self.is_process(),
            Kind::Etcd => !matches!(self, Fault::Failpoint | Fault::KillEndpoint),
            Kind::Rkube => self != Fault::KillEndpoint,
        }
    }

    /// Every fault that applies to `kind`, in [`Fault::ALL`]'s order.
    pub fn all_for(kind: Kind) -> Vec<Fault> {
        Fault::ALL.into_iter().filter(|f| f.applies(kind)).collect()
    }
}

/// One injected fault and how the cluster came back from it.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    pub detail: String,
    /// When recovery is timed from (ns on the campaign's clock): the injection, or for quorum
    /// loss the restart.
    pub reference: u64,
    /// Whether the fault took the leader away (a new leader is then expected).
    pub deposes: bool,
    pub to_leader: Option<Duration>,
    /// From the reference to the first write the cluster acknowledged (through its store or
    /// its API, as the campaign writes).
    pub to_write: Option<Duration>,
    /// False when the cluster did not serve writes again within the bound after healing.
    pub recovered: bool,
    /// False when the harness could not inject it (no leader, a failed member replacement).
    pub injected: bool,
    /// For a power cut: each member whose power was cut, what its filesystem threw away, and
    /// the fsyncs that filesystem had seen until then.
    pub cuts: Vec<(usize, CutReport, u64)>,
    /// For a fault that must not move the leadership (a follower cut off and back): whether
    /// the leader kept its term through it.
    pub leader_kept: Option<bool>,
}

impl FaultRecord {
    pub fn new(fault: Fault, detail: String, reference: u64, deposes: bool) -> Self {
        FaultRecord {
            fault,
            detail,
            reference,
            deposes,
            to_leader: None,
            to_write: None,
            recovered: false,
            injected: true,
            cuts: Vec::new(),
            leader_kept: None,
        }
    }
}

/// The process-level actions on a cluster's members, numbered from 0.
#[allow(async_fn_in_trait)]
pub trait Members {
    fn size(&self) -> usize;
    /// How the campaign's reports name member i.
    fn name(&self, i: usize) -> String;
    /// The member that says it leads, if one does (one look, no waiting).
    async fn leader_except(&self, skip: Option<usize>) -> Option<usize>;
    /// SIGKILL to each of `members`, and waits until their processes are gone.
    async fn kill_all(&mut self, members: &[usize]);
    /// SIGSTOP.
    fn pause(&mut self, i: usize);
    /// SIGCONT.
    fn resume(&mut self, i: usize);
    /// Starts every member that is not running again, from its data.
    async fn restart_missing(&mut self) -> Result<()>;
    /// The member holding the control-plane endpoint, on a cluster that has one.
    async fn endpoint_holder(&self) -> Option<usize> {
        None
    }
}

/// Waits (bounded) until a member other than `skip` says it leads; that member, if any.
pub async fn wait_leader_except<M: Members>(
    m: &M,
    skip: Option<usize>,
    bound: Duration,
) -> Option<usize> {
    let end = Instant::now() + bound;
    while Instant::now() < end {
        if let Some(l) = m.leader_except(skip).await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

impl Members for System {
    fn size(&self) -> usize {
        System::size(self)
    }

    fn name(&self, i: usize) -> String {
        System::name(i)
    }

    async fn leader_except(&self, skip: Option<usize>) -> Option<usize> {
        System::leader_except(self, skip).await
    }

    async fn kill_all(&mut self, members: &[usize]) {
        System::kill_all(self, members)
    }

    fn pause(&mut self, i: usize) {
        System::pause(self, i)
    }

    fn resume(&mut self, i: usize) {
        System::resume(self, i)
    }

    async fn restart_missing(&mut self) -> Result<()> {
        for i in 0..System::size(self) {
            if !self.running(i) {
                self.restart(i, &[])?;
            }
        }
        Ok(())
    }
}

impl Members for &Cluster {
    fn size(&self) -> usize {
        self.members.len()
    }

    fn name(&self, i: usize) -> String {
        format!("n{}", i + 1)
    }

    async fn leader_except(&self, skip: Option<usize>) -> Option<usize> {
        self.leader().await.filter(|l| Some(*l) != skip)
    }

    async fn kill_all(&mut self, members: &[usize]) {
        for &i in members {
            self.kill(i).await;
        }
    }

    fn pause(&mut self, i: usize) {
        Cluster::pause(self, i)
    }

    fn resume(&mut self, i: usize) {
        Cluster::resume(self, i)
    }

    async fn restart_missing(&mut self) -> Result<()> {
        Cluster::restart_missing(self).await
    }

    async fn endpoint_holder(&self) -> Option<usize> {
        let mut holder = None;
        for i in 0..self.members.len() {
            if self.metric(i, "rkube_endpoint_held").await == Some(1.0) {
                holder = Some(i);
            }
        }
        holder
    }
}

/// A campaign that injects the process faults: its members, its random choices, its clock,
/// and what it checks while a fault holds and once it healed.
#[allow(async_fn_in_trait)]
pub trait Injector {
    type Members: Members;
    fn members(&mut self) -> &mut Self::Members;
    fn rng(&mut self) -> &mut StdRng;
    /// The campaign's clock (ns), which [`FaultRecord::reference`] is on.
    fn now(&self) -> u64;
    /// While `fault` holds (`down` killed or paused since `since`, `leader` led before it):
    /// the campaign's checks, returning when the fault may heal; it adds what it saw to
    /// `record.detail` (and may time `record.to_write`).
    async fn hold(
        &mut self,
        fault: Fault,
        down: &[usize],
        leader: usize,
        since: Instant,
        record: &mut FaultRecord,
    );
    /// After the fault healed at `healed`: the campaign's checks of the recovery.
    async fn healed(&mut self, fault: Fault, healed: Instant, record: &mut FaultRecord);
}

/// Injects one process fault ([`Fault::is_process`]) with `leader` leading: kills or pauses the
/// members it hits, lets the campaign check while it holds, heals it (restarts the killed,
/// resumes the paused) and lets the campaign check the recovery. Quorum loss is timed from
/// the restart, every other fault from the injection.
pub async fn strike<I: Injector>(i: &mut I, fault: Fault, leader: usize) -> Result<FaultRecord> {
    let n = i.members().size();
    let others: Vec<usize> = (0..n).filter(|m| *m != leader).collect();
    let down = match fault {
        Fault::KillLeader | Fault::PauseLeader => vec![leader],
        Fault::KillMember => vec![i.rng().gen_range(0..n)],
        Fault::QuorumLoss => {
            let second = others[i.rng().gen_range(0..others.len())];
            vec![leader, second]
        }
        Fault::KillEndpoint => match i.members().endpoint_holder().await {
            Some(holder) => vec![holder],
            None => {
                let l = i.members().name(leader);
                let mut r = FaultRecord::new(
                    fault,
                    format!("no member holds the control-plane endpoint (leader {l})"),
                    i.now(),
                    false,
                );
                r.injected = false;
                return Ok(r);
            }
        },
        _ => anyhow::bail!("{} is not a process fault", fault.name()),
    };
    let m = i.members();
    let names: Vec<String> = down.iter().map(|d| m.name(*d)).collect();
    let what = match fault {
        Fault::PauseLeader => format!("paused leader {}", names[0]),
        Fault::QuorumLoss => format!("killed {} (leader) and {}", names[0], names[1]),
        Fault::KillEndpoint => format!(
            "killed {} (holding the endpoint; leader {})",
            names[0],
            m.name(leader)
        ),
        Fault::KillLeader => format!("killed leader {}", names[0]),
        _ => format!("killed {} (leader {})", names[0], m.name(leader)),
    };
    let since = Instant::now();
    if fault == Fault::PauseLeader {
        m.pause(leader);
    } else {
        m.kill_all(&down).await;
    }
    let mut record = FaultRecord::new(fault, what, i.now(), down.contains(&leader));
    i.hold(fault, &down, leader, since, &mut record).await;
    // Healing starts here: quorum loss is timed from the restart's start (`rkube up` takes
    // a while to start the members again).
    let healed = Instant::now();
    if fault == Fault::QuorumLoss {
        record.reference = i.now();
    }
    if fault == Fault::PauseLeader {
        i.members().resume(leader);
    } else if let Err(e) = i.members().restart_missing().await {
        // Not healed: the fault was not injected as it should have been.
        record.detail += &format!("; could not restart: {e:#}");
        record.injected = false;
    }
    i.healed(fault, healed, &mut record).await;
    Ok(record)
}
