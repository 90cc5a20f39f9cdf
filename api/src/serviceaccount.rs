//! The ServiceAccount admission plugin (kube-apiserver's `ServiceAccount`): a new pod runs as a
//! ServiceAccount of its namespace (`default` when it names none), which must exist, and unless
//! the pod or its ServiceAccount sets `automountServiceAccountToken: false`, it gets the
//! projected volume `kube-api-access-<5 random characters>` (a bound token for that account,
//! the cluster CA from the `kube-root-ca.crt` ConfigMap and the pod's namespace) mounted
//! read-only at [`TOKEN_MOUNT_PATH`] in every container and init container that does not mount
//! something there already. The node's agent fills the volume in and rotates the token.

use rand::Rng;
use serde_json::{json, Map, Value};

use crate::admission::{child, default};
use crate::error::ApiError;
use crate::handler::{meta_str, Api, Target};
use crate::query::Query;
use crate::resources;
use crate::storage::{Fence, Freshness};

/// Where containers find the token, `ca.crt` and `namespace` (in-cluster clients look there).
pub const TOKEN_MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The prefix of the volume's name.
pub const VOLUME_PREFIX: &str = "kube-api-access-";
/// The ConfigMap holding the cluster CA in every namespace (root-ca-cert-publisher's).
pub const ROOT_CA_CONFIGMAP: &str = "kube-root-ca.crt";
/// The token's requested lifetime: kube-apiserver's 3607 s, one hour and seven seconds, which
/// tells a projected token made by this admission from one a user asked for.
pub const TOKEN_EXPIRATION_SECONDS: i64 = 3607;
/// The annotation of a static pod's mirror, which gets no token.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// The characters of a generated name's suffix (apimachinery's SimpleNameGenerator).
const NAME_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Five random characters, as a generated name ends.
pub fn random_suffix() -> String {
    let mut rng = rand::thread_rng();
    (0..5)
        .map(|_| NAME_CHARS[rng.gen_range(0..NAME_CHARS.len())] as char)
        .collect()
}

/// The projected volume of the service account token, as kube-apiserver 1.32 writes it.
pub fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": "token"}},
                {"configMap": {"name": ROOT_CA_CONFIGMAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    })
}

/// Whether the token is mounted: the pod's `automountServiceAccountToken` decides when set,
/// else its ServiceAccount's; true when neither says.
pub fn should_automount(pod: &Value, service_account: &Value) -> bool {
    pod.pointer("/spec/automountServiceAccountToken")
        .and_then(Value::as_bool)
        .or_else(|| {
            service_account
                .get("automountServiceAccountToken")
                .and_then(Value::as_bool)
        })
        .unwrap_or(true)
}

/// Adds the token volume (named `kube-api-access-<suffix>`, or the one the pod has already) and
/// its mount to every container and init container that mounts nothing at
/// [`TOKEN_MOUNT_PATH`]; the volume only when some container mounts it.
pub fn mount_token(pod: &mut Value, suffix: &str) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let existing = spec
        .get("volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .find(|n| n.starts_with(VOLUME_PREFIX))
        .map(str::to_string);
    let name = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{suffix}"));
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            if mounts_at(c, TOKEN_MOUNT_PATH) {
                continue;
            }
            if !c.get("volumeMounts").is_some_and(Value::is_array) {
                c.insert("volumeMounts".into(), json!([]));
            }
            if let Some(mounts) = c.get_mut("volumeMounts").and_then(Value::as_array_mut) {
                mounts.push(json!({"name": name, "readOnly": true, "mountPath": TOKEN_MOUNT_PATH}));
                needed = true;
            }
        }
    }
    if needed && existing.is_none() {
        if !spec.get("volumes").is_some_and(Value::is_array) {
            spec.insert("volumes".into(), json!([]));
        }
        if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
            volumes.push(token_volume(&name));
        }
    }
}

fn mounts_at(container: &Map<String, Value>, path: &str) -> bool {
    container
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|m| m.get("mountPath").and_then(Value::as_str) == Some(path))
}

