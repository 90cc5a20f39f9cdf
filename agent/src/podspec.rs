//! What a container gets besides its image: volumes (emptyDir, hostPath, configMap, secret)
//! made on the node and mounted, and environment variables — literal values, keys of
//! ConfigMaps and Secrets (`valueFrom`, `envFrom`) and the downward API's pod fields. The node
//! reads only the ConfigMaps and Secrets its own pods use (the Node authorizer allows exactly
//! those).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use rkube_core::json::str_at as s;
use serde_json::Value;

use crate::cri::pb;

fn arr<'a>(v: &'a Value, p: &str) -> Vec<&'a Value> {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// A ConfigMap's or Secret's keys, decoded.
async fn object_data(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    name: &str,
) -> Result<HashMap<String, Vec<u8>>> {
    match kind {
        "configMap" => {
            let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(|e| {
                    anyhow!(
                        "configmap \"{name}\" not found: {}",
                        crate::join::describe(&e)
                    )
                })?;
            let mut out: HashMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                out.insert(k, v.0);
            }
            Ok(out)
        }
        _ => {
            let secret = Api::<Secret>::namespaced(client.clone(), ns)
                .get(name)
                .await
                .map_err(|e| {
                    anyhow!("secret \"{name}\" not found: {}", crate::join::describe(&e))
                })?;
            let mut out: HashMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            for (k, v) in secret.string_data.unwrap_or_default() {
                out.insert(k, v.into_bytes());
            }
            Ok(out)
        }
    }
}

/// Makes the pod's volumes under `root` (`<root>/<uid>/volumes/<name>`); volume name -> host
/// path.
pub async fn volumes(
    client: &kube::Client,
    pod: &Value,
    root: &Path,
) -> Result<HashMap<String, PathBuf>> {
    let ns = s(pod, "/metadata/namespace");
    let base = root.join(s(pod, "/metadata/uid")).join("volumes");
    let mut out = HashMap::new();
    for v in arr(pod, "/spec/volumes") {
        let name = s(v, "/name").to_string();
        let dir = base.join(&name);
        let path = if v.get("emptyDir").is_some() {
            std::fs::create_dir_all(&dir)?;
            dir
        } else if let Some(hp) = v.get("hostPath") {
            let p = PathBuf::from(s(hp, "/path"));
            match s(hp, "/type") {
                "DirectoryOrCreate" => std::fs::create_dir_all(&p)?,
                "Directory" if !p.is_dir() => bail!("hostPath {} is not a directory", p.display()),
                _ => {}
            }
            p
        } else if let Some((kind, src)) = v
            .get("configMap")
            .map(|c| ("configMap", c))
            .or_else(|| v.get("secret").map(|c| ("secret", c)))
        {
            let obj = if kind == "configMap" {
                s(src, "/name")
            } else {
                s(src, "/secretName")
            };
            let optional = src
                .get("optional")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let data = match object_data(client, ns, kind, obj).await {
                Ok(d) => d,
                Err(_) if optional => HashMap::new(),
                Err(e) => return Err(e),
            };
            // Written aside and swapped in whole, as the kubelet's atomic writer does.
            let tmp = base.join(format!(".{name}.tmp"));
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp)?;
            let items = arr(src, "/items");
            let files: Vec<(String, String)> = if items.is_empty() {
                data.keys().map(|k| (k.clone(), k.clone())).collect()
            } else {
                items
                    .iter()
                    .map(|i| (s(i, "/key").to_string(), s(i, "/path").to_string()))
                    .collect()
            };
            for (key, rel) in files {
                let Some(bytes) = data.get(&key) else {
                    bail!("{kind} \"{obj}\" has no key {key:?}");
                };
                if rel.contains("..") || rel.starts_with('/') {
                    bail!("volume {name}: path {rel:?} must be relative and may not contain '..'");
                }
                let file = tmp.join(&rel);
                if let Some(parent) = file.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&file, bytes)?;
            }
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::rename(&tmp, &dir)?;
            dir
        } else {
            let kind = v
                .as_object()
                .and_then(|o| o.keys().find(|k| k.as_str() != "name").cloned())
                .unwrap_or_default();
            bail!("volume {name}: {kind} volumes are not supported by this agent yet");
        };
        out.insert(name, path);
    }
    Ok(out)
}

