//! Events as Kubernetes' controllers record them: a core/v1 Event about an object, with reason,
//! message and the reporting component; the same event again only raises its count and
//! lastTimestamp.

use std::collections::HashMap;
use std::sync::Mutex;

use rkube_api::client::LocalClient;
use serde_json::{json, Value};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// (object uid, type, reason, message): what makes two events the same.
type EventKey = (String, String, String, String);

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

    /// Records an event about `object`; a failure to record is logged, never returned.
    pub async fn event(&self, object: &Value, kind: &str, ty: &str, reason: &str, message: &str) {
        let meta = |f: &str| {
            object
                .pointer(&format!("/metadata/{f}"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (ns, name, uid) = (meta("namespace"), meta("name"), meta("uid"));
        let ns = if ns.is_empty() {
            "default".to_string()
        } else {
            ns
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
            let path = format!("/api/v1/namespaces/{ens}/events/{ename}");
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
                "kind": kind,
                "namespace": meta("namespace"),
                "name": name,
                "uid": uid,
                "apiVersion": object.get("apiVersion").cloned().unwrap_or(Value::Null),
                "resourceVersion": meta("resourceVersion"),
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
            .create(&format!("/api/v1/namespaces/{ns}/events"), &event)
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
