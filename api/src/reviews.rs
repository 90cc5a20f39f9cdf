//! The kinds that are answered, never stored: access reviews (authorization.k8s.io), token and
//! self-subject reviews (authentication.k8s.io), and TokenRequest, the `token` subresource of a
//! ServiceAccount (`kubectl create token`).

use std::collections::BTreeMap;

use rkube_core::json::str_field as s;
use serde_json::{json, Value};

use crate::auth::User;
use crate::error::{ApiError, Cause};
use crate::handler::{Api, Target};
use crate::rbac::{strings, Attributes, Rule};
use crate::resources;
use crate::storage::Freshness;
use crate::token::{Grant, ObjectRef, ISSUER};

/// TokenRequest's defaults and floor (kube-apiserver's).
const DEFAULT_TOKEN_SECONDS: i64 = 3600;
const MIN_TOKEN_SECONDS: i64 = 600;
const MAX_TOKEN_SECONDS: i64 = 1 << 32;

fn user_info(u: &User) -> Value {
    let mut info = json!({"username": u.name, "groups": u.groups});
    if !u.uid.is_empty() {
        info["uid"] = json!(u.uid);
    }
    if !u.extra.is_empty() {
        info["extra"] = json!(u.extra);
    }
    info
}

fn invalid(kind: &str, field: &str, value: &Value, message: &str) -> ApiError {
    ApiError::invalid(
        "authorization.k8s.io",
        kind,
        "",
        vec![Cause {
            reason: "FieldValueInvalid",
            field: field.to_string(),
            message: format!("Invalid value: {value}: {message}"),
        }],
    )
}

/// The attributes an access review's spec asks about.
fn review_attributes(kind: &str, spec: &Value) -> Result<Attributes, ApiError> {
    match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(r), None) => Ok(Attributes::resource(
            s(r, "verb"),
            s(r, "group"),
            s(r, "resource"),
            s(r, "subresource"),
            s(r, "namespace"),
            s(r, "name"),
        )),
        (None, Some(n)) => Ok(Attributes::path(s(n, "verb"), s(n, "path"))),
        _ => Err(invalid(
            kind,
            "spec.resourceAttributes",
            &spec
                .get("resourceAttributes")
                .cloned()
                .unwrap_or(Value::Null),
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

fn answered(mut object: Value, status: Value) -> Result<Value, ApiError> {
    let o = object
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
    o.entry("metadata").or_insert_with(|| json!({}));
    o.insert("status".into(), status);
    crate::order::normalise(&mut object);
    Ok(object)
}

fn rule_json(r: &Rule) -> (bool, Value) {
    if r.non_resource_urls.is_empty() {
        let mut v = json!({"verbs": r.verbs, "apiGroups": r.api_groups, "resources": r.resources});
        if !r.resource_names.is_empty() {
            v["resourceNames"] = json!(r.resource_names);
        }
        (true, v)
    } else {
        (
            false,
            json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}),
        )
    }
}

