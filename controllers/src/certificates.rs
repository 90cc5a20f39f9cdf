//! What kube-controller-manager does for joining nodes, and kubeadm's bootstrap signer:
//!
//! - the CSR approver: a `kubernetes.io/kube-apiserver-client-kubelet` request for a node's
//!   client certificate is approved when a SubjectAccessReview says its requester may create
//!   `certificatesigningrequests/nodeclient` (a bootstrap token joining a node) or
//!   `certificatesigningrequests/selfnodeclient` (a node renewing its own certificate);
//! - the CSR signer: approved requests for the kube-apiserver client signers get a certificate
//!   from the cluster CA;
//! - the CSR cleaner: finished requests go after an hour, pending ones after a day;
//! - the bootstrap signer: `kube-public/cluster-info` holds a kubeconfig with the cluster CA,
//!   signed (a detached JWS) by every bootstrap token that may sign;
//! - the token cleaner: expired bootstrap tokens are deleted.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rkube_api::certificates::request_pem;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::bootstrap_token;
use rkube_core::json::str_at as s;
use rkube_pki::CsrSigner;
use rkube_pki::{CLIENT_SIGNER, KUBELET_CLIENT_SIGNER};
use serde_json::{json, Value};

use crate::ignore_gone;
use rkube_runtime::informer::{key_of, Informer};
use rkube_runtime::queue::{Outcome, WorkQueue};

/// kube-controller-manager's --cluster-signing-duration default: one year.
pub const DEFAULT_SIGNING_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);
const ISSUED_TTL: i64 = 3600;
const PENDING_TTL: i64 = 24 * 3600;
/// How soon a pending request whose requester was not allowed is looked at again.
const RECHECK: Duration = Duration::from_secs(5);
const CLUSTER_INFO: &str = "cluster-info";
const JWS_PREFIX: &str = "jws-kubeconfig-";

/// What signing needs: the CA (certificate and key) and how long certificates last; and what
/// `cluster-info` tells joining nodes: the CA certificate and a server address.
#[derive(Clone)]
pub struct Settings {
    pub signer: Arc<CsrSigner>,
    pub ca_pem: String,
    pub server_url: String,
    pub signing_duration: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("server_url", &self.server_url)
            .field("signing_duration", &self.signing_duration)
            .finish()
    }
}

fn has_condition(csr: &Value, kind: &str) -> bool {
    csr.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| s(c, "/type") == kind))
}

