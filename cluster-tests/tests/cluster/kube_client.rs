//! The Rust `kube` crate, a third-party Kubernetes client, against an `rkube up` cluster: typed
//! CRUD, a paginated list, a watch resumed from a resourceVersion, and a Conflict on a stale
//! update.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use cluster_tests::{wait_for, Cluster, Options};

async fn client(c: &Cluster) -> Client {
    client_of(c, 0).await
}

/// The admin's client of server `i` (its context in DIR/admin.kubeconfig).
pub(crate) async fn client_of(c: &Cluster, i: usize) -> Client {
    let kubeconfig = Kubeconfig::read_from(c.path().join("admin.kubeconfig")).expect("kubeconfig");
    let options = KubeConfigOptions {
        context: Some(format!("rkube-n{}", i + 1)),
        ..KubeConfigOptions::default()
    };
    let config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

fn configmap(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "kube-test"}},
        "data": {"value": value},
    }))
    .expect("a ConfigMap")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_client_crud_pagination_watch_and_conflict() {
    let c = Cluster::start(Options {
        kubernetes_api: true,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;
    let client = client(&c).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    wait_for("the default namespace", Duration::from_secs(30), || async {
        namespaces.get_opt("default").await.ok().flatten()
    })
    .await;

    // Typed CRUD.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = cms
        .create(&PostParams::default(), &configmap("one", "1"))
        .await
        .expect("create");
    assert!(created.metadata.uid.is_some() && created.metadata.resource_version.is_some());
    let got = cms.get("one").await.expect("get");
    assert_eq!(
        got.data
            .as_ref()
            .and_then(|d| d.get("value"))
            .map(String::as_str),
        Some("1")
    );
    let mut changed = got.clone();
    changed
        .data
        .get_or_insert_default()
        .insert("value".into(), "2".into());
    let replaced = cms
        .replace("one", &PostParams::default(), &changed)
        .await
        .expect("replace");
    assert_ne!(
        replaced.metadata.resource_version,
        got.metadata.resource_version
    );

    // A stale update is a 409 Conflict.
    let stale = cms.replace("one", &PostParams::default(), &changed).await;
    match stale {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 409);
            assert_eq!(e.reason, "Conflict");
        }
        other => panic!("a stale replace gave {other:?}"),
    }
    let exists = cms
        .create(&PostParams::default(), &configmap("one", "x"))
        .await;
    assert!(
        matches!(exists, Err(kube::Error::Api(ref e)) if e.code == 409 && e.reason == "AlreadyExists"),
        "{exists:?}"
    );

    // A deployment with the defaults Kubernetes applies.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "c", "image": "nginx"}]}}},
    }))
    .expect("a Deployment");
    let d = deployments
        .create(&PostParams::default(), &d)
        .await
        .expect("create deployment");
    let spec = d.spec.expect("spec");
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(spec.revision_history_limit, Some(10));

    // Paginated list: 25 objects in pages of 7, all from one snapshot.
    for i in 0..24 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("page-{i:02}"), "p"),
        )
        .await
        .expect("create");
    }
    let mut names = Vec::new();
    let mut params = ListParams::default().labels("app=kube-test").limit(7);
    let mut pages = 0;
    loop {
        let page = cms.list(&params).await.expect("list page");
        pages += 1;
        names.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(pages, 4);
    assert_eq!(names.len(), 25);

    // A watch from a resourceVersion, dropped, then resumed from the last event it saw:
    // nothing is missed and nothing repeats.
    let start = cms
        .list(&ListParams::default().limit(1))
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    let wp = WatchParams::default().labels("app=kube-test");
    let mut stream = cms.watch(&wp, &start).await.expect("watch").boxed();
    for i in 0..3 {
        cms.create(&PostParams::default(), &configmap(&format!("w{i}"), "w"))
            .await
            .expect("create");
    }
    let mut seen = Vec::new();
    let mut last_rv = start.clone();
    while seen.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(30), stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(cm)))) => {
                last_rv = cm.metadata.resource_version.clone().expect("rv");
                seen.push(cm.metadata.name.expect("name"));
            }
            Ok(Ok(Some(WatchEvent::Bookmark(_)))) => {}
            other => panic!("unexpected watch result {other:?}"),
        }
    }
    drop(stream);
    for i in 3..6 {
        cms.create(&PostParams::default(), &configmap(&format!("w{i}"), "w"))
            .await
            .expect("create");
    }
    cms.delete("w0", &DeleteParams::default())
        .await
        .expect("delete");
    let mut stream = cms.watch(&wp, &last_rv).await.expect("resume").boxed();
    let mut resumed = Vec::new();
    while resumed.len() < 4 {
        match tokio::time::timeout(Duration::from_secs(30), stream.try_next()).await {
            Ok(Ok(Some(WatchEvent::Added(cm)))) => {
                resumed.push(format!("ADDED {}", cm.metadata.name.expect("name")))
            }
            Ok(Ok(Some(WatchEvent::Deleted(cm)))) => {
                resumed.push(format!("DELETED {}", cm.metadata.name.expect("name")))
            }
            Ok(Ok(Some(WatchEvent::Bookmark(_)))) => {}
            other => panic!("unexpected watch result {other:?}"),
        }
    }
    assert_eq!(seen, ["w0", "w1", "w2"]);
    assert_eq!(resumed, ["ADDED w3", "ADDED w4", "ADDED w5", "DELETED w0"]);

    // A watch from a compacted revision is 410 Gone.
    let mut kv = c.kv(0);
    let now = cms
        .list(&ListParams::default().limit(1))
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    kv.compact(rkube_store::proto::etcdserverpb::CompactionRequest {
        revision: now.parse().expect("numeric rv"),
        physical: true,
    })
    .await
    .expect("compact");
    let mut old = cms.watch(&wp, &start).await.expect("watch").boxed();
    match tokio::time::timeout(Duration::from_secs(30), old.try_next()).await {
        Ok(Ok(Some(WatchEvent::Error(e)))) => assert_eq!(e.code, 410, "{e:?}"),
        Ok(Err(kube::Error::Api(e))) => assert_eq!(e.code, 410, "{e:?}"),
        other => panic!("a watch from a compacted revision gave {other:?}"),
    }
}
