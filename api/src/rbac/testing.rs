//! Fixtures the rbac tests share.

use crate::auth::User;

pub(super) fn user(name: &str, groups: &[&str]) -> User {
    User {
        name: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        ..User::default()
    }
}