fn age_seconds(o: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(s(o, "/metadata/creationTimestamp"))
        .map(|t| (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds())
        .unwrap_or(0)
}

pub struct CsrController {
    csrs: Arc<Informer>,
    client: LocalClient,
    settings: Settings,
    queue: Arc<WorkQueue>,
}

impl CsrController {
    pub fn new(csrs: Arc<Informer>, client: LocalClient, settings: Settings) -> Arc<CsrController> {
        let c = Arc::new(CsrController {
            csrs: csrs.clone(),
            client,
            settings,
            queue: Arc::new(WorkQueue::new()),
        });
        let queue = c.queue.clone();
        csrs.on_change(Box::new(move |_, new| {
            if let Some(o) = new {
                queue.add(&key_of(o));
            }
        }));
        c
    }

    pub fn run(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        rkube_runtime::queue::run_workers(
            "csr-controller",
            self.queue.clone(),
            2,
            vec![self.csrs.clone()],
            stop,
            move |key| {
                let c = c.clone();
                async move { c.sync(&key).await }
            },
        );
    }

    async fn sync(&self, key: &str) -> Outcome {
        let Some(csr) = self.csrs.get(key) else {
            return Ok(None);
        };
        let path = format!("/apis/certificates.k8s.io/v1/certificatesigningrequests/{key}");
        let issued = !s(&csr, "/status/certificate").is_empty();
        let approved = has_condition(&csr, "Approved");
        let finished = issued || has_condition(&csr, "Denied") || has_condition(&csr, "Failed");
        // The cleaner.
        let ttl = if finished { ISSUED_TTL } else { PENDING_TTL };
        let age = age_seconds(&csr);
        if age >= ttl {
            ignore_gone(self.client.delete(&path, None).await)?;
            return Ok(None);
        }
        let until_cleaned = Duration::from_secs((ttl - age).max(1) as u64);
        let again = Some(until_cleaned);
        if finished {
            return Ok(again);
        }
        let signer = s(&csr, "/spec/signerName");
        if !approved {
            if signer == KUBELET_CLIENT_SIGNER && self.approve_node_client(&csr, &path).await? {
                // Not allowed (yet): the requester's permission may come with a binding made
                // later (the default policy right after a leader starts, an admin's grant).
                return Ok(Some(RECHECK.min(until_cleaned)));
            }
            return Ok(again);
        }
        if signer == KUBELET_CLIENT_SIGNER || signer == CLIENT_SIGNER {
            self.sign(&csr, &path).await?;
        }
        Ok(again)
    }

    /// The approver: a node client certificate is approved when its requester may ask for one
    /// (`nodeclient`), or is the very node renewing its own (`selfnodeclient`). True when it
    /// was not because the requester is not allowed (yet): worth looking at again.
    async fn approve_node_client(&self, csr: &Value, path: &str) -> Result<bool, ApiError> {
        let Some(pem) = request_pem(csr) else {
            return Ok(false);
        };
        let Ok(subject) = rkube_pki::parse_csr(&pem) else {
            return Ok(false);
        };
        let username = s(csr, "/spec/username");
        let groups = csr.pointer("/spec/groups").cloned().unwrap_or(json!([]));
        let in_nodes = groups
            .as_array()
            .is_some_and(|g| g.iter().any(|x| x == "system:nodes"));
        let subresource = if username == subject.common_name && in_nodes {
            "selfnodeclient"
        } else {
            "nodeclient"
        };
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": username, "groups": groups,
                     "uid": s(csr, "/spec/uid"),
                     "extra": csr.pointer("/spec/extra").cloned().unwrap_or(json!({})),
                     "resourceAttributes": {"group": "certificates.k8s.io",
                        "resource": "certificatesigningrequests",
                        "subresource": subresource, "verb": "create"}}});
        let answer = self
            .client
            .create(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &review,
            )
            .await?;
        if answer.pointer("/status/allowed") != Some(&json!(true)) {
            tracing::debug!(
                csr = s(csr, "/metadata/name"),
                username,
                subresource,
                "not auto-approved"
            );
            return Ok(true);
        }
        let now = rkube_api::handler::now();
        let mut approved = csr.clone();
        let mut conditions = approved
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        conditions.push(json!({
            "type": "Approved", "status": "True", "reason": "AutoApproved",
            "message": "Auto approving kubelet client certificate after SubjectAccessReview.",
            "lastUpdateTime": now, "lastTransitionTime": now}));
        rkube_api::value::set(&mut approved, &["status", "conditions"], json!(conditions));
        ignore_gone(
            self.client
                .update(&format!("{path}/approval"), &approved)
                .await,
        )?;
        tracing::info!(
            csr = s(csr, "/metadata/name"),
            username,
            "approved a node client certificate"
        );
        Ok(false)
    }

    /// The signer: a certificate from the cluster CA for as long as the request asks, at most
    /// the signing duration.
    async fn sign(&self, csr: &Value, path: &str) -> Result<(), ApiError> {
        let Some(pem) = request_pem(csr) else {
            return Ok(());
        };
        let mut valid_for = self.settings.signing_duration;
        if let Some(secs) = csr
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_u64)
        {
            valid_for = valid_for.min(Duration::from_secs(secs));
        }
        let mut signed = csr.clone();
        match self.settings.signer.sign(&pem, valid_for, true, false) {
            Ok(cert) => {
                rkube_api::value::set(
                    &mut signed,
                    &["status", "certificate"],
                    json!(STANDARD.encode(cert)),
                );
            }
            Err(e) => {
                let now = rkube_api::handler::now();
                let mut conditions = signed
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                conditions.push(json!({"type": "Failed", "status": "True",
                    "reason": "SignerValidationFailure", "message": e.to_string(),
                    "lastUpdateTime": now, "lastTransitionTime": now}));
                rkube_api::value::set(&mut signed, &["status", "conditions"], json!(conditions));
            }
        }
        ignore_gone(self.client.update(&format!("{path}/status"), &signed).await)?;
        Ok(())
    }
}

/// The bootstrap signer and the token cleaner, both driven by the Secrets of kube-system and
/// the `cluster-info` ConfigMap.
pub struct BootstrapController {
    secrets: Arc<Informer>,
    configmaps: Arc<Informer>,
    client: LocalClient,
    settings: Settings,
    queue: Arc<WorkQueue>,
}

const SIGNER_KEY: &str = "kube-public/cluster-info";

impl BootstrapController {
    pub fn new(
        secrets: Arc<Informer>,
        configmaps: Arc<Informer>,
        client: LocalClient,
        settings: Settings,
    ) -> Arc<BootstrapController> {
        let c = Arc::new(BootstrapController {
            secrets: secrets.clone(),
            configmaps: configmaps.clone(),
            client,
            settings,
            queue: Arc::new(WorkQueue::new()),
        });
        let queue = c.queue.clone();
        secrets.on_change(Box::new(move |old, new| {
            for o in [old, new].into_iter().flatten() {
                if s(o, "/type") == bootstrap_token::SECRET_TYPE {
                    queue.add(SIGNER_KEY);
                    queue.add(&key_of(o));
                }
            }
        }));
        let queue = c.queue.clone();
        configmaps.on_change(Box::new(move |old, new| {
            if [old, new]
                .into_iter()
                .flatten()
                .any(|o| key_of(o) == SIGNER_KEY)
            {
                queue.add(SIGNER_KEY);
            }
        }));
        c.queue.add(SIGNER_KEY);
        c
    }

