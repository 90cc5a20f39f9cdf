//! The root CA publisher (kube-controller-manager's root-ca-cert-publisher): every namespace
//! holds the ConfigMap `kube-root-ca.crt` whose `ca.crt` is the CA the API serves with, so that
//! a pod's projected token volume can give it to in-cluster clients. A ConfigMap deleted or
//! changed by someone else is made again; a namespace being deleted is left alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_api::serviceaccount::ROOT_CA_CONFIGMAP;
use rkube_core::meta::{name, namespace};
use serde_json::{json, Map, Value};

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::store::Store;

const WORKERS: usize = 1;
const CA_KEY: &str = "ca.crt";
const DESCRIPTION: &str = "kubernetes.io/description";
/// kube-controller-manager's description of the ConfigMap.
const DESCRIPTION_TEXT: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// What a reconcile works with.
pub struct Publisher {
    configmaps: Arc<Store<ConfigMap>>,
    client: LocalClient,
    ca_pem: String,
}

/// Starts the publisher of `ca_pem` until `stop`.
pub fn start(
    namespaces: Arc<Store<Namespace>>,
    configmaps: Arc<Store<ConfigMap>>,
    client: LocalClient,
    ca_pem: String,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let controller = Controller::new("root-ca-cert-publisher", namespaces).watches(
        &configmaps,
        |old: Option<&Arc<ConfigMap>>, new: Option<&Arc<ConfigMap>>| {
            // Deleted or changed: its namespace is looked at.
            new.or(old)
                .filter(|cm| name(&cm.metadata) == ROOT_CA_CONFIGMAP)
                .map(|cm| vec![namespace(&cm.metadata).to_string()])
                .unwrap_or_default()
        },
    );
    let ctx = Arc::new(Publisher {
        configmaps,
        client,
        ca_pem,
    });
    controller.run(WORKERS, stop, ctx, |ns: Arc<Namespace>, ctx| async move {
        ctx.reconcile(&ns).await
    });
}

impl Publisher {
    async fn reconcile(&self, ns: &Namespace) -> Result<Action, ApiError> {
        if ns.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        let ns_name = name(&ns.metadata);
        let objects = Objects::<ConfigMap>::namespaced(&self.client, ns_name);
        match self
            .configmaps
            .get(&format!("{ns_name}/{ROOT_CA_CONFIGMAP}"))
        {
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(ROOT_CA_CONFIGMAP.to_string()),
                        namespace: Some(ns_name.to_string()),
                        annotations: Some(BTreeMap::from([(
                            DESCRIPTION.to_string(),
                            DESCRIPTION_TEXT.to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(CA_KEY.to_string(), self.ca_pem.clone())])),
                    ..ConfigMap::default()
                };
                // 409: made meanwhile (its event brings another look); 404: the namespace went.
                ignore_gone(objects.create(&cm).await)?;
            }
            Some(cm) => {
                if let Some(patch) = repair(&cm, &self.ca_pem) {
                    ignore_gone(objects.merge_patch(ROOT_CA_CONFIGMAP, &patch).await)?;
                }
            }
        }
        Ok(Action::await_change())
    }
}

/// The merge patch that makes `cm` hold exactly the CA (and its description), or None when it
/// does.
fn repair(cm: &ConfigMap, ca_pem: &str) -> Option<Value> {
    let data = cm.data.clone().unwrap_or_default();
    let data_ok = data.len() == 1 && data.get(CA_KEY).map(String::as_str) == Some(ca_pem);
    let binary_ok = cm.binary_data.as_ref().is_none_or(|b| b.is_empty());
    let described = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(DESCRIPTION))
        .is_some_and(|d| d == DESCRIPTION_TEXT);
    if data_ok && binary_ok && described {
        return None;
    }
    let mut new_data: Map<String, Value> = data.keys().map(|k| (k.clone(), Value::Null)).collect();
    new_data.insert(CA_KEY.to_string(), json!(ca_pem));
    let mut patch = json!({"data": new_data});
    if !binary_ok {
        patch["binaryData"] = Value::Null;
    }
    if !described {
        patch["metadata"] = json!({"annotations": {DESCRIPTION: DESCRIPTION_TEXT}});
    }
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(data: &[(&str, &str)], described: bool) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(ROOT_CA_CONFIGMAP.into()),
                annotations: described.then(|| {
                    BTreeMap::from([(DESCRIPTION.to_string(), DESCRIPTION_TEXT.to_string())])
                }),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn a_changed_configmap_is_put_back() {
        let ca = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
        // (configmap, expected patch)
        let cases = [
            (cm(&[("ca.crt", ca)], true), None),
            (
                cm(&[("ca.crt", "other")], true),
                Some(json!({"data": {"ca.crt": ca}})),
            ),
            (
                cm(&[("ca.crt", ca), ("extra", "x")], true),
                Some(json!({"data": {"ca.crt": ca, "extra": null}})),
            ),
            (cm(&[], true), Some(json!({"data": {"ca.crt": ca}}))),
            (
                cm(&[("ca.crt", ca)], false),
                Some(json!({"data": {"ca.crt": ca},
                            "metadata": {"annotations": {DESCRIPTION: DESCRIPTION_TEXT}}})),
            ),
        ];
        for (i, (object, want)) in cases.into_iter().enumerate() {
            assert_eq!(repair(&object, ca), want, "case {i}");
        }
    }
}
