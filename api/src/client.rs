//! An in-process client of the API: what the controllers and the scheduler running on the leader
//! use to write. A request goes through the same route as one from the network — validation,
//! admission, resourceVersion checks — only without TLS and HTTP framing.

use std::sync::Arc;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper::{Method, Request};
use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;
use crate::handler::Api;

#[derive(Clone)]
pub struct LocalClient {
    api: Arc<Api>,
    user: Arc<User>,
    /// The Raft term whose leader this client writes for (controllers, scheduler): writes are
    /// refused once this member no longer leads it.
    term: Option<u64>,
}

/// The reasons a Status can carry, so an error read back keeps its meaning for callers.
const REASONS: &[&str] = &[
    "AlreadyExists",
    "BadRequest",
    "Conflict",
    "Expired",
    "Forbidden",
    "Gone",
    "InternalError",
    "Invalid",
    "MethodNotAllowed",
    "NotFound",
    "ServiceUnavailable",
    "Timeout",
    "TooManyRequests",
    "Unauthorized",
    "UnsupportedMediaType",
];

impl LocalClient {
    pub fn new(api: Arc<Api>, user: User) -> LocalClient {
        LocalClient {
            api,
            user: Arc::new(user),
            term: None,
        }
    }

    /// The same client, writing only as the leader of `term`.
    pub fn fenced(&self, term: u64) -> LocalClient {
        LocalClient {
            term: Some(term),
            ..self.clone()
        }
    }

    /// Sends one request; the answer's JSON body, or its Status as an error.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<Value, ApiError> {
        let bytes = match body {
            Some(b) => serde_json::to_vec(b).map_err(|e| ApiError::internal(e.to_string()))?,
            None => Vec::new(),
        };
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .header("accept", "application/json")
            .body(Body::from(bytes))
            .map_err(|e| ApiError::bad_request(format!("invalid request {path}: {e}")))?;
        let resp = match self.term {
            Some(term) => {
                crate::storage::LEADER_TERM
                    .scope(term, self.api.handle(&self.user, req))
                    .await
            }
            None => self.api.handle(&self.user, req).await,
        };
        let code = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .to_bytes();
        let value: Value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).map_err(|e| ApiError::internal(e.to_string()))?
        };
        if code < 400 {
            return Ok(value);
        }
        let reason = value.get("reason").and_then(Value::as_str).unwrap_or("");
        let reason = REASONS
            .iter()
            .find(|r| **r == reason)
            .copied()
            .unwrap_or("InternalError");
        let message = value
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        Err(ApiError::new(code, reason, message))
    }

    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.request(Method::GET, path, None, "application/json")
            .await
    }

    pub async fn create(&self, path: &str, object: &Value) -> Result<Value, ApiError> {
        self.request(Method::POST, path, Some(object), "application/json")
            .await
    }

    pub async fn update(&self, path: &str, object: &Value) -> Result<Value, ApiError> {
        self.request(Method::PUT, path, Some(object), "application/json")
            .await
    }

    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Value, ApiError> {
        self.request(
            Method::PATCH,
            path,
            Some(patch),
            "application/merge-patch+json",
        )
        .await
    }

    pub async fn delete(&self, path: &str, options: Option<&Value>) -> Result<Value, ApiError> {
        self.request(Method::DELETE, path, options, "application/json")
            .await
    }
}
