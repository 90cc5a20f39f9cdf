//! Crash points in the write path, for chaos tests: a member started with
//! `RKUBE_FAILPOINTS=raft-log-after-fsync=return` aborts the moment it has fsynced its next
//! log append, as if it lost power there.
//!
//! The points are the `fail` crate's, configured only from [`ENV`] (its syntax is fail's
//! `FAILPOINTS`: `point=actions;point=actions`, actions like `return`, `2*off->return`,
//! `50%return`). A point's `return` means "crash here": [`crash_point`] writes one line to
//! stderr naming the point and calls [`std::process::abort`], with no unwinding, no flush and no
//! goodbye to the peers. fail's other actions work as fail defines them: `sleep(ms)` and
//! `delay(ms)` hold the thread that reached the point, `pause` holds it for good (nothing
//! resumes it in rkube), `panic`, `print`, `off`.
//!
//! # Cost
//! The crate's `failpoints` feature is always on, so the points are in the shipped binary. A
//! point that is not configured costs what `fail::eval` does before it returns `None` (read in
//! fail 0.5.1's `src/lib.rs`): a read lock of the registry's `RwLock` and one lookup of the
//! point's name in its `HashMap`, which is empty unless [`ENV`] named points. Each point sits
//! beside an fsync, a sled transaction or a snapshot file, which cost orders of magnitude more.

/// The environment variable a server reads its failpoints from, once, when it starts.
pub const ENV: &str = "RKUBE_FAILPOINTS";

/// Before the fsync of appended Raft log entries (`raft/log_store.rs`, `append`).
pub const RAFT_LOG_BEFORE_FSYNC: &str = "raft-log-before-fsync";
/// Before an fsync that covers a leader's own entries, which openraft was told of before the
/// sync (`raft/log_store.rs`, `append`): reached only on the leader, so `sleep(ms)` here makes
/// the leader's disk slow and leaves its followers' as they are.
pub const RAFT_LOG_LEADER_BEFORE_FSYNC: &str = "raft-log-leader-before-fsync";
/// After that fsync, before openraft learns the entries are durable.
pub const RAFT_LOG_AFTER_FSYNC: &str = "raft-log-after-fsync";
/// Before entries are applied to the state machine (`raft/state_machine.rs`, `apply`).
pub const APPLY_BEFORE: &str = "apply-before";
/// After the sled transaction of the entries openraft handed over, before their results go
/// back to it.
pub const APPLY_AFTER: &str = "apply-after";
/// In a snapshot build, after the dump and before `snapshot.bin` is written (`build_snapshot`).
pub const SNAPSHOT_BUILD_BEFORE_SAVE: &str = "snapshot-build-before-save";
/// In a snapshot build, after `snapshot.bin` is fsynced and renamed into place.
pub const SNAPSHOT_BUILD_AFTER_SAVE: &str = "snapshot-build-after-save";
/// Installing a leader's snapshot, before anything is written (`install_snapshot`).
pub const SNAPSHOT_INSTALL_BEFORE: &str = "snapshot-install-before";
/// Installing a leader's snapshot, after the trees hold it and its marker is removed.
pub const SNAPSHOT_INSTALL_AFTER: &str = "snapshot-install-after";

/// Every crash point, in the order a write meets them.
pub const FAILPOINTS: &[&str] = &[
    RAFT_LOG_LEADER_BEFORE_FSYNC,
    RAFT_LOG_BEFORE_FSYNC,
    RAFT_LOG_AFTER_FSYNC,
    APPLY_BEFORE,
    APPLY_AFTER,
    SNAPSHOT_BUILD_BEFORE_SAVE,
    SNAPSHOT_BUILD_AFTER_SAVE,
    SNAPSHOT_INSTALL_BEFORE,
    SNAPSHOT_INSTALL_AFTER,
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FailpointError {
    #[error("{ENV}: {entry:?} is not POINT=ACTIONS (e.g. raft-log-after-fsync=return); separate entries with ';'")]
    Syntax { entry: String },
    #[error("{ENV}: there is no failpoint {name:?}; the failpoints are {}", FAILPOINTS.join(", "))]
    Unknown { name: String },
    #[error("{ENV}: failpoint {name} appears twice")]
    Duplicate { name: String },
    #[error("{ENV}: cannot use {actions:?} for {name}: {reason}; actions are like return, 2*off->return, 50%return, sleep(100)")]
    Actions {
        name: String,
        actions: String,
        reason: String,
    },
    #[error("{ENV} is not valid UTF-8")]
    NotUnicode,
}

/// Splits `point=actions;...` into pairs, checking the names; empty entries are skipped.
pub fn parse(spec: &str) -> Result<Vec<(&'static str, String)>, FailpointError> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, actions) = entry
            .split_once('=')
            .map(|(n, a)| (n.trim(), a.trim()))
            .filter(|(n, a)| !n.is_empty() && !a.is_empty())
            .ok_or_else(|| FailpointError::Syntax {
                entry: entry.to_string(),
            })?;
        let name = FAILPOINTS
            .iter()
            .copied()
            .find(|p| *p == name)
            .ok_or_else(|| FailpointError::Unknown {
                name: name.to_string(),
            })?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(FailpointError::Duplicate {
                name: name.to_string(),
            });
        }
        out.push((name, actions.to_string()));
    }
    Ok(out)
}