/// The container's mounts of the pod's volumes.
pub fn mounts(container: &Value, volumes: &HashMap<String, PathBuf>) -> Result<Vec<pb::Mount>> {
    arr(container, "/volumeMounts")
        .into_iter()
        .map(|m| {
            let name = s(m, "/name");
            let host = volumes
                .get(name)
                .ok_or_else(|| anyhow!("volumeMount {name:?} names no volume of the pod"))?;
            let sub = s(m, "/subPath");
            let host = if sub.is_empty() {
                host.clone()
            } else {
                host.join(sub)
            };
            Ok(pb::Mount {
                container_path: s(m, "/mountPath").to_string(),
                host_path: host.display().to_string(),
                readonly: m.get("readOnly").and_then(Value::as_bool).unwrap_or(false),
            })
        })
        .collect()
}

/// A downward API field of the pod.
fn field(pod: &Value, path: &str, pod_ip: &str) -> Result<String> {
    Ok(match path {
        "metadata.name" => s(pod, "/metadata/name").into(),
        "metadata.namespace" => s(pod, "/metadata/namespace").into(),
        "metadata.uid" => s(pod, "/metadata/uid").into(),
        "spec.nodeName" => s(pod, "/spec/nodeName").into(),
        "spec.serviceAccountName" => s(pod, "/spec/serviceAccountName").into(),
        "status.podIP" => pod_ip.into(),
        "status.hostIP" => s(pod, "/status/hostIP").into(),
        p if p.starts_with("metadata.labels['") => {
            let key = p
                .trim_start_matches("metadata.labels['")
                .trim_end_matches("']");
            pod.pointer("/metadata/labels")
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
                .into()
        }
        other => bail!("fieldRef {other:?} is not supported"),
    })
}

/// The container's environment, in Kubernetes' order: envFrom first, then env (later wins).
pub async fn env(
    client: &kube::Client,
    pod: &Value,
    container: &Value,
    pod_ip: &str,
) -> Result<Vec<pb::KeyValue>> {
    let ns = s(pod, "/metadata/namespace");
    let mut out: Vec<(String, String)> = Vec::new();
    let set = |k: String, v: String, out: &mut Vec<(String, String)>| {
        out.retain(|(x, _)| *x != k);
        out.push((k, v));
    };
    for from in arr(container, "/envFrom") {
        let prefix = s(from, "/prefix");
        let (kind, src) = match (from.get("configMapRef"), from.get("secretRef")) {
            (Some(c), _) => ("configMap", c),
            (_, Some(c)) => ("secret", c),
            _ => continue,
        };
        let optional = src
            .get("optional")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let data = match object_data(client, ns, kind, s(src, "/name")).await {
            Ok(d) => d,
            Err(_) if optional => continue,
            Err(e) => return Err(e),
        };
        let mut keys: Vec<_> = data.into_iter().collect();
        keys.sort();
        for (k, v) in keys {
            set(
                format!("{prefix}{k}"),
                String::from_utf8_lossy(&v).into(),
                &mut out,
            );
        }
    }
    for e in arr(container, "/env") {
        let name = s(e, "/name").to_string();
        let value = match e.get("valueFrom") {
            None => s(e, "/value").to_string(),
            Some(from) => {
                if let Some(f) = from.get("fieldRef") {
                    field(pod, s(f, "/fieldPath"), pod_ip)?
                } else if let Some((kind, r)) = from
                    .get("configMapKeyRef")
                    .map(|r| ("configMap", r))
                    .or_else(|| from.get("secretKeyRef").map(|r| ("secret", r)))
                {
                    let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
                    let key = s(r, "/key");
                    match object_data(client, ns, kind, s(r, "/name")).await {
                        Ok(d) => match d.get(key) {
                            Some(v) => String::from_utf8_lossy(v).into(),
                            None if optional => continue,
                            None => {
                                bail!("couldn't find key {key} in {kind} {}/{}", ns, s(r, "/name"))
                            }
                        },
                        Err(_) if optional => continue,
                        Err(e) => return Err(e),
                    }
                } else {
                    bail!("env {name}: this valueFrom is not supported yet");
                }
            }
        };
        set(name, value, &mut out);
    }
    Ok(out
        .into_iter()
        .map(|(key, value)| pb::KeyValue { key, value })
        .collect())
}
