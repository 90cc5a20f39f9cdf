//! The cells after the name of the three kinds whose rows take the most working out: Pod,
//! Service and Node.

use rkube_core::json::int_at as i;
use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use super::format::{arr, or_none, selector_string};

/// The READY, STATUS and RESTARTS columns as kubectl's pod printer derives them: init
/// containers first (`Init:1/2`, `Init:Error`, `Init:CrashLoopBackOff`; sidecars, init
/// containers that always restart, count as containers once started), then the containers,
/// last to first, the first waiting or terminated reason winning.
pub(super) fn pod_row(p: &Value) -> Vec<Value> {
    let init_specs = arr(p, "/spec/initContainers");
    let sidecar = |name: &str| {
        init_specs
            .iter()
            .any(|c| s(c, "/name") == name && s(c, "/restartPolicy") == "Always")
    };
    let mut total = arr(p, "/spec/containers").len()
        + init_specs
            .iter()
            .filter(|c| s(c, "/restartPolicy") == "Always")
            .count();
    let mut ready = 0;
    let mut restarts: i64 = 0;
    let mut sidecar_restarts: i64 = 0;
    let mut reason = s(p, "/status/phase").to_string();
    if !s(p, "/status/reason").is_empty() {
        reason = s(p, "/status/reason").to_string();
    }
    let exit_reason = |c: &Value, prefix: &str| -> String {
        let signal = i(c, "/state/terminated/signal");
        match c
            .pointer("/state/terminated/reason")
            .and_then(Value::as_str)
        {
            Some(r) if !r.is_empty() => format!("{prefix}{r}"),
            _ if signal != 0 => format!("{prefix}Signal:{signal}"),
            _ => format!("{prefix}ExitCode:{}", i(c, "/state/terminated/exitCode")),
        }
    };
    let mut initializing = false;
    for (n, c) in arr(p, "/status/initContainerStatuses").iter().enumerate() {
        restarts += i(c, "/restartCount");
        let is_sidecar = sidecar(s(c, "/name"));
        let started = c["started"] == json!(true);
        if is_sidecar && started {
            sidecar_restarts += i(c, "/restartCount");
        }
        let terminated = c.pointer("/state/terminated").is_some();
        let waiting = s(c, "/state/waiting/reason");
        if terminated && i(c, "/state/terminated/exitCode") == 0 {
            continue;
        }
        if is_sidecar && started {
            if c["ready"] == json!(true) {
                ready += 1;
            }
            continue;
        }
        reason = if terminated {
            exit_reason(c, "Init:")
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            format!("Init:{waiting}")
        } else {
            format!("Init:{n}/{}", init_specs.len())
        };
        initializing = true;
        break;
    }
    let initialized = arr(p, "/status/conditions")
        .iter()
        .any(|c| s(c, "/type") == "Initialized" && s(c, "/status") == "True");
    if !initializing || initialized {
        restarts = sidecar_restarts;
        let mut running = false;
        for c in arr(p, "/status/containerStatuses").iter().rev() {
            restarts += i(c, "/restartCount");
            let waiting = s(c, "/state/waiting/reason");
            if !waiting.is_empty() {
                reason = waiting.to_string();
            } else if c.pointer("/state/terminated").is_some() {
                reason = exit_reason(c, "");
            } else if c["ready"] == json!(true) && c.pointer("/state/running").is_some() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            let pod_ready = arr(p, "/status/conditions")
                .iter()
                .any(|c| s(c, "/type") == "Ready" && s(c, "/status") == "True");
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    total = total.max(ready);
    if p.pointer("/metadata/deletionTimestamp").is_some() {
        reason = if s(p, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    let ip = or_none(s(p, "/status/podIP").to_string());
    let node = or_none(s(p, "/spec/nodeName").to_string());
    let nominated = or_none(s(p, "/status/nominatedNodeName").to_string());
    vec![
        json!(format!("{ready}/{total}")),
        json!(reason),
        json!(restarts),
        Value::Null,
        json!(ip),
        json!(node),
        json!(nominated),
        json!("<none>"),
    ]
}

pub(super) fn service_row(o: &Value) -> Vec<Value> {
    let ty = s(o, "/spec/type");
    let ips = arr(o, "/status/loadBalancer/ingress");
    let mut external: Vec<String> = arr(o, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    external.extend(ips.iter().map(|i| {
        let ip = s(i, "/ip");
        if ip.is_empty() {
            s(i, "/hostname").to_string()
        } else {
            ip.to_string()
        }
    }));
    let external = match ty {
        "ExternalName" => s(o, "/spec/externalName").to_string(),
        "LoadBalancer" if external.is_empty() => "<pending>".into(),
        _ => or_none(external.join(",")),
    };
    let ports: Vec<String> = arr(o, "/spec/ports")
        .iter()
        .map(|p| {
            let port = i(p, "/port");
            let proto = s(p, "/protocol");
            match p.get("nodePort").and_then(Value::as_i64) {
                Some(np) => format!("{port}:{np}/{proto}"),
                None => format!("{port}/{proto}"),
            }
        })
        .collect();
    let cluster_ip = or_none(s(o, "/spec/clusterIP").to_string());
    vec![
        json!(ty),
        json!(cluster_ip),
        json!(external),
        json!(or_none(ports.join(","))),
        Value::Null,
        json!(selector_string(o.pointer("/spec/selector"))),
    ]
}

pub(super) fn node_row(o: &Value) -> Vec<Value> {
    let ready = arr(o, "/status/conditions")
        .iter()
        .find(|c| s(c, "/type") == "Ready");
    let mut status = match ready.map(|c| s(c, "/status")) {
        Some("True") => "Ready".to_string(),
        _ => "NotReady".to_string(),
    };
    if o.pointer("/spec/unschedulable") == Some(&json!(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let roles: Vec<&str> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, _)| k.strip_prefix("node-role.kubernetes.io/"))
        .collect();
    let addr = |t: &str| {
        or_none(
            arr(o, "/status/addresses")
                .iter()
                .find(|a| s(a, "/type") == t)
                .map(|a| s(a, "/address").to_string())
                .unwrap_or_default(),
        )
    };
    vec![
        json!(status),
        json!(or_none(roles.join(","))),
        Value::Null,
        json!(s(o, "/status/nodeInfo/kubeletVersion")),
        json!(addr("InternalIP")),
        json!(addr("ExternalIP")),
        json!(or_none(s(o, "/status/nodeInfo/osImage").into())),
        json!(or_none(s(o, "/status/nodeInfo/kernelVersion").into())),
        json!(or_none(
            s(o, "/status/nodeInfo/containerRuntimeVersion").into()
        )),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_status_column_follows_kubectl_s_printer() {
        let status = |v: Value| pod_row(&v)[1].as_str().unwrap().to_string();
        let two_inits = json!({"spec": {"initContainers": [{"name": "a"}, {"name": "b"}],
                                        "containers": [{"name": "c"}]}});
        let mut p = two_inits.clone();
        p["status"] = json!({"phase": "Pending",
            "initContainerStatuses": [
                {"name": "a", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                {"name": "b", "state": {"running": {}}}],
            "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]});
        assert_eq!(status(p), "Init:1/2");
        let mut p = two_inits.clone();
        p["status"] = json!({"phase": "Failed",
            "initContainerStatuses": [{"name": "a", "state": {"terminated": {"exitCode": 4, "reason": "Error"}}}],
            "containerStatuses": [{"name": "c", "state": {"waiting": {"reason": "PodInitializing"}}}]});
        assert_eq!(status(p), "Init:Error");
        let mut p = two_inits;
        p["status"] = json!({"phase": "Pending",
            "initContainerStatuses": [{"name": "a", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]});
        assert_eq!(status(p), "Init:CrashLoopBackOff");
        let p = json!({"spec": {"containers": [{"name": "c"}, {"name": "d"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
              "containerStatuses": [
                {"name": "c", "ready": true, "restartCount": 2, "state": {"running": {}}},
                {"name": "d", "restartCount": 1, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        let row = pod_row(&p);
        assert_eq!(
            (row[0].clone(), row[1].clone(), row[2].clone()),
            (json!("1/2"), json!("NotReady"), json!(3))
        );
    }
}