/// Configures the failpoints `spec` names: all of them or, on an error, none. Returns their
/// names.
pub fn configure(spec: &str) -> Result<Vec<&'static str>, FailpointError> {
    let points = parse(spec)?;
    // fail checks actions only when it sets them; a scratch name that no code evaluates lets
    // every entry be checked before any real point is armed.
    const SCRATCH: &str = "rkube-failpoints-check";
    for (name, actions) in &points {
        let checked = fail::cfg(SCRATCH, actions);
        fail::remove(SCRATCH);
        checked.map_err(|reason| FailpointError::Actions {
            name: name.to_string(),
            actions: actions.clone(),
            reason,
        })?;
    }
    for (name, actions) in &points {
        fail::cfg(*name, actions).map_err(|reason| FailpointError::Actions {
            name: name.to_string(),
            actions: actions.clone(),
            reason,
        })?;
    }
    Ok(points.into_iter().map(|(name, _)| name).collect())
}

/// Configures the failpoints [`ENV`] names, if it is set. Returns the configured points' names.
pub fn configure_from_env() -> Result<Vec<&'static str>, FailpointError> {
    match std::env::var(ENV) {
        Ok(spec) => configure(&spec),
        Err(std::env::VarError::NotPresent) => Ok(Vec::new()),
        Err(std::env::VarError::NotUnicode(_)) => Err(FailpointError::NotUnicode),
    }
}

/// Aborts the process here when failpoint `name` is configured and its action is `return`.
#[inline]
pub fn crash_point(name: &'static str) {
    fail::fail_point!(name, |_| {
        crash(name);
    });
}

#[cold]
fn crash(name: &str) -> ! {
    // Standard error is unbuffered: the line is out before the abort.
    eprintln!("failpoint {name}: aborting the process ({ENV})");
    std::process::abort()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(spec: &str) -> FailpointError {
        match configure(spec) {
            Err(e) => e,
            Ok(points) => panic!("{spec:?} was accepted: {points:?}"),
        }
    }

    #[test]
    fn parses_entries_in_fails_syntax() {
        let table: &[(&str, &[(&str, &str)])] = &[
            ("", &[]),
            (" ; ", &[]),
            ("apply-after=return", &[("apply-after", "return")]),
            (
                "raft-log-after-fsync=2*off->return; snapshot-install-before = 50%return ;",
                &[
                    ("raft-log-after-fsync", "2*off->return"),
                    ("snapshot-install-before", "50%return"),
                ],
            ),
        ];
        for (spec, want) in table {
            let got = parse(spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
            let got: Vec<(&str, &str)> = got.iter().map(|(n, a)| (*n, a.as_str())).collect();
            assert_eq!(&got, want, "{spec:?}");
        }
    }

    #[test]
    fn refuses_malformed_values_with_the_reason() {
        // Only refusals here: fail's registry is the process's, and an armed point would abort
        // the store's other tests.
        let table: &[(&str, FailpointError, &str)] = &[
            (
                "return",
                FailpointError::Syntax {
                    entry: "return".into(),
                },
                "is not POINT=ACTIONS",
            ),
            (
                "apply-after=",
                FailpointError::Syntax {
                    entry: "apply-after=".into(),
                },
                "is not POINT=ACTIONS",
            ),
            (
                "raft-log-after-fsink=return",
                FailpointError::Unknown {
                    name: "raft-log-after-fsink".into(),
                },
                "the failpoints are raft-log-leader-before-fsync, raft-log-before-fsync,",
            ),
            (
                "apply-after=return;apply-after=off",
                FailpointError::Duplicate {
                    name: "apply-after".into(),
                },
                "appears twice",
            ),
        ];
        for (spec, want, says) in table {
            let got = err(spec);
            assert_eq!(&got, want, "{spec:?}");
            let message = got.to_string();
            assert!(message.starts_with("RKUBE_FAILPOINTS: "), "{message}");
            assert!(message.contains(says), "{spec:?}: {message}");
        }
    }

    #[test]
    fn bad_actions_arm_no_point() {
        // The first entry is valid; the second's actions are not, so neither may be armed.
        let got = err("apply-before=return;apply-after=retrun");
        let FailpointError::Actions { name, actions, .. } = &got else {
            panic!("{got:?}");
        };
        assert_eq!((name.as_str(), actions.as_str()), ("apply-after", "retrun"));
        assert!(
            got.to_string()
                .contains("cannot use \"retrun\" for apply-after"),
            "{got}"
        );
        assert!(
            !fail::list()
                .iter()
                .any(|(n, _)| FAILPOINTS.contains(&n.as_str())),
            "a point was armed: {:?}",
            fail::list()
        );
        // A point that is not armed does nothing.
        crash_point(APPLY_BEFORE);
    }

    #[test]
    fn points_are_unique() {
        let mut names = FAILPOINTS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FAILPOINTS.len());
    }
}
