//! An in-process client of the API: what the controllers and the scheduler running on the leader
//! use to read and write. A call is a function call into the verbs a request from the network
//! reaches ([`Api::serve`](crate::handler::Api)) — authorization of the client's user,
//! validation, admission, resourceVersion checks, the same store writes — with no HTTP request,
//! no encoding of the body or the answer, and the [`ApiError`] as the verb returned it.

use std::sync::Arc;

use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;
use crate::handler::{Api, Patch, Verb};
use crate::patch::PatchType;
use crate::storage::Fence;

#[derive(Clone)]
pub struct LocalClient {
    api: Arc<Api>,
    user: Arc<User>,
    /// Who may commit this client's writes: [`Fence::Term`] for the controllers and the
    /// scheduler a leader runs, whose writes are refused once this member no longer leads it.
    fence: Fence,
}

impl LocalClient {
    pub fn new(api: Arc<Api>, user: User) -> LocalClient {
        LocalClient {
            api,
            user: Arc::new(user),
            fence: Fence::Any,
        }
    }

    /// The same client, writing only as the leader of `term`.
    pub fn fenced(&self, term: u64) -> LocalClient {
        LocalClient {
            fence: Fence::Term(term),
            ..self.clone()
        }
    }

    /// The fence this client's writes carry.
    pub fn fence(&self) -> Fence {
        self.fence
    }

    async fn call(&self, path: &str, verb: Verb<'_>) -> Result<Value, ApiError> {
        self.api.call(&self.user, path, verb, self.fence).await
    }

    /// An object, or a collection as its list (`path` may carry a query: selectors, limit).
    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.call(path, Verb::Get).await
    }

    /// POSTs `object` to `path`: a new object, or a subresource's body (a Binding, an
    /// Eviction). Answers what was stored (or the Status of a subresource).
    pub async fn create(&self, path: &str, object: &Value) -> Result<Value, ApiError> {
        self.call(path, Verb::Create(object.clone())).await
    }

    pub async fn update(&self, path: &str, object: &Value) -> Result<Value, ApiError> {
        self.call(path, Verb::Update(object.clone())).await
    }

    pub async fn patch(
        &self,
        path: &str,
        kind: PatchType,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        self.call(path, Verb::Patch(Patch::value(kind, patch.clone())))
            .await
    }

    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Value, ApiError> {
        self.patch(path, PatchType::Merge, patch).await
    }

    /// Deletes the object at `path` (with DeleteOptions), or the collection's matching objects.
    pub async fn delete(&self, path: &str, options: Option<&Value>) -> Result<Value, ApiError> {
        self.call(path, Verb::Delete(options.cloned())).await
    }
}
