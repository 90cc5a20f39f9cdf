//! The API's Services and EndpointSlices, kept in memory by a list and a watch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use rkube_core::meta;

use crate::join::Clients;

/// Keeps `into` equal to the API's objects of kind `K` (all namespaces), by `namespace/name`;
/// `changed` is notified on every change.
pub(super) async fn mirror<K>(
    clients: Arc<Clients>,
    into: Arc<Mutex<HashMap<String, K>>>,
    changed: Arc<tokio::sync::Notify>,
) where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let key = |o: &K| {
        let m = o.meta();
        format!("{}/{}", meta::namespace(m), meta::name(m))
    };
    loop {
        let api: Api<K> = Api::all(clients.get());
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "listing for the service proxy failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut rv = list.metadata.resource_version.clone().unwrap_or_default();
        {
            let mut m = into.lock().unwrap_or_else(|e| e.into_inner());
            m.clear();
            for o in list.items {
                m.insert(key(&o), o);
            }
        }
        changed.notify_one();
        'watch: loop {
            let stream = match api.watch(&WatchParams::default().timeout(290), &rv).await {
                Ok(s) => s,
                Err(_) => break,
            };
            let mut stream = Box::pin(stream);
            while let Some(ev) = stream.next().await {
                let (o, gone) = match ev {
                    Ok(WatchEvent::Added(o)) | Ok(WatchEvent::Modified(o)) => (o, false),
                    Ok(WatchEvent::Deleted(o)) => (o, true),
                    Ok(WatchEvent::Bookmark(b)) => {
                        rv = b.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(_)) | Err(_) => break 'watch,
                };
                rv = o.meta().resource_version.clone().unwrap_or_default();
                let mut m = into.lock().unwrap_or_else(|e| e.into_inner());
                if gone {
                    m.remove(&key(&o));
                } else {
                    m.insert(key(&o), o);
                }
                drop(m);
                changed.notify_one();
            }
        }
    }
}