    pub fn run(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let c = self.clone();
        rkube_runtime::queue::run_workers(
            "bootstrap-signer",
            self.queue.clone(),
            1,
            vec![self.secrets.clone(), self.configmaps.clone()],
            stop,
            move |key| {
                let c = c.clone();
                async move {
                    if key == SIGNER_KEY {
                        c.sign_cluster_info().await
                    } else {
                        c.clean_token(&key).await
                    }
                }
            },
        );
    }

    fn kubeconfig(&self) -> String {
        // Only the cluster: a joining node learns the CA and an address, nothing secret.
        let doc = json!({
            "apiVersion": "v1", "kind": "Config", "preferences": {},
            "clusters": [{"name": "", "cluster": {
                "certificate-authority-data": STANDARD.encode(&self.settings.ca_pem),
                "server": self.settings.server_url}}],
            "contexts": null, "current-context": "", "users": null});
        serde_yaml::to_string(&doc).unwrap_or_default()
    }

    /// Keeps `cluster-info` holding the kubeconfig and one signature per signing token.
    async fn sign_cluster_info(&self) -> Outcome {
        let now = chrono::Utc::now();
        let kubeconfig = match self.configmaps.get(SIGNER_KEY) {
            // Kubernetes keeps the kubeconfig an operator put there; rkube writes its own only
            // when there is none.
            Some(cm) if !s(&cm, "/data/kubeconfig").is_empty() => {
                s(&cm, "/data/kubeconfig").to_string()
            }
            _ => self.kubeconfig(),
        };
        let mut data = serde_json::Map::new();
        data.insert("kubeconfig".into(), json!(kubeconfig));
        for secret in self.secrets.list("kube-system/") {
            if s(&secret, "/type") != bootstrap_token::SECRET_TYPE
                || bootstrap_token::expired(&secret, now)
                || secret.pointer("/metadata/deletionTimestamp").is_some()
                || bootstrap_token::secret_value(&secret, "usage-bootstrap-signing").as_deref()
                    != Some("true")
            {
                continue;
            }
            let (Some(id), Some(token_secret)) = (
                bootstrap_token::secret_value(&secret, "token-id"),
                bootstrap_token::secret_value(&secret, "token-secret"),
            ) else {
                continue;
            };
            data.insert(
                format!("{JWS_PREFIX}{id}"),
                json!(bootstrap_token::detached_jws(
                    &kubeconfig,
                    &id,
                    &token_secret
                )),
            );
        }
        let path = "/api/v1/namespaces/kube-public/configmaps/cluster-info";
        match self.configmaps.get(SIGNER_KEY) {
            Some(cm) if cm.get("data") == Some(&Value::Object(data.clone())) => {}
            Some(cm) => {
                let mut cm = (*cm).clone();
                cm["data"] = Value::Object(data);
                ignore_gone(self.client.update(path, &cm).await)?;
            }
            None => {
                let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": CLUSTER_INFO, "namespace": "kube-public"},
                    "data": data});
                match self
                    .client
                    .create("/api/v1/namespaces/kube-public/configmaps", &cm)
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code == 409 || e.code == 404 => {
                        // Created meanwhile, or kube-public not there yet: look again soon.
                        return Ok(Some(Duration::from_secs(1)));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(None)
    }

    /// The token cleaner: an expired bootstrap token is deleted when it expires.
    async fn clean_token(&self, key: &str) -> Outcome {
        let Some(secret) = self.secrets.get(key) else {
            return Ok(None);
        };
        let Some(exp) = bootstrap_token::secret_value(&secret, "expiration") else {
            return Ok(None);
        };
        let now = chrono::Utc::now();
        if bootstrap_token::expired(&secret, now) {
            let (ns, name) = key.split_once('/').unwrap_or(("", key));
            ignore_gone(
                self.client
                    .delete(&format!("/api/v1/namespaces/{ns}/secrets/{name}"), None)
                    .await,
            )?;
            tracing::info!(token = name, "deleted an expired bootstrap token");
            return Ok(None);
        }
        let left = chrono::DateTime::parse_from_rfc3339(exp.trim())
            .map(|t| (t.with_timezone(&chrono::Utc) - now).num_seconds())
            .unwrap_or(1);
        Ok(Some(Duration::from_secs(left.max(1) as u64)))
    }
}
