//! Typed writes over the in-process client: objects of one k8s-openapi type `K` in one
//! namespace, created, replaced, patched and deleted by name, with the paths made in one place
//! ([`rkube_core::path`]) from the type's own constants. What the API answers is decoded into
//! `K`. Patches stay JSON: they are partial objects by nature.

use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions;
use k8s_openapi::Resource;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::path;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// The objects of type `K` in one namespace (`""` for a cluster-scoped type), as one client
/// writes them.
pub struct Objects<'c, K> {
    client: &'c LocalClient,
    namespace: &'c str,
    kind: PhantomData<fn() -> K>,
}

/// A write whose object is gone (404) or moved (409) meanwhile is not an error for a
/// controller: the informer's event about it brings another reconcile.
pub fn ignore_gone<T>(r: Result<T, ApiError>) -> Result<Option<T>, ApiError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code == 404 || e.code == 409 => Ok(None),
        Err(e) => Err(e),
    }
}

fn encode<K: Serialize>(object: &K) -> Result<Value, ApiError> {
    serde_json::to_value(object).map_err(|e| {
        ApiError::internal(format!(
            "cannot encode a {}: {e}",
            std::any::type_name::<K>()
        ))
    })
}

fn decode<K: Resource + DeserializeOwned>(object: Value) -> Result<K, ApiError> {
    serde_json::from_value(object).map_err(|e| {
        ApiError::internal(format!(
            "the API answered a {} that does not decode: {e}",
            K::KIND
        ))
    })
}

/// Deletes the object at API path `path` with `options`, for callers that know an object by
/// its resource rather than by type (the garbage collector).
pub async fn delete_at(
    client: &LocalClient,
    path: &str,
    options: &DeleteOptions,
) -> Result<(), ApiError> {
    let mut body = encode(options)?;
    if let Some(o) = body.as_object_mut() {
        o.insert("kind".into(), "DeleteOptions".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    client.delete(path, Some(&body)).await.map(|_| ())
}

impl<'c, K: Resource + Serialize + DeserializeOwned> Objects<'c, K> {
    pub fn namespaced(client: &'c LocalClient, namespace: &'c str) -> Self {
        Objects {
            client,
            namespace,
            kind: PhantomData,
        }
    }

    fn path(&self, name: &str) -> String {
        path::object::<K>(self.namespace, name)
    }

    /// Creates `object` (its `metadata.name` or `generateName` names it); answers what was
    /// stored.
    pub async fn create(&self, object: &K) -> Result<K, ApiError> {
        let body = encode(object)?;
        let path = path::collection::<K>(self.namespace);
        decode(self.client.create(&path, &body).await?)
    }

    /// Reads object `name` from the API (not from a cache).
    pub async fn get(&self, name: &str) -> Result<K, ApiError> {
        decode(self.client.get(&self.path(name)).await?)
    }

    /// Replaces object `name` with `object` (its resourceVersion is the precondition).
    pub async fn replace(&self, name: &str, object: &K) -> Result<K, ApiError> {
        let body = encode(object)?;
        decode(self.client.update(&self.path(name), &body).await?)
    }

    /// Replaces the status of `object` (named by its metadata; its resourceVersion is the
    /// precondition).
    pub async fn replace_status(&self, name: &str, object: &K) -> Result<K, ApiError> {
        self.replace_subresource(name, "status", object).await
    }

    /// Replaces `object` through one of its subresources (`status`, a CSR's `approval`).
    pub async fn replace_subresource(
        &self,
        name: &str,
        subresource: &str,
        object: &K,
    ) -> Result<K, ApiError> {
        let body = encode(object)?;
        let path = format!("{}/{subresource}", self.path(name));
        decode(self.client.update(&path, &body).await?)
    }

    /// A JSON merge patch (RFC 7386) of the status of object `name`.
    pub async fn merge_patch_status(&self, name: &str, patch: &Value) -> Result<K, ApiError> {
        let path = format!("{}/status", self.path(name));
        decode(self.client.merge_patch(&path, patch).await?)
    }

    /// A JSON merge patch (RFC 7386) of object `name`.
    pub async fn merge_patch(&self, name: &str, patch: &Value) -> Result<K, ApiError> {
        decode(self.client.merge_patch(&self.path(name), patch).await?)
    }

    /// Deletes object `name` (with the API's default propagation).
    pub async fn delete(&self, name: &str) -> Result<(), ApiError> {
        self.client.delete(&self.path(name), None).await.map(|_| ())
    }

    /// Deletes object `name` with `options` (grace period, preconditions, propagation).
    pub async fn delete_with(&self, name: &str, options: &DeleteOptions) -> Result<(), ApiError> {
        delete_at(self.client, &self.path(name), options).await
    }
}
