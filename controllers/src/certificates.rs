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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use rkube_api::client::LocalClient;
use rkube_api::error::ApiError;
use rkube_core::bootstrap_token;
use rkube_core::meta::{key, name, namespace};
use rkube_pki::CsrSigner;
use rkube_pki::{CLIENT_SIGNER, KUBELET_CLIENT_SIGNER};
use serde_json::json;

use rkube_runtime::client::{ignore_gone, Objects};
use rkube_runtime::controller::{Action, Controller};
use rkube_runtime::store::Store;

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

fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind))
}

fn age_seconds(meta: &ObjectMeta) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map_or(0, |t| Timestamp::now().as_second() - t.0.as_second())
}

/// The PEM request a CSR carries (`spec.request`).
fn request_pem(csr: &CertificateSigningRequest) -> Option<String> {
    String::from_utf8(csr.spec.request.0.clone()).ok()
}

/// A condition of a CSR, set now.
fn condition(type_: &str, reason: &str, message: String) -> CertificateSigningRequestCondition {
    let now = Time(crate::pods::now());
    CertificateSigningRequestCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

fn with_condition(
    csr: &CertificateSigningRequest,
    c: CertificateSigningRequestCondition,
) -> CertificateSigningRequest {
    let mut csr = csr.clone();
    let status = csr.status.get_or_insert_with(Default::default);
    status.conditions.get_or_insert_with(Vec::new).push(c);
    csr
}

/// What the CSR approver, signer and cleaner work with.
pub struct CsrController {
    client: LocalClient,
    settings: Settings,
}

/// Starts the CSR approver, signer and cleaner until `stop`.
pub fn start_csr(
    csrs: Arc<Store<CertificateSigningRequest>>,
    client: LocalClient,
    settings: Settings,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let ctx = Arc::new(CsrController { client, settings });
    Controller::new("csr-controller", csrs).run(2, stop, ctx, |csr, ctx| async move {
        ctx.reconcile(&csr).await
    });
}

impl CsrController {
    fn objects(&self) -> Objects<'_, CertificateSigningRequest> {
        Objects::namespaced(&self.client, "")
    }

    async fn reconcile(&self, csr: &CertificateSigningRequest) -> Result<Action, ApiError> {
        let issued = csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some_and(|c| !c.0.is_empty());
        let approved = has_condition(csr, "Approved");
        let finished = issued || has_condition(csr, "Denied") || has_condition(csr, "Failed");
        // The cleaner.
        let ttl = if finished { ISSUED_TTL } else { PENDING_TTL };
        let age = age_seconds(&csr.metadata);
        if age >= ttl {
            ignore_gone(self.objects().delete(name(&csr.metadata)).await)?;
            return Ok(Action::await_change());
        }
        let until_cleaned = Duration::from_secs((ttl - age).max(1) as u64);
        let again = Action::requeue(until_cleaned);
        if finished {
            return Ok(again);
        }
        let signer = csr.spec.signer_name.as_str();
        if !approved {
            if signer == KUBELET_CLIENT_SIGNER && self.approve_node_client(csr).await? {
                // Not allowed (yet): the requester's permission may come with a binding made
                // later (the default policy right after a leader starts, an admin's grant).
                return Ok(Action::requeue(RECHECK.min(until_cleaned)));
            }
            return Ok(again);
        }
        if signer == KUBELET_CLIENT_SIGNER || signer == CLIENT_SIGNER {
            self.sign(csr).await?;
        }
        Ok(again)
    }

    /// The approver: a node client certificate is approved when its requester may ask for one
    /// (`nodeclient`), or is the very node renewing its own (`selfnodeclient`). True when it
    /// was not because the requester is not allowed (yet): worth looking at again.
    async fn approve_node_client(&self, csr: &CertificateSigningRequest) -> Result<bool, ApiError> {
        let Some(pem) = request_pem(csr) else {
            return Ok(false);
        };
        let Ok(subject) = rkube_pki::parse_csr(&pem) else {
            return Ok(false);
        };
        let csr_name = name(&csr.metadata);
        let username = csr.spec.username.as_deref().unwrap_or("");
        let groups = csr.spec.groups.clone().unwrap_or_default();
        let in_nodes = groups.iter().any(|g| g == "system:nodes");
        let subresource = if username == subject.common_name && in_nodes {
            "selfnodeclient"
        } else {
            "nodeclient"
        };
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(username.to_string()),
                groups: Some(groups),
                uid: csr.spec.uid.clone(),
                extra: csr.spec.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("certificates.k8s.io".into()),
                    resource: Some("certificatesigningrequests".into()),
                    subresource: Some(subresource.into()),
                    verb: Some("create".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Objects::<SubjectAccessReview>::namespaced(&self.client, "")
            .create(&review)
            .await?;
        if !answer.status.is_some_and(|s| s.allowed) {
            tracing::debug!(csr = csr_name, username, subresource, "not auto-approved");
            return Ok(true);
        }
        let approved = with_condition(
            csr,
            condition(
                "Approved",
                "AutoApproved",
                "Auto approving kubelet client certificate after SubjectAccessReview.".into(),
            ),
        );
        ignore_gone(
            self.objects()
                .replace_subresource(csr_name, "approval", &approved)
                .await,
        )?;
        tracing::info!(
            csr = csr_name,
            username,
            "approved a node client certificate"
        );
        Ok(false)
    }

    /// The signer: a certificate from the cluster CA for as long as the request asks, at most
    /// the signing duration.
    async fn sign(&self, csr: &CertificateSigningRequest) -> Result<(), ApiError> {
        let Some(pem) = request_pem(csr) else {
            return Ok(());
        };
        let mut valid_for = self.settings.signing_duration;
        if let Some(secs) = csr.spec.expiration_seconds.filter(|s| *s >= 0) {
            valid_for = valid_for.min(Duration::from_secs(secs as u64));
        }
        let signed = match self.settings.signer.sign(&pem, valid_for, true, false) {
            Ok(cert) => {
                let mut signed = csr.clone();
                signed
                    .status
                    .get_or_insert_with(Default::default)
                    .certificate = Some(ByteString(cert.into_bytes()));
                signed
            }
            Err(e) => with_condition(
                csr,
                condition("Failed", "SignerValidationFailure", e.to_string()),
            ),
        };
        ignore_gone(
            self.objects()
                .replace_status(name(&csr.metadata), &signed)
                .await,
        )?;
        Ok(())
    }
}

const SIGNER_KEY: &str = "kube-public/cluster-info";

fn is_token(secret: &Secret) -> bool {
    secret.type_.as_deref() == Some(bootstrap_token::SECRET_TYPE)
}

/// The bootstrap signer: `kube-public/cluster-info` holds the kubeconfig joining nodes
/// verify, signed by every bootstrap token that may sign. It reconciles that ConfigMap (and
/// makes it when it is missing) when it changes or a bootstrap token does.
pub struct BootstrapSigner {
    secrets: Arc<Store<Secret>>,
    client: LocalClient,
    settings: Settings,
}

/// Starts the bootstrap signer until `stop`.
pub fn start_bootstrap_signer(
    secrets: Arc<Store<Secret>>,
    configmaps: Arc<Store<ConfigMap>>,
    client: LocalClient,
    settings: Settings,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let ctx = Arc::new(BootstrapSigner {
        secrets: secrets.clone(),
        client,
        settings,
    });
    let tokens = |old: Option<&Arc<Secret>>, new: Option<&Arc<Secret>>| {
        if [old, new].into_iter().flatten().any(|s| is_token(s)) {
            vec![SIGNER_KEY.to_string()]
        } else {
            Vec::new()
        }
    };
    let controller = Controller::new("bootstrap-signer", configmaps).watches(&secrets, tokens);
    // Signed once at the start even if nothing changes: the ConfigMap may not exist yet.
    controller.queue().add(SIGNER_KEY);
    controller.run_with_cleanup(
        1,
        stop,
        ctx,
        |cm: Arc<ConfigMap>, ctx: Arc<BootstrapSigner>| async move {
            if key(&cm.metadata) != SIGNER_KEY {
                return Ok(Action::await_change());
            }
            ctx.sign_cluster_info(Some(&cm)).await
        },
        |gone: String, ctx: Arc<BootstrapSigner>| async move {
            if gone != SIGNER_KEY {
                return Ok(Action::await_change());
            }
            ctx.sign_cluster_info(None).await
        },
    );
}

/// The token cleaner: a bootstrap token is deleted when it expires.
pub struct TokenCleaner {
    client: LocalClient,
}

/// Starts the token cleaner until `stop`.
pub fn start_token_cleaner(
    secrets: Arc<Store<Secret>>,
    client: LocalClient,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let ctx = Arc::new(TokenCleaner { client });
    Controller::new("token-cleaner", secrets).run(
        1,
        stop,
        ctx,
        |secret: Arc<Secret>, ctx: Arc<TokenCleaner>| async move { ctx.reconcile(&secret).await },
    );
}

impl TokenCleaner {
    /// Deletes `secret` if it is an expired bootstrap token; else looks again when it expires.
    async fn reconcile(&self, secret: &Secret) -> Result<Action, ApiError> {
        if !is_token(secret) {
            return Ok(Action::await_change());
        }
        let Some(exp) = bootstrap_token::secret_value(secret, "expiration") else {
            return Ok(Action::await_change());
        };
        let now = chrono::Utc::now();
        if bootstrap_token::expired(secret, now) {
            let (ns, token) = (namespace(&secret.metadata), name(&secret.metadata));
            ignore_gone(
                Objects::<Secret>::namespaced(&self.client, ns)
                    .delete(token)
                    .await,
            )?;
            tracing::info!(token, "deleted an expired bootstrap token");
            return Ok(Action::await_change());
        }
        let left = chrono::DateTime::parse_from_rfc3339(exp.trim())
            .map(|t| (t.with_timezone(&chrono::Utc) - now).num_seconds())
            .unwrap_or(1);
        Ok(Action::requeue(Duration::from_secs(left.max(1) as u64)))
    }
}

impl BootstrapSigner {
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
    async fn sign_cluster_info(&self, current: Option<&ConfigMap>) -> Result<Action, ApiError> {
        let now = chrono::Utc::now();
        let kept = current
            .as_ref()
            .and_then(|cm| cm.data.as_ref()?.get("kubeconfig"))
            .filter(|k| !k.is_empty());
        // Kubernetes keeps the kubeconfig an operator put there; rkube writes its own only when
        // there is none.
        let kubeconfig = kept.cloned().unwrap_or_else(|| self.kubeconfig());
        let mut data = BTreeMap::from([("kubeconfig".to_string(), kubeconfig.clone())]);
        for secret in self.secrets.in_namespace("kube-system") {
            if !is_token(&secret)
                || bootstrap_token::expired(&secret, now)
                || secret.metadata.deletion_timestamp.is_some()
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
            let jws = bootstrap_token::detached_jws(&kubeconfig, &id, &token_secret);
            data.insert(format!("{JWS_PREFIX}{id}"), jws);
        }
        let objects = Objects::<ConfigMap>::namespaced(&self.client, "kube-public");
        match current {
            Some(cm) if cm.data.as_ref() == Some(&data) => {}
            Some(cm) => {
                let mut cm = cm.clone();
                cm.data = Some(data);
                ignore_gone(objects.replace(CLUSTER_INFO, &cm).await)?;
            }
            None => {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(CLUSTER_INFO.into()),
                        namespace: Some("kube-public".into()),
                        ..Default::default()
                    },
                    data: Some(data),
                    ..Default::default()
                };
                match objects.create(&cm).await {
                    Ok(_) => {}
                    Err(e) if e.code == 409 || e.code == 404 => {
                        // Created meanwhile, or kube-public not there yet: look again soon.
                        return Ok(Action::requeue(Duration::from_secs(1)));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Action::await_change())
    }
}
