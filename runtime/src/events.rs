//! Events as Kubernetes' controllers record them: a core/v1 Event about an object, with reason,
//! message and the reporting component; the same event again only raises its count and
//! lastTimestamp.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rkube_api::client::LocalClient;
use serde_json::{json, Value};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// (object uid, type, reason, message): what makes two events the same.
type EventKey = (String, String, String, String);

/// The object an event is about, as `involvedObject` names it.
struct Involved<'a> {
    kind: &'a str,
    api_version: Option<&'a str>,
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    resource_version: &'a str,
}

pub struct Recorder {
    client: LocalClient,
    component: &'static str,
    /// (object uid, type, reason, message) -> (namespace, event name, count)
    seen: Mutex<HashMap<EventKey, (String, String, i64)>>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl Recorder {
    pub fn new(client: LocalClient, component: &'static str) -> Recorder {
        Recorder {
            client,
            component,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event about `object`, a `kind` held as JSON; a failure to record is logged,
    /// never returned.
    pub async fn event(&self, object: &Value, kind: &str, ty: &str, reason: &str, message: &str) {
        let meta = |f: &str| {
            object
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let involved = Involved {
            kind,
            api_version: object.get("apiVersion").and_then(Value::as_str),
            namespace: meta("namespace"),
            name: meta("name"),
            uid: meta("uid"),
            resource_version: meta("resourceVersion"),
        };
        self.record(involved, ty, reason, message).await
    }

    /// Records an event about a typed `object`; a failure to record is logged, never returned.
    pub async fn event_for<K>(&self, object: &K, ty: &str, reason: &str, message: &str)
    where
        K: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>,
    {
        let m = object.metadata();
        let involved = Involved {
            kind: K::KIND,
            api_version: Some(K::API_VERSION),
            namespace: m.namespace.as_deref().unwrap_or(""),
            name: m.name.as_deref().unwrap_or(""),
            uid: m.uid.as_deref().unwrap_or(""),
            resource_version: m.resource_version.as_deref().unwrap_or(""),
        };
        self.record(involved, ty, reason, message).await
    }

    async fn record(&self, involved: Involved<'_>, ty: &str, reason: &str, message: &str) {
        let (name, uid) = (involved.name, involved.uid.to_string());
        let ns = match involved.namespace {
            "" => "default".to_string(),
            ns => ns.to_string(),
        };
        let key = (
            uid.clone(),
            ty.to_string(),
            reason.to_string(),
            message.to_string(),
        );
        let known = self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let stamp = now();
        if let Some((ens, ename, count)) = known {
            let path = rkube_core::path::object::<Event>(&ens, &ename);
            let patch = json!({"count": count + 1, "lastTimestamp": stamp});
            if self.client.merge_patch(&path, &patch).await.is_ok() {
                self.remember(key, ens, ename, count + 1);
                return;
            }
        }
        let event_name = format!(
            "{name}.{:x}",
            chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
        );
        let event = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": event_name, "namespace": ns},
            "involvedObject": {
                "kind": involved.kind,
                "namespace": involved.namespace,
                "name": name,
                "uid": uid,
                "apiVersion": involved.api_version,
                "resourceVersion": involved.resource_version,
            },
            "reason": reason,
            "message": message,
            "source": {"component": self.component},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "type": ty,
            "reportingComponent": self.component,
            "reportingInstance": "",
        });
        match self
            .client
            .create(&rkube_core::path::collection::<Event>(&ns), &event)
            .await
        {
            Ok(_) => self.remember(key, ns, event_name, 1),
            Err(e) => tracing::debug!(error = %e, reason, "recording an event failed"),
        }
    }

    fn remember(&self, key: EventKey, ns: String, name: String, n: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        // A bounded memory: forget everything when it grows large (events then start anew).
        if seen.len() > 4096 {
            seen.clear();
        }
        seen.insert(key, (ns, name, n));
    }
}
