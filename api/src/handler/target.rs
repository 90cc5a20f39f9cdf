//! What a URL names: the resource, namespace, object and subresource a path addresses, and the
//! attributes a request on it is authorized by.

use hyper::Method;

use crate::error::ApiError;
use crate::query::Query;
use crate::rbac::Attributes;
use crate::resources::{self, Resource};

/// What a URL names: a resource, maybe a namespace, an object and a subresource.
pub struct Target {
    pub(crate) res: &'static Resource,
    pub(super) ns: Option<String>,
    pub(super) name: Option<String>,
    pub(super) sub: Option<String>,
}

impl Target {
    pub fn new(res: &'static Resource, ns: Option<String>, name: Option<String>) -> Target {
        Target {
            res,
            ns,
            name,
            sub: None,
        }
    }

    pub(super) fn key(&self) -> String {
        self.res
            .key(self.ns.as_deref(), self.name.as_deref().unwrap_or(""))
    }
    pub(super) fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }
    pub(crate) fn object_name(&self) -> &str {
        self.name()
    }
    pub(crate) fn namespace(&self) -> Option<&str> {
        self.ns.as_deref()
    }

    /// What the request asks to do, for authorization (Kubernetes' RequestInfo): the verb
    /// follows the method, and a list or watch of one name by field selector names it.
    pub(super) fn attributes(&self, method: &Method, q: &Query) -> Attributes {
        self.attributes_for(request_verb(method, self.name.is_some(), q), q)
    }

    /// The attributes of `verb` on this target.
    pub(super) fn attributes_for(&self, verb: &str, q: &Query) -> Attributes {
        let name = match &self.name {
            Some(n) => n.clone(),
            None => q
                .get("fieldSelector")
                .and_then(|f| {
                    f.split(',').find_map(|term| {
                        let (k, v) = term.split_once('=')?;
                        (k == "metadata.name").then(|| v.trim_start_matches('=').to_string())
                    })
                })
                .unwrap_or_default(),
        };
        Attributes::resource(
            verb,
            self.res.group,
            self.res.plural,
            self.sub.as_deref().unwrap_or(""),
            if self.res.namespaced {
                self.ns.as_deref().unwrap_or("")
            } else {
                ""
            },
            &name,
        )
    }
}

/// The verb an HTTP method asks for on a target with or without a name (Kubernetes'
/// RequestInfo).
pub(super) fn request_verb(method: &Method, named: bool, q: &Query) -> &'static str {
    match *method {
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD if q.flag("watch") => "watch",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

pub(super) fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

pub(super) fn parse_target(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let find = |plural: &str| resources::find(group, version, plural).ok_or_else(not_found_path);
    let (res, ns, tail): (&Resource, Option<String>, &[&str]) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !(group.is_empty() && (*plural == "status" || *plural == "finalize")) =>
        {
            let res = find(plural)?;
            if !res.namespaced {
                return Err(not_found_path());
            }
            (res, Some(ns.to_string()), tail)
        }
        [plural, tail @ ..] => (find(plural)?, None, tail),
        [] => return Err(not_found_path()),
    };
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub] => {
            if !res.subresources.contains(sub) {
                return Err(not_found_path());
            }
            (Some(name.to_string()), Some(sub.to_string()))
        }
        _ => return Err(not_found_path()),
    };
    // A namespaced object is only addressed inside its namespace.
    if res.namespaced && ns.is_none() && name.is_some() {
        return Err(not_found_path());
    }
    Ok(Target { res, ns, name, sub })
}

/// The stored resource's target and query a request to a view is served as.
pub(super) fn stored_target(
    view: &crate::view::View,
    t: Target,
    q: &Query,
) -> Result<(Target, Query), ApiError> {
    let (group, version, plural) = view.stored;
    let stored = resources::find(group, version, plural)
        .ok_or_else(|| ApiError::internal("a view's stored resource is served"))?;
    Ok((Target { res: stored, ..t }, (view.query_to_stored)(q)))
}
