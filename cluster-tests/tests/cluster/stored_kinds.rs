//! The rest of kube-apiserver 1.32's built-in types, served and stored though nothing in
//! rkube acts on them yet: `kubectl api-resources` lists what kube-apiserver lists by default
//! (without the groups and kinds later work brings), each new kind applies (and applies again
//! unchanged), explains and reads back with kubectl's columns, Kubernetes' defaults and
//! admission fill in what they fill in (the default IngressClass, a policy's types, a
//! RuntimeClass's scheduling), `kubectl create ingress` works, bindings and component statuses
//! answer, and invalid objects are refused in Kubernetes' words.

use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::wait_for;

/// `kubectl api-resources -o name` against kube-apiserver 1.32 with its default flags.
const KUBE_APISERVER_1_32: &[&str] = &[
    "bindings",
    "componentstatuses",
    "configmaps",
    "endpoints",
    "events",
    "limitranges",
    "namespaces",
    "nodes",
    "persistentvolumeclaims",
    "persistentvolumes",
    "pods",
    "podtemplates",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "serviceaccounts",
    "services",
    "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    "validatingadmissionpolicies.admissionregistration.k8s.io",
    "validatingadmissionpolicybindings.admissionregistration.k8s.io",
    "validatingwebhookconfigurations.admissionregistration.k8s.io",
    "customresourcedefinitions.apiextensions.k8s.io",
    "apiservices.apiregistration.k8s.io",
    "controllerrevisions.apps",
    "daemonsets.apps",
    "deployments.apps",
    "replicasets.apps",
    "statefulsets.apps",
    "selfsubjectreviews.authentication.k8s.io",
    "tokenreviews.authentication.k8s.io",
    "localsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "subjectaccessreviews.authorization.k8s.io",
    "horizontalpodautoscalers.autoscaling",
    "cronjobs.batch",
    "jobs.batch",
    "certificatesigningrequests.certificates.k8s.io",
    "leases.coordination.k8s.io",
    "endpointslices.discovery.k8s.io",
    "events.events.k8s.io",
    "flowschemas.flowcontrol.apiserver.k8s.io",
    "prioritylevelconfigurations.flowcontrol.apiserver.k8s.io",
    "ingressclasses.networking.k8s.io",
    "ingresses.networking.k8s.io",
    "networkpolicies.networking.k8s.io",
    "runtimeclasses.node.k8s.io",
    "poddisruptionbudgets.policy",
    "clusterrolebindings.rbac.authorization.k8s.io",
    "clusterroles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "roles.rbac.authorization.k8s.io",
    "priorityclasses.scheduling.k8s.io",
    "csidrivers.storage.k8s.io",
    "csinodes.storage.k8s.io",
    "csistoragecapacities.storage.k8s.io",
    "storageclasses.storage.k8s.io",
    "volumeattachments.storage.k8s.io",
];

/// What a cluster with metrics-server adds, and rkube serves itself.
const METRICS_SERVER: &[&str] = &["nodes.metrics.k8s.io", "pods.metrics.k8s.io"];

/// What rkube does not serve yet: the extension groups and flow control (later issues bring
/// them with their machinery) and the kinds that come with their controllers.
const NOT_YET: &[&str] = &[
    ".admissionregistration.k8s.io",
    ".apiextensions.k8s.io",
    ".apiregistration.k8s.io",
    ".flowcontrol.apiserver.k8s.io",
];

/// One object of each kind added, as a user writes them.
const MANIFESTS: &str = r#"
apiVersion: v1
kind: PodTemplate
metadata:
  name: web-template
template:
  metadata:
    labels:
      app: web
  spec:
    containers:
    - name: web
      image: nginx:1.27
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata:
  name: nginx
  annotations:
    ingressclass.kubernetes.io/is-default-class: "true"
spec:
  controller: k8s.io/ingress-nginx
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: db
spec:
  podSelector:
    matchLabels:
      app: db
  egress:
  - ports:
    - port: 5432
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata:
  name: gvisor