/// The admission of a new pod: its ServiceAccount defaulted and looked up, and the token
/// volume mounted unless automounting is off. A pod naming a ServiceAccount that does not
/// exist is forbidden, in kube-apiserver's words.
pub(crate) async fn admit_pod(api: &Api, t: &Target, pod: &mut Value) -> Result<(), ApiError> {
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        default(spec, "serviceAccountName", json!("default"));
        if spec
            .get("serviceAccountName")
            .and_then(Value::as_str)
            .is_some_and(str::is_empty)
        {
            spec.insert("serviceAccountName".into(), json!("default"));
        }
    }
    let mirror = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(MIRROR_ANNOTATION))
        .is_some();
    if mirror {
        return Ok(());
    }
    let ns = t.namespace().unwrap_or("").to_string();
    let sa_name = pod
        .pointer("/spec/serviceAccountName")
        .and_then(Value::as_str)
        .unwrap_or("default")
        .to_string();
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("serviceAccount".into(), json!(sa_name));
    }
    let service_account = lookup(api, &ns, &sa_name).await?.ok_or_else(|| {
        ApiError::forbidden(format!(
            "pods \"{}\" is forbidden: error looking up service account {ns}/{sa_name}: serviceaccount \"{sa_name}\" not found",
            meta_str(pod, "name").unwrap_or("")
        ))
    })?;
    if should_automount(pod, &service_account) {
        mount_token(pod, &random_suffix());
    }
    Ok(())
}

