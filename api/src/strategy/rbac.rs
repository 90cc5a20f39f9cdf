//! Roles, ClusterRoles and their bindings: names are path segments, not DNS names.

use super::Strategy;

pub struct Rbac;

impl Strategy for Rbac {
    /// Anything but '/', '%', '.' and '..'.
    fn check_name(&self, name: &str) -> Option<String> {
        (name.is_empty() || name.contains('/') || name.contains('%') || name == "." || name == "..")
            .then(|| {
                format!(
                    "Invalid value: {name:?}: may not contain '/' or '%' and may not be '.' or '..'"
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_path_segments() {
        for (name, ok) in [
            ("system:admin", true),
            ("a.b", true),
            ("a/b", false),
            ("..", false),
            ("", false),
        ] {
            assert_eq!(Rbac.check_name(name).is_none(), ok, "{name:?}");
        }
    }
}
