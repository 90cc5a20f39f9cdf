//! The in-process client's entry ([`crate::client::LocalClient`]): a path and a verb go through
//! the checks a request from the network does, then [`Api::serve`], with no HTTP in between.

use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;
use crate::fieldvalidation;
use crate::query::Query;
use crate::storage::Fence;

use super::reads::list_object;
use super::serve::{Answer, Verb};
use super::target::{not_found_path, parse_target, stored_target};
use super::{meta_str, Api};

impl Api {
    /// A request of the in-process client ([`crate::client::LocalClient`]): `verb` on the
    /// resource `path` names (with its query), as `user`, through the same checks as one from
    /// the network — the in-flight limits, authorization, a node's restriction, field
    /// validation — and [`Api::serve`], with no HTTP in between. Answers the object (or list, or
    /// Status) a request would have had as its JSON body.
    pub(crate) async fn call(
        &self,
        user: &User,
        path: &str,
        verb: Verb<'_>,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let started = std::time::Instant::now();
        let name = verb.name();
        let result = self.call_inner(user, path, verb, fence).await;
        tracing::debug!(verb = name, %path, error = result.as_ref().err().map(|e| e.code),
                        user = %user.name, elapsed_ms = started.elapsed().as_millis() as u64,
                        "in-process api call");
        result
    }

    async fn call_inner(
        &self,
        user: &User,
        path: &str,
        verb: Verb<'_>,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let _permit = self.inflight(!matches!(verb, Verb::Get | Verb::List))?;
        let (path, query) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        let q = Query::parse(query);
        if q.flag("watch") {
            return Err(ApiError::bad_request(
                "the in-process client does not watch; use an informer",
            ));
        }
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let t = match segs.as_slice() {
            ["api", "v1", rest @ ..] if !rest.is_empty() => parse_target("", "v1", rest)?,
            ["apis", g, v, rest @ ..] if !rest.is_empty() => parse_target(g, v, rest)?,
            _ => return Err(not_found_path()),
        };
        if let Some(sub @ ("log" | "exec" | "attach" | "portforward")) = t.sub.as_deref() {
            return Err(ApiError::method_not_allowed(format!(
                "pods/{sub} streams from a node and is not served to the in-process client"
            )));
        }
        // A GET or a DELETE names one object or the whole collection by its path.
        let verb = match (verb, t.name.is_some()) {
            (Verb::Get, false) => Verb::List,
            (Verb::List, true) => Verb::Get,
            (Verb::Delete(_), false) => Verb::DeleteCollection,
            (Verb::DeleteCollection, true) => Verb::Delete(None),
            (verb, _) => verb,
        };
        let attributes = t.attributes_for(verb.name(), &q);
        self.authorize_resource(user, &attributes).await?;
        if let Some(node) = crate::node_authz::node_of(user) {
            let body_name = match &verb {
                Verb::Create(o) => meta_str(o, "name"),
                _ => None,
            };
            self.node_restriction(node, &attributes, body_name).await?;
        }
        let view = crate::view::of(t.res);
        let (t, q, verb) = match view {
            Some(view) => {
                let (t, q) = stored_target(view, t, &q)?;
                (t, q, verb.into_stored(view))
            }
            None => (t, q, verb),
        };
        // Unknown fields of a create or update body: a Strict request is refused; warnings have
        // nowhere to go.
        if let Verb::Create(o) | Verb::Update(o) = &verb {
            fieldvalidation::check_object(t.res, t.sub.as_deref(), o, &q)?;
        }
        let (answer, _warnings) = self.serve(user, &t, &q, verb, fence).await?;
        let mut value = match answer {
            Answer::Object(o) | Answer::Json(_, o) => o,
            Answer::List(l) => list_object(&t, l),
        };
        if let Some(view) = view {
            view.answer_from_stored(&mut value);
        }
        Ok(value)
    }
}