/// The ServiceAccount, from this member's state or else a quorum read (one created a moment
/// ago through another member). The `default` one, which the leader keeps in every namespace,
/// is created here when a pod comes before it: its namespace was made a moment ago.
async fn lookup(api: &Api, ns: &str, name: &str) -> Result<Option<Value>, ApiError> {
    let res = resources::find("", "v1", "serviceaccounts")
        .ok_or_else(|| ApiError::internal("serviceaccounts are served"))?;
    let key = res.key(Some(ns), name);
    if let Some(s) = api.store.get(&key, Freshness::Any).await? {
        return Ok(Some(s.object));
    }
    if let Some(s) = api.store.get(&key, Freshness::Latest).await? {
        return Ok(Some(s.object));
    }
    if name != "default" || !namespace_is_active(api, ns).await? {
        return Ok(None);
    }
    let created = api
        .create_object(
            &Target::new(res, Some(ns.to_string()), None),
            &Query::default(),
            json!({"metadata": {"name": "default", "namespace": ns}}),
            Fence::Any,
        )
        .await;
    match created {
        Ok(_) => {}
        Err(e) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    Ok(api
        .store
        .get(&key, Freshness::Latest)
        .await?
        .map(|s| s.object))
}

async fn namespace_is_active(api: &Api, ns: &str) -> Result<bool, ApiError> {
    let res = resources::find("", "v1", "namespaces")
        .ok_or_else(|| ApiError::internal("namespaces are served"))?;
    Ok(api
        .store
        .get(&res.key(None, ns), Freshness::Latest)
        .await?
        .is_some_and(|n| n.object.pointer("/metadata/deletionTimestamp").is_none()))
}

/// Defaults of a projected volume (its mode, its downward API items' field API version), as
/// Kubernetes' SetDefaults_ProjectedVolumeSource and SetDefaults_ObjectFieldSelector.
pub(crate) fn default_projected(volume: &mut Map<String, Value>) {
    let Some(projected) = volume.get_mut("projected").and_then(Value::as_object_mut) else {
        return;
    };
    default(projected, "defaultMode", json!(420));
    for source in projected
        .get_mut("sources")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        if let Some(token) = source
            .get_mut("serviceAccountToken")
            .and_then(Value::as_object_mut)
        {
            default(token, "expirationSeconds", json!(3600));
        }
        if let Some(items) = source
            .get_mut("downwardAPI")
            .and_then(|d| d.get_mut("items"))
            .and_then(Value::as_array_mut)
        {
            for item in items.iter_mut().filter_map(Value::as_object_mut) {
                if item.get("fieldRef").is_some_and(Value::is_object) {
                    default(child(item, "fieldRef"), "apiVersion", json!("v1"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "dev"}, "spec": spec})
    }

    fn mounts(pod: &Value, list: &str) -> Vec<Vec<Value>> {
        pod["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["volumeMounts"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    #[test]
    fn the_token_volume_is_kube_apiserver_s() {
        let v = token_volume("kube-api-access-abcde");
        assert_eq!(v["projected"]["defaultMode"], 420);
        let sources = v["projected"]["sources"].as_array().unwrap();
        assert_eq!(
            sources[0],
            json!({"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}})
        );
        assert_eq!(sources[1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(
            sources[1]["configMap"]["items"],
            json!([{"key": "ca.crt", "path": "ca.crt"}])
        );
        assert_eq!(
            sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"],
            "metadata.namespace"
        );
    }

    #[test]
    fn generated_suffixes_are_five_name_characters() {
        for _ in 0..50 {
            let s = random_suffix();
            assert_eq!(s.len(), 5);
            assert!(s.bytes().all(|b| NAME_CHARS.contains(&b)), "{s}");
        }
    }

    #[test]
    fn automount_follows_the_pod_then_its_service_account() {
        // (pod's setting, service account's setting, mounted)
        let cases = [
            (None, None, true),
            (None, Some(false), false),
            (None, Some(true), true),
            (Some(false), None, false),
            (Some(false), Some(true), false),
            (Some(true), Some(false), true),
        ];
        for (on_pod, on_sa, want) in cases {
            let mut p = pod(json!({"containers": [{"name": "c", "image": "i"}]}));
            if let Some(b) = on_pod {
                p["spec"]["automountServiceAccountToken"] = json!(b);
            }
            let mut sa = json!({"metadata": {"name": "default"}});
            if let Some(b) = on_sa {
                sa["automountServiceAccountToken"] = json!(b);
            }
            assert_eq!(should_automount(&p, &sa), want, "{on_pod:?} {on_sa:?}");
        }
    }

    #[test]
    fn every_container_mounts_the_token_unless_it_mounts_that_path_already() {
        let own = json!({"name": "mine", "mountPath": TOKEN_MOUNT_PATH});
        let token_mount = json!({"name": "kube-api-access-xyz12", "readOnly": true,
                                 "mountPath": TOKEN_MOUNT_PATH});
        // (spec, expected container mounts, expected init container mounts, volumes added)
        let cases = [
            (
                json!({"containers": [{"name": "a"}, {"name": "b", "volumeMounts": [{"name": "d", "mountPath": "/d"}]}]}),
                vec![
                    vec![token_mount.clone()],
                    vec![json!({"name": "d", "mountPath": "/d"}), token_mount.clone()],
                ],
                vec![],
                1,
            ),
            (
                json!({"initContainers": [{"name": "i"}], "containers": [{"name": "a"}]}),
                vec![vec![token_mount.clone()]],
                vec![vec![token_mount.clone()]],
                1,
            ),
            (
                json!({"containers": [{"name": "a", "volumeMounts": [own.clone()]}]}),
                vec![vec![own.clone()]],
                vec![],
                0,
            ),
        ];
        for (spec, want, want_init, added) in cases {
            let mut p = pod(spec.clone());
            let before = p["spec"]["volumes"].as_array().map_or(0, Vec::len);
            mount_token(&mut p, "xyz12");
            assert_eq!(mounts(&p, "containers"), want, "{spec}");
            assert_eq!(mounts(&p, "initContainers"), want_init, "{spec}");
            let volumes = p["spec"]["volumes"].as_array().map_or(0, Vec::len);
            assert_eq!(volumes - before, added, "{spec}");
            if added == 1 {
                assert_eq!(
                    p["spec"]["volumes"][before],
                    token_volume("kube-api-access-xyz12")
                );
            }
        }
    }

    #[test]
    fn a_pod_with_a_token_volume_keeps_it() {
        let mut p = pod(json!({"volumes": [token_volume("kube-api-access-old12")],
                               "containers": [{"name": "a"}]}));
        mount_token(&mut p, "new34");
        assert_eq!(p["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            p["spec"]["containers"][0]["volumeMounts"][0]["name"],
            "kube-api-access-old12"
        );
    }

    #[test]
    fn projected_volumes_get_their_defaults() {
        let mut v = json!({"name": "p", "projected": {"sources": [
            {"serviceAccountToken": {"path": "t"}},
            {"downwardAPI": {"items": [{"path": "n", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}});
        default_projected(v.as_object_mut().unwrap());
        assert_eq!(v["projected"]["defaultMode"], 420);
        assert_eq!(
            v["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3600
        );
        assert_eq!(
            v["projected"]["sources"][1]["downwardAPI"]["items"][0]["fieldRef"]["apiVersion"],
            "v1"
        );
    }
}
