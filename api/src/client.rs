//! An in-process client of the API: what the controllers and the scheduler running on the leader
//! use to read and write. A call is a function call into the verbs a request from the network
//! reaches ([`Api::serve`](crate::handler::Api)) — authorization of the client's user,
//! validation, admission, resourceVersion checks, the same store writes — with no HTTP request,
//! no encoding of the body or the answer, and the [`ApiError`] as the verb returned it.

use std::sync::Arc;

use serde_json::Value;

use crate::auth::User;
use crate::error::ApiError;
use crate::handler::{Api, Patch, Verb};
use crate::patch::PatchType;
use crate::storage::Fence;

#[derive(Clone)]
pub struct LocalClient {
    api: Arc<Api>,
    user: Arc<User>,
    /// Who may commit this client's writes: [`Fence::Term`] for the controllers and the
    /// scheduler a leader runs, whose writes are refused once this member no longer leads it.
    fence: Fence,
}

impl LocalClient {
    pub fn new(api: Arc<Api>, user: User) -> LocalClient {
        LocalClient {
            api,
            user: Arc::new(user),
            fence: Fence::Any,
        }
    }

    /// The same client, writing only as the leader of `term`.
    pub fn fenced(&self, term: u64) -> LocalClient {
        LocalClient {
            fence: Fence::Term(term),
            ..self.clone()
        }
    }

    async fn call(&self, path: &str, verb: Verb<'_>) -> Result<Value, ApiError> {
        self.api.call(&self.user, path, verb, self.fence).await
    }

