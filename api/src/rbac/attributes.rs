//! What a request asks to do, and the 403 when it may not.

use crate::auth::User;
use crate::error::ApiError;

/// What a request asks to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`... for resources; the lower-case HTTP method for paths.
    pub verb: String,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Resource {
        group: String,
        resource: String,
        subresource: String,
        namespace: String,
        name: String,
    },
    NonResource {
        path: String,
    },
}

impl Attributes {
    pub fn resource(
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            target: Target::Resource {
                group: group.to_string(),
                resource: resource.to_string(),
                subresource: subresource.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
        }
    }

    pub fn path(verb: &str, path: &str) -> Attributes {
        Attributes {
            verb: verb.to_string(),
            target: Target::NonResource {
                path: path.to_string(),
            },
        }
    }

    pub(super) fn namespace(&self) -> &str {
        match &self.target {
            Target::Resource { namespace, .. } => namespace,
            Target::NonResource { .. } => "",
        }
    }

    /// The 403 a denied request gets, worded as kube-apiserver words it.
    pub fn forbidden(&self, user: &User) -> ApiError {
        let who = &user.name;
        let verb = &self.verb;
        match &self.target {
            Target::NonResource { path } => ApiError::forbidden(format!(
                "forbidden: User {who:?} cannot {verb} path {path:?}"
            )),
            Target::Resource {
                group,
                resource,
                subresource,
                namespace,
                name,
            } => {
                let combined = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                let scope = if namespace.is_empty() {
                    "at the cluster scope".to_string()
                } else {
                    format!("in the namespace {namespace:?}")
                };
                let qualified = if group.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}.{group}")
                };
                let subject = if name.is_empty() {
                    qualified
                } else {
                    format!("{qualified} {name:?}")
                };
                let mut e = ApiError::forbidden(format!(
                    "{subject} is forbidden: User {who:?} cannot {verb} resource {combined:?} in API group {group:?} {scope}"
                ));
                e.group = (!group.is_empty()).then(|| group.clone());
                e.kind = Some(resource.clone());
                e.name = Some(name.clone());
                e
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rbac::testing::user;

    #[test]
    fn forbidden_messages_use_kubernetes_wording() {
        let jane = user("jane", &[]);
        let e = Attributes::resource("create", "", "pods", "", "default", "").forbidden(&jane);
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "pods is forbidden: User \"jane\" cannot create resource \"pods\" in API group \"\" in the namespace \"default\""
        );
        let e = Attributes::resource("get", "apps", "deployments", "scale", "dev", "web")
            .forbidden(&jane);
        assert_eq!(
            e.message,
            "deployments.apps \"web\" is forbidden: User \"jane\" cannot get resource \"deployments/scale\" in API group \"apps\" in the namespace \"dev\""
        );
        let e = Attributes::resource("list", "", "nodes", "", "", "").forbidden(&jane);
        assert!(e.message.ends_with("at the cluster scope"), "{}", e.message);
        let e = Attributes::path("get", "/metrics").forbidden(&jane);
        assert_eq!(
            e.message,
            "forbidden: User \"jane\" cannot get path \"/metrics\""
        );
    }
}