handler: runsc
---
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: hostpath.csi.k8s.io
spec:
  attachRequired: false
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata:
  name: n1
spec:
  drivers:
  - name: hostpath.csi.k8s.io
    nodeID: n1
---
apiVersion: storage.k8s.io/v1
kind: CSIStorageCapacity
metadata:
  name: cap1
storageClassName: local-path
capacity: 10Gi
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttachment
metadata:
  name: va1
spec:
  attacher: hostpath.csi.k8s.io
  nodeName: n1
  source:
    persistentVolumeName: pv1
"#;

/// An Ingress naming no class: the default IngressClass above is filled in.
const INGRESS: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: web
spec:
  rules:
  - host: example.com
    http:
      paths:
      - path: /
        pathType: Prefix
        backend:
          service:
            name: web
            port:
              number: 80
"#;

/// What `kubectl get ARGS` prints for one object: its header, and its row without the AGE
/// cell when the kind prints an age.
struct Listing {
    args: &'static [&'static str],
    header: &'static [&'static str],
    row: &'static [&'static str],
    aged: bool,
}

/// Lines of a table, split into columns (the header first).
fn table(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// `kubectl get ARGS`: its header and its one row without the AGE cell (when `aged`).
async fn get_one(k: &Kubectl, args: &[&str], aged: bool) -> (Vec<String>, Vec<String>) {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    let out = k.run(&full).await.ok();
    let mut t = table(&out);
    assert_eq!(t.len(), 2, "{args:?}: {out}");
    let mut row = t.remove(1);
    if aged {
        row.pop();
    }
    (t.remove(0), row)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_kinds_are_served_as_kube_apiserver_serves_them() {
    let (_c, k) = cluster_tests::kubectl::api_cluster().await;

    let mut want: Vec<&str> = KUBE_APISERVER_1_32
        .iter()
        .copied()
        .filter(|r| {
            !NOT_YET
                .iter()
                .any(|n| r == n || (n.starts_with('.') && r.ends_with(n)))
        })
        .chain(METRICS_SERVER.iter().copied())
        .collect();
    want.sort_unstable();
    let listed = k.run(&["api-resources", "-o", "name"]).await.ok();
    let mut got: Vec<&str> = listed.lines().collect();
    got.sort_unstable();
    assert_eq!(got, want);

    let applied = k
        .run_with_input(&["apply", "-f", "-"], MANIFESTS)
        .await
        .ok();
    for line in [
        "podtemplate/web-template created",
        "ingressclass.networking.k8s.io/nginx created",
        "networkpolicy.networking.k8s.io/db created",
        "runtimeclass.node.k8s.io/gvisor created",
        "csidriver.storage.k8s.io/hostpath.csi.k8s.io created",
        "csinode.storage.k8s.io/n1 created",
        "csistoragecapacity.storage.k8s.io/cap1 created",
        "volumeattachment.storage.k8s.io/va1 created",
    ] {
        assert!(applied.lines().any(|l| l == line), "{applied}");
    }
    let applied = k.run_with_input(&["apply", "-f", "-"], INGRESS).await.ok();
    assert_eq!(applied.trim(), "ingress.networking.k8s.io/web created");
    // Applied again, nothing changes. kubectl still patches the NetworkPolicy, as it does
    // against kube-apiserver: its egress rules are a list without a merge key, and the server
    // defaulted the port's protocol in it; the patch leaves the spec as it was.
    let again = k
        .run_with_input(&["apply", "-f", "-"], MANIFESTS)
        .await
        .ok();
    let changed: Vec<&str> = again
        .lines()
        .filter(|l| !l.ends_with(" unchanged"))
        .collect();
    assert_eq!(
        changed,
        ["networkpolicy.networking.k8s.io/db configured"],
        "{again}"
    );
    let generation = k
        .run(&[
            "get",
            "netpol",
            "db",
            "-o",
            "jsonpath={.metadata.generation}",
        ])
        .await
        .ok();
    assert_eq!(generation, "1");
    let explain = k
        .run(&["explain", "ingress.spec.rules.http.paths.pathType"])
        .await
        .ok();
    assert!(
        explain.contains("KIND:") && explain.contains("Ingress"),
        "{explain}"
    );

    let cases = [
        Listing {
            args: &["podtemplates"],
            header: &["NAME", "CONTAINERS", "IMAGES", "POD", "LABELS"],
            row: &["web-template", "web", "nginx:1.27", "app=web"],
            aged: false,
        },
        // No controller publishes an address: the ADDRESS cell is empty.
        Listing {
            args: &["ingress"],
            header: &["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"],
            row: &["web", "nginx", "example.com", "80"],
            aged: true,
        },
        Listing {
            args: &["ingressclass"],
            header: &["NAME", "CONTROLLER", "PARAMETERS", "AGE"],
            row: &["nginx", "k8s.io/ingress-nginx", "<none>"],
            aged: true,
        },
        Listing {
            args: &["netpol"],
            header: &["NAME", "POD-SELECTOR", "AGE"],
            row: &["db", "app=db"],
            aged: true,
        },
        Listing {
            args: &["runtimeclass"],
            header: &["NAME", "HANDLER", "AGE"],
            row: &["gvisor", "runsc"],
            aged: true,
        },
        Listing {
            args: &["csidriver"],
            header: &[
                "NAME",
                "ATTACHREQUIRED",
                "PODINFOONMOUNT",
                "STORAGECAPACITY",
                "TOKENREQUESTS",
                "REQUIRESREPUBLISH",
                "MODES",
                "AGE",
            ],
            row: &[
                "hostpath.csi.k8s.io",
                "false",
                "false",
                "false",
                "<unset>",
                "false",
                "Persistent",
            ],
            aged: true,
        },
        Listing {
            args: &["csinode"],
            header: &["NAME", "DRIVERS", "AGE"],
            row: &["n1", "1"],
            aged: true,
        },
        Listing {
            args: &["csistoragecapacities"],
            header: &["NAME", "STORAGECLASSNAME", "CAPACITY"],
            row: &["cap1", "local-path", "10Gi"],
            aged: false,
        },
        Listing {
            args: &["volumeattachment"],
            header: &["NAME", "ATTACHER", "PV", "NODE", "ATTACHED", "AGE"],
            row: &["va1", "hostpath.csi.k8s.io", "pv1", "n1", "false"],
            aged: true,
        },
        Listing {
            args: &["componentstatus", "etcd-0"],
            header: &["NAME", "STATUS", "MESSAGE", "ERROR"],
            row: &["etcd-0", "Healthy", "ok"],
            aged: false,
        },
    ];
    for l in cases {
        let (header, row) = get_one(&k, l.args, l.aged).await;
        assert_eq!(header, l.header, "{:?}", l.args);
        assert_eq!(row, l.row, "{:?}", l.args);
    }
    let out = k.run(&["get", "cs", "-o", "name"]).await;
    assert!(
        out.stderr
            .contains("Warning: v1 ComponentStatus is deprecated in v1.19+"),
        "{}",
        out.stderr
    );
    let cs = out.ok();
    assert_eq!(
        cs.lines().collect::<Vec<_>>(),
        [
            "componentstatus/scheduler",
            "componentstatus/controller-manager",
            "componentstatus/etcd-0"
        ]
    );

    // Kubernetes' defaults: egress rules add Egress to the policy's types, ports are TCP.
    let np = k
        .run(&[
            "get",
            "netpol",
            "db",
            "-o",
            "jsonpath={.spec.policyTypes} {.spec.egress[0].ports[0].protocol}",
        ])
        .await
        .ok();
    assert_eq!(np, r#"["Ingress","Egress"] TCP"#);

    // kubectl's typed command sends the Ingress as protobuf.
    let created = k
        .run(&[
            "create",
            "ingress",
            "api",
            "--rule=api.example.com/v1=api:8080",
        ])
        .await
        .ok();
    assert_eq!(created.trim(), "ingress.networking.k8s.io/api created");
    let (_, row) = get_one(&k, &["ingress", "api"], true).await;
    assert_eq!(row, ["api", "nginx", "api.example.com", "80"]);

    // A PodTemplate's generation counts changes to its template (it has no spec).
    let generation = |k: Kubectl| async move {
        k.run(&[
            "get",
            "podtemplate",
            "web-template",
            "-o",
            "jsonpath={.metadata.generation}",
        ])
        .await
        .ok()
    };
    assert_eq!(generation(k.clone()).await, "1");
    k.run(&[
        "patch",
        "podtemplate",
        "web-template",
        "--type=json",
        "-p",
        r#"[{"op": "replace", "path": "/template/spec/containers/0/image", "value": "nginx:1.28"}]"#,
    ])
    .await
    .ok();
    assert_eq!(generation(k.clone()).await, "2");

    // An ingress controller publishes its address through the status subresource.
    k.run(&[
        "patch",
        "ingress",
        "web",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}}"#,
    ])
    .await
    .ok();
    let (_, row) = get_one(&k, &["ingress", "web"], true).await;
    assert_eq!(row, ["web", "nginx", "example.com", "192.0.2.10", "80"]);

    // RuntimeClass admission: a pod gets its class's scheduling, or is refused when the class
    // does not exist.
    let refused = k
        .run(&[
            "run",
            "sandboxed",
            "--image=nginx:1.27",
            "--overrides",
            r#"{"spec": {"runtimeClassName": "kata"}}"#,
        ])
        .await
        .err();
    assert!(
        refused.contains(
            r#"pods "sandboxed" is forbidden: pod rejected: RuntimeClass "kata" not found"#
        ),
        "{refused}"
    );
    let gvisor = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: gvisor\nhandler: runsc\nscheduling:\n  nodeSelector:\n    sandbox: gvisor\n";
    k.run_with_input(&["apply", "-f", "-"], gvisor).await.ok();
    k.run(&[
        "run",
        "sandboxed",
        "--image=nginx:1.27",
        "--overrides",
        r#"{"spec": {"runtimeClassName": "gvisor"}}"#,
    ])
    .await
    .ok();
    let selector = k
        .run(&[
            "get",
            "pod",
            "sandboxed",
            "-o",
            "jsonpath={.spec.nodeSelector.sandbox}",
        ])
        .await
        .ok();
    assert_eq!(selector, "gvisor");

    // A Binding posted to the collection binds the pod its name names.
    k.run(&["run", "pending", "--image=nginx:1.27"]).await.ok();
    let binding = r#"{"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "pending"},
                      "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}"#;
    k.run_with_input(
        &[
            "create",
            "--raw",
            "/api/v1/namespaces/default/bindings",
            "-f",
            "-",
        ],
        binding,
    )
    .await
    .ok();
    wait_for("the pod bound to n1", Duration::from_secs(30), || async {
        let node = k
            .run(&["get", "pod", "pending", "-o", "jsonpath={.spec.nodeName}"])
            .await
            .stdout;
        (node == "n1").then_some(())
    })
    .await;

    // Refusals, in Kubernetes' words.
    let no_path_type = INGRESS
        .replace("name: web\nspec", "name: bad\nspec")
        .replace("        pathType: Prefix\n", "");
    let refused = k
        .run_with_input(&["apply", "-f", "-"], &no_path_type)
        .await
        .err();
    assert!(
        refused.contains(r#"The Ingress "bad" is invalid: spec.rules[0].http.paths[0].pathType: Required value: pathType must be specified"#),
        "{refused}"
    );
    let changed = "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata:\n  name: gvisor\nhandler: kata\n";
    let refused = k.run_with_input(&["apply", "-f", "-"], changed).await.err();
    assert!(
        refused.contains(r#"The RuntimeClass "gvisor" is invalid: handler: Invalid value: "kata": field is immutable"#),
        "{refused}"
    );
}
