//! The faults a campaign draws from.

use anyhow::Context;

use super::Kind;

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
}

impl Fault {
    pub const ALL: [Fault; 18] = [
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

    /// Whether the fault can be applied to this system (etcd's failpoints need a special build).
    pub fn applies(self, kind: Kind) -> bool {
        !(self == Fault::Failpoint && kind == Kind::Etcd)
    }
}
