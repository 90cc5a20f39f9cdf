//! Membership changes: what a client asks for, made by the leader through openraft with
//! etcd's checks (the member known or not, a learner in sync before its promotion, never
//! the last voter).

use std::collections::{BTreeMap, BTreeSet};

use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;
use serde::{Deserialize, Serialize};

use super::{Forward, ForwardError, Node};
use crate::error::StoreError;
use crate::raft::{Member, NodeId};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MembershipChange {
    AddLearner { id: NodeId, member: Member },
    AddVoter { id: NodeId, member: Member },
    Promote { id: NodeId },
    Remove { id: NodeId },
    Update { id: NodeId, member: Member },
}

impl Node {
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), StoreError> {
        self.to_leader(Forward::Membership(change))
            .await
            .map(|_| ())
    }

    pub(super) async fn change_membership_local(
        &self,
        change: MembershipChange,
    ) -> Result<(), ForwardError> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let known = |id: &NodeId| membership.nodes().any(|(n, _)| n == id);
        let result = match change {
            MembershipChange::AddLearner { id, member }
            | MembershipChange::AddVoter { id, member }
                if known(&id) =>
            {
                let _ = member;
                return Err(ForwardError::FailedPrecondition(
                    "member ID already exist".into(),
                ));
            }
            MembershipChange::AddLearner { id, member } => {
                self.raft.add_learner(id, member, false).await
            }
            MembershipChange::AddVoter { id, member } => {
                let nodes = BTreeMap::from([(id, member)]);
                self.raft
                    .change_membership(ChangeMembers::AddVoters(nodes), false)
                    .await
            }
            MembershipChange::Promote { id } => {
                if !known(&id) {
                    return Err(ForwardError::NotFound("member not found".into()));
                }
                if voters.contains(&id) {
                    return Err(ForwardError::FailedPrecondition(
                        "can only promote a learner member".into(),
                    ));
                }
                if !self.learner_in_sync(id) {
                    return Err(ForwardError::FailedPrecondition(
                        "can only promote a learner member which is in sync with leader".into(),
                    ));
                }
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                    .await
            }
            MembershipChange::Remove { id } => {
                if !known(&id) {
                    return Err(ForwardError::NotFound("member not found".into()));
                }
                if voters.contains(&id) {
                    if voters.len() == 1 {
                        return Err(ForwardError::FailedPrecondition(
                            "re-configuration failed due to not enough started members".into(),
                        ));
                    }
                    self.raft
                        .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                        .await
                } else {
                    self.raft
                        .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                        .await
                }
            }
            MembershipChange::Update { id, member } => {
                if !known(&id) {
                    return Err(ForwardError::NotFound("member not found".into()));
                }
                self.raft
                    .change_membership(
                        ChangeMembers::SetNodes(BTreeMap::from([(id, member)])),
                        false,
                    )
                    .await
            }
        };
        match result {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => {
                Err(ForwardError::NotLeader)
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(ForwardError::FailedPrecondition(e.to_string()))
            }
            Err(RaftError::Fatal(f)) => Err(ForwardError::Unavailable(f.to_string())),
        }
    }

    /// A learner is in sync when it has matched the leader's log to within a small lag.
    fn learner_in_sync(&self, id: NodeId) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        let last = m.last_log_index.unwrap_or(0);
        // A learner that never acknowledged anything (not started yet) is not in sync.
        let Some(matched) = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned().flatten())
        else {
            return false;
        };
        last.saturating_sub(matched.index) <= 100
    }
}
