//! The objects the tests read: a NodePort Service with endpoints on nodes a and b (one not
//! ready), a Service without endpoints and a headless one.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

pub(super) fn objects() -> (HashMap<String, Service>, HashMap<String, EndpointSlice>) {
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
    .map(|(k, v)| (k.to_string(), serde_json::from_value(v).expect("a Service")))
    .collect();
    let slice = serde_json::from_value(slice).expect("an EndpointSlice");
    let slices = [("default/web-abc".to_string(), slice)]
        .into_iter()
        .collect();
    (services, slices)
}
