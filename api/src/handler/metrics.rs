//! `metrics.k8s.io/v1beta1` NodeMetrics and PodMetrics, answered from the usage this member
//! scraped ([`crate::resource_metrics`]) for the Nodes and Pods the request selects (its
//! namespace, label selector, name), as metrics-server answers: an object only for what has a
//! usage, labelled as the Node or Pod is, with `timestamp` and `window`.

use chrono::Utc;
use rkube_core::quantity::format_quantity;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::query::Query;
use crate::resource_metrics::Usage;
use crate::resources;

use super::reads::Listed;
use super::{Api, Target};

fn usage_of(u: &Usage) -> Value {
    // metrics-server's units: CPU in nanocores, memory in Ki.
    json!({
        "cpu": format!("{}n", u.nanocores),
        "memory": format_quantity(((u.memory / 1024) as i128) * 1024 * 1_000_000_000, true),
    })
}

fn window(u: &Usage) -> String {
    let d = u.window;
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.3}s", d.as_secs_f64())
            .trim_end_matches('0')
            .to_string()
    }
}

fn timestamp(u: &Usage) -> String {
    u.timestamp
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn meta_of(o: &Value, namespaced: bool) -> Value {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut m = json!({"name": o.pointer("/metadata/name"), "creationTimestamp": now});
    if namespaced {
        m["namespace"] = o
            .pointer("/metadata/namespace")
            .cloned()
            .unwrap_or(Value::Null);
    }
    if let Some(l) = o.pointer("/metadata/labels") {
        m["labels"] = l.clone();
    }
    m
}

impl Api {
    /// The metrics of the Nodes or Pods `q` selects.
    pub(super) async fn metrics_list(&self, t: &Target, q: &Query) -> Result<Listed, ApiError> {
        let (plural, kind) = if t.res.kind == "NodeMetrics" {
            ("nodes", "NodeMetrics")
        } else {
            ("pods", "PodMetrics")
        };
        let res = resources::find("", "v1", plural)
            .ok_or_else(|| ApiError::internal("nodes and pods are served"))?;
        let sel = {
            let mut sel = form_urlencoded::Serializer::new(String::new());
            for k in ["labelSelector", "fieldSelector"] {
                if let Some(v) = q.get(k) {
                    sel.append_pair(k, v);
                }
            }
            Query::parse(Some(&sel.finish()))
        };
        let objects = self
            .list(&Target::new(res, t.ns.clone(), None), &sel)
            .await?;
        let items = objects
            .items
            .iter()
            .filter_map(|o| self.metrics_of(kind, o))
            .collect();
        Ok(Listed {
            items,
            meta: json!({}),
        })
    }

    fn metrics_of(&self, kind: &str, o: &Value) -> Option<Value> {
        let name = o.pointer("/metadata/name")?.as_str()?;
        if kind == "NodeMetrics" {
            let u = self.metrics.node(name)?;
            return Some(json!({
                "kind": kind, "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": meta_of(o, false),
                "timestamp": timestamp(&u), "window": window(&u), "usage": usage_of(&u),
            }));
        }
        let ns = o.pointer("/metadata/namespace")?.as_str()?;
        let containers = self.metrics.pod(ns, name)?;
        let first = containers.first()?.usage;
        Some(json!({
            "kind": kind, "apiVersion": "metrics.k8s.io/v1beta1",
            "metadata": meta_of(o, true),
            "timestamp": timestamp(&first), "window": window(&first),
            "containers": containers.iter().map(|c| json!({
                "name": c.name, "usage": usage_of(&c.usage),
            })).collect::<Vec<_>>(),
        }))
    }

    /// One Node's or Pod's metrics; metrics-server's NotFound names a pod with its namespace
    /// (`podmetrics.metrics.k8s.io "default/web" not found`).
    pub(super) async fn metrics_get(&self, t: &Target) -> Result<Value, ApiError> {
        let (plural, kind, resource) = if t.res.kind == "NodeMetrics" {
            ("nodes", "NodeMetrics", "nodemetrics")
        } else {
            ("pods", "PodMetrics", "podmetrics")
        };
        let shown = match &t.ns {
            Some(ns) if t.res.namespaced => format!("{ns}/{}", t.name()),
            _ => t.name().to_string(),
        };
        let not_found = || ApiError::not_found("metrics.k8s.io", resource, &shown);
        let res = resources::find("", "v1", plural)
            .ok_or_else(|| ApiError::internal("nodes and pods are served"))?;
        let object = match self
            .store
            .get(
                &res.key(t.ns.as_deref(), t.name()),
                crate::storage::Freshness::Any,
            )
            .await?
        {
            Some(o) => o.object,
            None => return Err(not_found()),
        };
        self.metrics_of(kind, &object).ok_or_else(not_found)
    }
}