    /// An object, or a collection as its list (`path` may carry a query: selectors, limit).
    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.call(path, Verb::Get).await
    }

    /// POSTs `object` to `path`: a new object, or a subresource's body (a Binding, an
    /// Eviction). Answers what was stored (or the Status of a subresource).
    pub async fn create(&self, path: &str, object: &Value) -> Result<Value, ApiError> {
        self.call(path, Verb::Create(object.clone())).await
    }

    pub async fn update(&self, path: &str, object: &Value) -> Result<Value, ApiError> {
        self.call(path, Verb::Update(object.clone())).await
    }

    pub async fn patch(
        &self,
        path: &str,
        kind: PatchType,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        self.call(path, Verb::Patch(Patch::value(kind, patch.clone())))
            .await
    }

    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Value, ApiError> {
        self.patch(path, PatchType::Merge, patch).await
    }

    /// Deletes the object at `path` (with DeleteOptions), or the collection's matching objects.
    pub async fn delete(&self, path: &str, options: Option<&Value>) -> Result<Value, ApiError> {
        self.call(path, Verb::Delete(options.cloned())).await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::body::Body;
    use http_body_util::BodyExt;
    use rkube_store::server::{self, ClusterState, RunningServer, ServerConfig};
    use serde_json::json;

    use super::*;

    /// A one-member store, leading, and the API over it.
    struct Fixture {
        api: Arc<Api>,
        server: RunningServer,
        _dir: tempfile::TempDir,
    }

    fn free_addr() -> std::net::SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("a bound address")
    }

    impl Fixture {
        async fn start() -> Fixture {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let pki = dir.path().join("pki");
            std::fs::create_dir_all(&pki).expect("the PKI directory");
            rkube_pki::init_ca(&pki).expect("a CA");
            rkube_pki::issue(&pki, "m1", "m1", None, &["127.0.0.1".into()], true, true)
                .expect("the member's certificate");
            rkube_pki::init_service_account_key(&pki).expect("a signing key");
            let (private, public) =
                rkube_pki::load_service_account_key(&pki.join(rkube_pki::SA_KEY_FILE))
                    .expect("the signing key");
            let peer = free_addr();
            let server = server::start(ServerConfig {
                name: "m1".into(),
                data_dir: dir.path().join("data"),
                listen_peer: peer,
                listen_client: free_addr(),
                listen_metrics: None,
                advertise_client: vec![],
                initial_cluster: vec![("m1".into(), peer.to_string())],
                initial_cluster_state: ClusterState::New,
                cluster_token: "client-tests".into(),
                pki_dir: pki,
                insecure_client: true,
                heartbeat: Duration::from_millis(50),
                election_timeout: Duration::from_millis(500),
                snapshot_count: 10_000,
                snapshot_catchup_entries: 5_000,
                request_timeout: Duration::from_secs(5),
                progress_interval: Duration::from_secs(1),
                quota_backend_bytes: 1 << 31,
                force_new_cluster: false,
                unsafe_no_fsync: true,
                snapshot_schedule: None,
                endpoint: Default::default(),
            })
            .await
            .expect("a one-member store");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while !server.node.is_leader() {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the only member did not become leader within 20 s"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let tokens =
                crate::token::SigningKey::from_pem(&private, &public).expect("a token signing key");
            let api = Arc::new(Api::new(server.node.clone(), Default::default(), 0, tokens));
            let fixture = Fixture {
                api,
                server,
                _dir: dir,
            };
            fixture
                .client(admin())
                .create(
                    "/api/v1/namespaces",
                    &json!({"metadata": {"name": "default"}}),
                )
                .await
                .expect("the default namespace");
            fixture
        }

        fn client(&self, user: User) -> LocalClient {
            LocalClient::new(self.api.clone(), user)
        }

        fn term(&self) -> u64 {
            self.server.node.term()
        }

        async fn stop(self) {
            self.server.shutdown().await;
        }
    }

    fn admin() -> User {
        User {
            name: "system:kube-controller-manager".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            ..Default::default()
        }
    }

    fn config_map(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": name, "labels": {"app": name}}, "data": {"k": "v"}})
    }

    fn pod(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    }

    const CM: &str = "/api/v1/namespaces/default/configmaps";
    const PODS: &str = "/api/v1/namespaces/default/pods";

    /// Every kind of write the controllers and the scheduler make, from a client fenced to a
    /// term this member does not lead: each is refused and the store does not move. The same
    /// writes fenced to the current term go through.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_client_writes_only_while_its_member_leads_that_term() {
        let f = Fixture::start().await;
        let current = f.client(admin()).fenced(f.term());
        current.create(CM, &config_map("kept")).await.unwrap();
        current.create(PODS, &pod("web")).await.unwrap();
        current.create(PODS, &pod("bound")).await.unwrap();
        let stale = f.client(admin()).fenced(f.term() + 1);
        let kept = format!("{CM}/kept");
        let mut updated = config_map("kept");
        updated["data"]["k"] = json!("changed");
        let binding = json!({"apiVersion": "v1", "kind": "Binding",
                             "metadata": {"name": "web"}, "target": {"name": "n1"}});
        let status =
            json!({"status": {"conditions": [{"type": "PodScheduled", "status": "False"}]}});
        let writes: Vec<(&str, Result<Value, ApiError>)> = vec![
            ("create", stale.create(CM, &config_map("new")).await),
            ("update", stale.update(&kept, &updated).await),
            (
                "merge patch",
                stale.merge_patch(&kept, &json!({"data": {"k": "p"}})).await,
            ),
            (
                "strategic merge patch of status",
                stale
                    .patch(
                        &format!("{PODS}/web/status"),
                        PatchType::StrategicMerge,
                        &status,
                    )
                    .await,
            ),
            (
                "binding",
                stale.create(&format!("{PODS}/web/binding"), &binding).await,
            ),
            ("delete", stale.delete(&kept, None).await),
            (
                "eviction",
                stale
                    .create(
                        &format!("{PODS}/web/eviction"),
                        &json!({"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": "web"}}),
                    )
                    .await,
            ),
            ("delete collection", stale.delete(CM, None).await),
        ];
        let revision = f.api.store.revision();
        for (what, result) in writes {
            let e = result.expect_err(what);
            assert_eq!(
                (e.code, e.reason),
                (503, "ServiceUnavailable"),
                "{what}: {e:?}"
            );
            assert!(
                e.message
                    .contains(&format!("no longer leads term {}", f.term() + 1)),
                "{what}: {}",
                e.message
            );
        }
        assert_eq!(
            f.api.store.revision(),
            revision,
            "a refused write changed the store"
        );
        assert_eq!(
            current.get(&kept).await.unwrap()["data"]["k"],
            json!("v"),
            "the object is as it was"
        );
        // Reads are not fenced; the current term's writes go through.
        assert!(stale.get(&kept).await.is_ok());
        current.update(&kept, &updated).await.unwrap();
        current
            .create(&format!("{PODS}/bound/binding"), &binding)
            .await
            .unwrap();
        current.delete(&kept, None).await.unwrap();
        f.stop().await;
    }

    /// An error reaches the caller as the verb made it: the code, reason and message a request
    /// over HTTP is answered with, in Kubernetes' words.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_error_keeps_its_code_reason_and_message() {
        let f = Fixture::start().await;
        let client = f.client(admin());
        client.create(CM, &config_map("a")).await.unwrap();
        let dup = client.create(CM, &config_map("a")).await.unwrap_err();
        assert_eq!((dup.code, dup.reason), (409, "AlreadyExists"));
        assert_eq!(dup.message, "configmaps \"a\" already exists");
        let missing = client.get(&format!("{CM}/b")).await.unwrap_err();
        assert_eq!((missing.code, missing.reason), (404, "NotFound"));
        assert_eq!(missing.message, "configmaps \"b\" not found");
        let mut stale = config_map("a");
        stale["metadata"]["resourceVersion"] = json!("1");
        let conflict = client.update(&format!("{CM}/a"), &stale).await.unwrap_err();
        assert_eq!((conflict.code, conflict.reason), (409, "Conflict"));
        assert_eq!(
            conflict.message,
            "Operation cannot be fulfilled on configmaps \"a\": the object has been modified; please apply your changes to the latest version and try again"
        );
        // The Status a request over HTTP gets is the same error's.
        let req = hyper::Request::builder()
            .method("POST")
            .uri(CM)
            .header("content-type", "application/json")
            .body(Body::from(config_map("a").to_string()))
            .unwrap();
        let resp = f.api.handle(&admin(), req).await;
        assert_eq!(resp.status().as_u16(), 409);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let status: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(status, dup.status());
        f.stop().await;
    }

    /// The client's user is authorized as a request's would be, and the query of a path
    /// (selectors) is honoured.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_user_is_authorized_and_the_query_is_read() {
        let f = Fixture::start().await;
        let nobody = f.client(User {
            name: "nobody".into(),
            groups: vec!["system:authenticated".into()],
            ..Default::default()
        });
        let e = nobody.create(CM, &config_map("x")).await.unwrap_err();
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "configmaps is forbidden: User \"nobody\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"default\""
        );
        let client = f.client(admin());
        for name in ["x", "y"] {
            client.create(CM, &config_map(name)).await.unwrap();
        }
        let list = client
            .get(&format!("{CM}?labelSelector=app%3Dy"))
            .await
            .unwrap();
        assert_eq!(list["kind"], "ConfigMapList");
        let names: Vec<&Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["metadata"]["name"])
            .collect();
        assert_eq!(names, vec!["y"]);
        f.stop().await;
    }

    /// ServiceAccount admission through the verbs: a new pod runs as `default` with the token
    /// volume mounted, a pod naming a missing ServiceAccount is forbidden, automounting can be
    /// turned off by the ServiceAccount; a token bound to a pod authenticates as its
    /// ServiceAccount with the pod in its claims, and stops when the pod is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pods_get_a_bound_token_volume_and_the_token_dies_with_the_pod() {
        let f = Fixture::start().await;
        let client = f.client(admin());
        const PODS: &str = "/api/v1/namespaces/default/pods";
        let web = client.create(PODS, &pod("web")).await.unwrap();
        assert_eq!(web["spec"]["serviceAccountName"], "default");
        let volume = &web["spec"]["volumes"][0];
        let name = volume["name"].as_str().unwrap();
        assert!(
            name.starts_with("kube-api-access-") && name.len() == 21,
            "{name}"
        );
        assert_eq!(
            volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"],
            3607
        );
        assert_eq!(
            web["spec"]["containers"][0]["volumeMounts"][0],
            json!({"name": name, "readOnly": true, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"})
        );

        let mut lost = pod("lost");
        lost["spec"]["serviceAccountName"] = json!("nobody");
        let e = client.create(PODS, &lost).await.unwrap_err();
        assert_eq!((e.code, e.reason), (403, "Forbidden"));
        assert_eq!(
            e.message,
            "pods \"lost\" is forbidden: error looking up service account default/nobody: serviceaccount \"nobody\" not found"
        );
        client
            .create(
                "/api/v1/namespaces/default/serviceaccounts",
                &json!({"metadata": {"name": "quiet"}, "automountServiceAccountToken": false}),
            )
            .await
            .unwrap();
        let mut quiet = pod("quiet");
        quiet["spec"]["serviceAccountName"] = json!("quiet");
        let quiet = client.create(PODS, &quiet).await.unwrap();
        assert!(quiet["spec"].get("volumes").is_none(), "{quiet}");
        assert!(quiet["spec"]["containers"][0].get("volumeMounts").is_none());

        let answer = client
            .create(
                "/api/v1/namespaces/default/serviceaccounts/default/token",
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3607, "boundObjectRef":
                            {"apiVersion": "v1", "kind": "Pod", "name": "web", "uid": web["metadata"]["uid"]}}}),
            )
            .await
            .unwrap();
        let token = answer["status"]["token"].as_str().unwrap();
        let user = f.api.authenticate_token(token).await.unwrap();
        assert_eq!(user.name, "system:serviceaccount:default:default");
        assert_eq!(
            user.extra["authentication.kubernetes.io/pod-name"],
            vec!["web".to_string()]
        );
        client
            .delete(
                &format!("{PODS}/web"),
                Some(&json!({"gracePeriodSeconds": 0})),
            )
            .await
            .unwrap();
        let e = f.api.authenticate_token(token).await.unwrap_err();
        assert_eq!(e.code, 401);
        f.stop().await;
    }
}
