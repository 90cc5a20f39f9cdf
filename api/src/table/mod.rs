//! Server-side printing: `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` turns objects
//! into rows with the columns kubectl shows for each kind (priority 1 columns appear with
//! `-o wide`). Also PartialObjectMetadata, the metadata-only form.
//!
//! `columns.rs` holds each kind's columns, `cells.rs` fills a row's cells by kind (the longer
//! Pod, Service and Node rows in `rows.rs`, those of the kinds stored for other programs in
//! `stored.rs`, volumes', claims' and storage classes' in `storage.rs`, Jobs' and CronJobs' in `batch.rs`), and `format.rs` writes durations, ages, selectors
//! and `<none>` as kubectl does.

mod autoscaling;
mod batch;
mod cells;
mod columns;
mod format;
mod rows;
mod storage;
mod stored;

use chrono::Utc;
use serde_json::{json, Value};

use crate::resources::Resource;
use cells::cells;
use columns::columns;
pub use format::human_duration;

/// What the client asked the response to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    Object,
    Table,
    Metadata,
}

pub fn form(accept: &str) -> Form {
    // The first acceptable media type wins, as in content negotiation.
    for part in accept.split(',') {
        if part.contains("as=Table") && part.contains("g=meta.k8s.io") {
            if part.contains("v=v1") && !part.contains("v=v1beta1") {
                return Form::Table;
            }
            continue;
        }
        if part.contains("as=PartialObjectMetadata")
            && part.contains("v=v1")
            && !part.contains("v=v1beta1")
        {
            return Form::Metadata;
        }
        if part.trim().starts_with("application/json") || part.contains("*/*") {
            return Form::Object;
        }
    }
    Form::Object
}

/// `PartialObjectMetadata` of an object.
pub fn metadata_only(o: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// A Table of objects. `include` is the includeObject parameter: None, Object or Metadata
/// (the default).
pub fn table(res: &Resource, objects: &[Value], list_meta: Value, include: &str) -> Value {
    let now = Utc::now();
    let defs: Vec<Value> = columns(res)
        .iter()
        .map(|(name, ty, priority)| {
            json!({"name": name, "type": ty, "format": if *name == "Name" { "name" } else { "" },
                   "description": "", "priority": priority})
        })
        .collect();
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let object = match include {
                "None" => Value::Null,
                "Object" => o.clone(),
                _ => metadata_only(o),
            };
            json!({"cells": cells(res, o, now), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    #[test]
    fn endpoint_slices_show_their_type_ports_and_first_addresses() {
        let res = find("discovery.k8s.io", "v1", "endpointslices").unwrap();
        let slice = json!({"metadata": {"name": "web-x", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "addressType": "IPv4", "ports": [{"port": 8080}, {"port": 53}],
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]},
                          {"addresses": ["10.0.0.3"]}, {"addresses": ["10.0.0.4"]}]});
        let t = table(res, &[slice], json!({}), "Metadata");
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[1], "IPv4");
        assert_eq!(cells[2], "8080,53");
        assert_eq!(cells[3], "10.0.0.1,10.0.0.2,10.0.0.3 + 1 more...");
    }

    #[test]
    fn pod_table_has_kubectl_columns() {
        let res = find("", "v1", "pods").unwrap();
        let pod = json!({"metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c"}], "nodeName": "n1"},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "containerStatuses": [{"ready": true, "restartCount": 2, "state": {"running": {}}}]}});
        let t = table(res, &[pod], json!({}), "Metadata");
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "1/1");
        assert_eq!(cells[2], "Running");
        assert_eq!(cells[3], 2);
        assert!(
            cells[4].as_str().unwrap().ends_with('y') || cells[4].as_str().unwrap().contains('y')
        );
        assert_eq!(cells[5], "10.0.0.5");
        assert_eq!(cells[6], "n1");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn accept_negotiation() {
        assert_eq!(form("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"), Form::Table);
        assert_eq!(form("application/json"), Form::Object);
        assert_eq!(
            form(
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
            ),
            Form::Metadata
        );
    }
}