impl Api {
    /// Answers a review kind's create; `user` is who is asking.
    pub(crate) async fn review(
        &self,
        user: &User,
        t: &Target,
        mut object: Value,
    ) -> Result<Value, ApiError> {
        let kind = t.res.kind;
        if let Some(o) = object.as_object_mut() {
            o.insert("apiVersion".into(), json!(t.res.api_version()));
            o.insert("kind".into(), json!(kind));
        }
        let spec = object.get("spec").cloned().unwrap_or(json!({}));
        let status = match kind {
            "SelfSubjectAccessReview" => {
                let a = review_attributes(kind, &spec)?;
                self.decide(user, &a)
            }
            "SubjectAccessReview" | "LocalSubjectAccessReview" => {
                let mut a = review_attributes(kind, &spec)?;
                if kind == "LocalSubjectAccessReview" {
                    let ns = t.namespace().unwrap_or("");
                    match &mut a.target {
                        crate::rbac::Target::Resource { namespace, .. } => {
                            if namespace.is_empty() {
                                *namespace = ns.to_string();
                            } else if namespace != ns {
                                return Err(invalid(
                                    kind,
                                    "spec.resourceAttributes.namespace",
                                    &json!(namespace),
                                    "must match metadata.namespace",
                                ));
                            }
                        }
                        crate::rbac::Target::NonResource { .. } => {
                            return Err(invalid(
                                kind,
                                "spec.nonResourceAttributes",
                                &spec["nonResourceAttributes"],
                                "disallowed on this kind of request",
                            ))
                        }
                    }
                    crate::value::set(&mut object, &["metadata", "namespace"], json!(ns));
                }
                let subject = User {
                    name: s(&spec, "user").to_string(),
                    groups: strings(spec.get("groups")),
                    uid: s(&spec, "uid").to_string(),
                    extra: spec
                        .get("extra")
                        .and_then(Value::as_object)
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), strings(Some(v))))
                                .collect::<BTreeMap<_, _>>()
                        })
                        .unwrap_or_default(),
                };
                if subject.name.is_empty() && subject.groups.is_empty() {
                    return Err(invalid(
                        kind,
                        "spec.user",
                        &json!(""),
                        "at least one of user or group must be specified",
                    ));
                }
                self.decide(&subject, &a)
            }
            "SelfSubjectRulesReview" => {
                let ns = s(&spec, "namespace");
                let mut resource_rules = Vec::new();
                let mut non_resource_rules = Vec::new();
                for r in self.authz.rules_for(user, ns) {
                    match rule_json(&r) {
                        (true, v) => resource_rules.push(v),
                        (false, v) => non_resource_rules.push(v),
                    }
                }
                json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                       "incomplete": false})
            }
            "SelfSubjectReview" => json!({"userInfo": user_info(user)}),
            "TokenReview" => {
                let token = s(&spec, "token");
                let wanted = strings(spec.get("audiences"));
                let audiences = if wanted.is_empty() {
                    vec![ISSUER.to_string()]
                } else {
                    wanted
                };
                if !audiences.iter().any(|a| a == ISSUER) {
                    json!({"authenticated": false, "error": "token audiences don't match the API server's"})
                } else {
                    match self.authenticate_token(token).await {
                        Ok(u) => json!({"authenticated": true, "user": user_info(&u),
                                        "audiences": [ISSUER]}),
                        Err(e) => json!({"authenticated": false, "error": e.message}),
                    }
                }
            }
            other => return Err(ApiError::internal(format!("{other} is not a review kind"))),
        };
        answered(object, status)
    }

    fn decide(&self, user: &User, a: &Attributes) -> Value {
        let d = self.authz.authorize(user, a);
        let mut status = json!({"allowed": d.allowed});
        if !d.reason.is_empty() {
            status["reason"] = json!(d.reason);
        }
        status
    }

    /// TokenRequest: a token for the ServiceAccount `t` names, optionally bound to a Pod,
    /// Secret or Node.
    pub(crate) async fn token_request(&self, t: &Target, body: Value) -> Result<Value, ApiError> {
        let ns = t.namespace().unwrap_or("").to_string();
        let name = t.object_name().to_string();
        let sa_res = t.res;
        let sa = match self
            .store
            .get(&sa_res.key(Some(&ns), &name), Freshness::Any)
            .await?
        {
            Some(s) => s,
            None => self
                .store
                .get(&sa_res.key(Some(&ns), &name), Freshness::Latest)
                .await?
                .ok_or_else(|| ApiError::not_found("", "serviceaccounts", &name))?,
        };
        let sa_uid = sa
            .object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let mut spec = body.get("spec").cloned().unwrap_or(json!({}));
        let seconds = match spec.get("expirationSeconds") {
            None | Some(Value::Null) => DEFAULT_TOKEN_SECONDS,
            Some(v) => v.as_i64().ok_or_else(|| {
                ApiError::bad_request("spec.expirationSeconds must be an integer")
            })?,
        };
        let token_invalid = |field: &str, value: Value, message: &str| {
            ApiError::invalid(
                "authentication.k8s.io",
                "TokenRequest",
                &name,
                vec![Cause {
                    reason: "FieldValueInvalid",
                    field: field.to_string(),
                    message: format!("Invalid value: {value}: {message}"),
                }],
            )
        };
        if seconds < MIN_TOKEN_SECONDS {
            return Err(token_invalid(
                "spec.expirationSeconds",
                json!(seconds),
                "may not specify a duration less than 10 minutes",
            ));
        }
        if seconds > MAX_TOKEN_SECONDS {
            return Err(token_invalid(
                "spec.expirationSeconds",
                json!(seconds),
                "may not specify a duration larger than 2^32 seconds",
            ));
        }
        let mut audiences = strings(spec.get("audiences"));
        if audiences.is_empty() {
            audiences = vec![ISSUER.to_string()];
        }
        let bound = match spec.get("boundObjectRef").filter(|b| !b.is_null()) {
            None => None,
            Some(b) => {
                let kind = s(b, "kind");
                let bname = s(b, "name");
                let (res, bns) = match kind {
                    "Pod" => (resources::find("", "v1", "pods"), Some(ns.as_str())),
                    "Secret" => (resources::find("", "v1", "secrets"), Some(ns.as_str())),
                    "Node" => (resources::find("", "v1", "nodes"), None),
                    other => {
                        return Err(token_invalid(
                            "spec.boundObjectRef.kind",
                            json!(other),
                            "supported values: \"Pod\", \"Secret\", \"Node\"",
                        ))
                    }
                };
                let res = res.ok_or_else(|| ApiError::internal("bound kinds are served"))?;
                let found = self
                    .store
                    .get(&res.key(bns, bname), Freshness::Latest)
                    .await?
                    .ok_or_else(|| ApiError::not_found("", res.plural, bname))?;
                let uid = found
                    .object
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let want = s(b, "uid");
                if !want.is_empty() && want != uid {
                    return Err(ApiError::conflict(
                        "",
                        res.plural,
                        bname,
                        &format!("the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"),
                    ));
                }
                Some((
                    match kind {
                        "Pod" => "Pod",
                        "Secret" => "Secret",
                        _ => "Node",
                    },
                    ObjectRef {
                        name: bname.to_string(),
                        uid,
                    },
                ))
            }
        };
        let now = chrono::Utc::now();
        let (token, claims) = self
            .tokens
            .issue(Grant {
                namespace: &ns,
                service_account: ObjectRef {
                    name: name.clone(),
                    uid: sa_uid,
                },
                audiences: audiences.clone(),
                expiration_seconds: seconds,
                bound,
                now: now.timestamp(),
                id: crate::handler::new_uid(),
            })
            .map_err(|e| ApiError::internal(e.to_string()))?;
        spec["audiences"] = json!(audiences);
        spec["expirationSeconds"] = json!(seconds);
        let expires = chrono::DateTime::from_timestamp(claims.exp, 0)
            .unwrap_or(now)
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut answer = json!({
            "kind": "TokenRequest",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"name": name, "namespace": ns,
                         "creationTimestamp": now.format("%Y-%m-%dT%H:%M:%SZ").to_string()},
            "spec": spec,
            "status": {"token": token, "expirationTimestamp": expires},
        });
        crate::order::normalise(&mut answer);
        Ok(answer)
    }
}
