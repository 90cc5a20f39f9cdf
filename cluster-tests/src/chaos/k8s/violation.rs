//! What the checkers can find.

/// What the checkers can find.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Violation {
    StaleUpdateAccepted,
    UpdateNotNewer,
    TwoFromOneVersion,
    OneVersionTwoWrites,
    ConflictApplied,
    StaleRead,
    ListWentBack,
    LostCreate,
    WatchOrder,
    WatchResume,
    WatchGap,
    WatchBehind,
    NotGone,
    WriteWithoutQuorum,
    PodOnTwoNodes,
    TooManyPods,
    ApiDown,
    NotConverged,
}

impl Violation {
    pub const ALL: [Violation; 18] = [
        Violation::StaleUpdateAccepted,
        Violation::UpdateNotNewer,
        Violation::TwoFromOneVersion,
        Violation::OneVersionTwoWrites,
        Violation::ConflictApplied,
        Violation::StaleRead,
        Violation::ListWentBack,
        Violation::LostCreate,
        Violation::WatchOrder,
        Violation::WatchResume,
        Violation::WatchGap,
        Violation::WatchBehind,
        Violation::NotGone,
        Violation::WriteWithoutQuorum,
        Violation::PodOnTwoNodes,
        Violation::TooManyPods,
        Violation::ApiDown,
        Violation::NotConverged,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Violation::StaleUpdateAccepted => "stale-update-accepted",
            Violation::UpdateNotNewer => "update-not-newer",
            Violation::TwoFromOneVersion => "two-from-one-version",
            Violation::OneVersionTwoWrites => "one-version-two-writes",
            Violation::ConflictApplied => "conflict-applied",
            Violation::StaleRead => "stale-read",
            Violation::ListWentBack => "list-went-back",
            Violation::LostCreate => "lost-create",
            Violation::WatchOrder => "watch-order",
            Violation::WatchResume => "watch-resume",
            Violation::WatchGap => "watch-gap",
            Violation::WatchBehind => "watch-behind",
            Violation::NotGone => "not-gone",
            Violation::WriteWithoutQuorum => "write-without-quorum",
            Violation::PodOnTwoNodes => "pod-on-two-nodes",
            Violation::TooManyPods => "too-many-pods",
            Violation::ApiDown => "api-down",
            Violation::NotConverged => "not-converged",
        }
    }

    pub fn meaning(self) -> &'static str {
        match self {
            Violation::StaleUpdateAccepted => {
                "an update or delete from a known old resourceVersion succeeded (must be 409)"
            }
            Violation::UpdateNotNewer => {
                "an update's new resourceVersion is not above the one it was based on"
            }
            Violation::TwoFromOneVersion => {
                "two writes based on the same resourceVersion of an object both succeeded"
            }
            Violation::OneVersionTwoWrites => {
                "two acknowledged writes got the same resourceVersion"
            }
            Violation::ConflictApplied => "a write answered 409 Conflict was applied after all",
            Violation::StaleRead => {
                "a get or list returned a version older than a write acknowledged before it began"
            }
            Violation::ListWentBack => "a client's list resourceVersion went back",
            Violation::LostCreate => "a list lacked an acknowledged create never deleted",
            Violation::WatchOrder => "watch events out of resourceVersion order or repeated",
            Violation::WatchResume => {
                "a resumed watch's first event was at or before the version it resumed from"
            }
            Violation::WatchGap => {
                "a watch skipped an acknowledged write in the range it covered, without 410"
            }
            Violation::WatchBehind => "a watch did not deliver the last write after the faults",
            Violation::NotGone => {
                "a watch or continue token from before a compaction was not answered 410 Gone"
            }
            Violation::WriteWithoutQuorum => "a write was acknowledged with two of three down",
            Violation::PodOnTwoNodes => "a pod's nodeName changed once set",
            Violation::TooManyPods => "more live pods than replicas + maxSurge",
            Violation::ApiDown => "the API did not serve again within the bound after a fault",
            Violation::NotConverged => "the Deployment did not converge after the faults",
        }
    }
}
