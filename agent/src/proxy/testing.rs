//! The objects the tests read: a NodePort Service with endpoints on nodes a and b (one not
//! ready), a Service without endpoints and a headless one.

use std::collections::HashMap;

use serde_json::{json, Value};

pub(super) fn objects() -> (HashMap<String, Value>, HashMap<String, Value>) {
    let svc = json!({"metadata": {"namespace": "default", "name": "web"},
        "spec": {"type": "NodePort", "clusterIP": "10.96.0.20", "clusterIPs": ["10.96.0.20"],
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30008, "protocol": "TCP"}]}});
    let empty = json!({"metadata": {"namespace": "default", "name": "nobody"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.30",
                 "ports": [{"port": 81, "protocol": "TCP"}]}});
    let headless = json!({"metadata": {"namespace": "default", "name": "db"},
        "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}});
    let slice = json!({"metadata": {"namespace": "default", "name": "web-abc",
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {"addresses": ["10.244.1.5"], "conditions": {"ready": true}, "nodeName": "a"},
            {"addresses": ["10.244.2.7"], "conditions": {"ready": true}, "nodeName": "b"},
            {"addresses": ["10.244.2.9"], "conditions": {"ready": false}, "nodeName": "b"}]});
    let services = [
        ("default/web", svc),
        ("default/nobody", empty),
        ("default/db", headless),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let slices = [("default/web-abc".to_string(), slice)]
        .into_iter()
        .collect();
    (services, slices)
}
