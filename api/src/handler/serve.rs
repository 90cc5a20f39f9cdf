//! The verbs on one resource, whoever asks: what a request asks ([`Verb`], its body decoded
//! once), the dispatch to reads, writes and subresources ([`Api::serve`]), and what a verb
//! answers before it is rendered ([`Answer`]).

use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;
use crate::patch::PatchType;
use crate::query::Query;
use crate::storage::Fence;

use super::reads::Listed;
use super::update::scale_of;
use super::{answered, Api, Target};

/// What a resource request asks, its body decoded: the same whether it came over HTTP or from
/// the in-process client.
pub(crate) enum Verb<'a> {
    /// One object (a name on the path).
    Get,
    /// A collection.
    List,
    /// A POST: a new object, or the body of a subresource (binding, eviction, token).
    Create(Value),
    Update(Value),
    Patch(Patch<'a>),
    /// One object, with the DeleteOptions the request carried.
    Delete(Option<Value>),
    DeleteCollection,
}

impl Verb<'_> {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Create(_) => "create",
            Verb::Update(_) => "update",
            Verb::Patch(_) => "patch",
            Verb::Delete(_) => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }

    /// The body of a request to a view in the stored form.
    pub(super) fn into_stored(self, view: &crate::view::View) -> Self {
        match self {
            Verb::Create(mut o) => {
                (view.to_stored)(&mut o);
                Verb::Create(o)
            }
            Verb::Update(mut o) => {
                (view.to_stored)(&mut o);
                Verb::Update(o)
            }
            Verb::Patch(mut p) => {
                view.patch_to_stored(p.kind, &mut p.body);
                Verb::Patch(p)
            }
            other => other,
        }
    }
}

/// A PATCH's body, decoded.
pub(crate) struct Patch<'a> {
    pub(crate) kind: PatchType,
    pub(crate) body: Value,
    /// The bytes it was decoded from, when it came over HTTP: field validation finds duplicate
    /// fields in them (a decoded value has none).
    pub(crate) raw: Option<&'a [u8]>,
}

impl<'a> Patch<'a> {
    /// A patch of `kind` as the client built it.
    pub(crate) fn value(kind: PatchType, body: Value) -> Patch<'static> {
        Patch {
            kind,
            body,
            raw: None,
        }
    }

    /// A patch from a request body: YAML for an apply, JSON for the others.
    pub(super) fn decode(kind: PatchType, raw: &'a [u8]) -> Result<Patch<'a>, ApiError> {
        let body = match kind {
            PatchType::Apply => serde_yaml::from_slice(raw)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
            _ => serde_json::from_slice(raw)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        };
        Ok(Patch {
            kind,
            body,
            raw: Some(raw),
        })
    }
}

/// What a verb answers, before it is rendered.
pub(crate) enum Answer {
    /// One stored object: a request's Accept header picks the object, its metadata or a table.
    Object(Value),
    /// One page of a collection, rendered per Accept as well.
    List(Listed),
    /// A body answered as it is with this status code: a written object, a Scale, a Status.
    Json(u16, Value),
}

pub(super) fn verb_allowed(t: &Target, verb: &str) -> Result<(), ApiError> {
    if t.res.serves(verb) {
        Ok(())
    } else {
        Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {})",
            verb,
            t.res.qualified()
        )))
    }
}

impl Api {
    /// The verbs on one resource, whoever asks: an HTTP request (rendered by
    /// [`Api::resource`]) or the in-process client ([`Api::call`]). The caller has
    /// authenticated and authorized `user`; `fence` says who may commit the writes. Returns the
    /// answer and the warnings of a patch's field validation.
    pub(crate) async fn serve(
        &self,
        user: &User,
        t: &Target,
        q: &Query,
        verb: Verb<'_>,
        fence: Fence,
    ) -> Result<(Answer, Vec<String>), ApiError> {
        let answer = match (verb, t.name.is_some(), t.sub.as_deref()) {
            (Verb::List, false, None) if t.res.is_virtual() => {
                verb_allowed(t, "list")?;
                let listed = self.answered_list(t, q).await?;
                return Ok((Answer::List(listed), answered::warnings(t)));
            }
            (Verb::Get, true, None) if t.res.is_virtual() => {
                verb_allowed(t, "get")?;
                let object = self.answered_get(t).await?;
                return Ok((Answer::Object(object), answered::warnings(t)));
            }
            (Verb::List, false, None) => {
                verb_allowed(t, "list")?;
                Answer::List(self.list(t, q).await?)
            }
            (Verb::Get, true, sub) => {
                verb_allowed(t, "get")?;
                let stored = self.get(t, q).await?;
                match sub {
                    Some("scale") => Answer::Json(200, scale_of(t.res, &stored.object)),
                    _ => Answer::Object(stored.object),
                }
            }
            (Verb::Create(object), false, None) if t.res.is_virtual() => {
                verb_allowed(t, "create")?;
                Answer::Json(201, self.answer_create(user, t, q, object, fence).await?)
            }
            (Verb::Create(object), true, Some("token")) => {
                if let Some(node) = crate::node_authz::node_of(user) {
                    self.node_token_restriction(node, t, &object).await?;
                }
                Answer::Json(201, self.token_request(t, object).await?)
            }
            (Verb::Create(mut object), false, None) => {
                verb_allowed(t, "create")?;
                t.res.strategy.prepare_for_user(user, &mut object)?;
                Answer::Json(201, self.create(t, q, object, fence).await?)
            }
            (Verb::Create(binding), true, Some("binding")) => {
                Answer::Json(201, self.bind(t, q, binding, fence).await?)
            }
            (Verb::Create(eviction), true, Some("eviction")) => {
                Answer::Json(201, self.evict(t, q, eviction, fence).await?)
            }
            (Verb::Update(object), true, sub) => {
                verb_allowed(t, "update")?;
                Answer::Json(200, self.update(t, q, object, sub, fence).await?)
            }
            (Verb::Patch(patch), true, sub) => {
                verb_allowed(t, "patch")?;
                let patched = self.patch(t, q, patch, sub, fence).await?;
                let code = if patched.created { 201 } else { 200 };
                return Ok((Answer::Json(code, patched.object), patched.warnings));
            }
            (Verb::Delete(opts), true, None) => {
                verb_allowed(t, "delete")?;
                Answer::Json(200, self.delete(t, q, opts.as_ref(), fence).await?)
            }
            (Verb::DeleteCollection, false, None) => {
                verb_allowed(t, "deletecollection")?;
                Answer::Json(200, self.delete_collection(t, q, fence).await?)
            }
            _ => {
                return Err(ApiError::method_not_allowed(
                    "the server does not allow this method on the requested resource",
                ))
            }
        };
        Ok((answer, Vec::new()))
    }
}
