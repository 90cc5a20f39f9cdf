//! deploy/: the compose deployment of three servers and two agents on the machine's Docker
//! engine (an image built from this build's binary, private networks the test makes), driven
//! as an operator would: up, a kubectl workload, each server killed in turn while kubectl with
//! the unchanged admin kubeconfig goes on through the control-plane endpoint, a server
//! stopped and removed while the cluster
//! keeps serving and then started again, the leader cut off the network (a new leader takes
//! over, the old one refuses writes, reconnected it catches up), a backup restored into a fresh
//! deployment that holds every key; and the systemd install script, staged into a temp root.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{rkube_bin, wait_for};

const BOUND: Duration = Duration::from_secs(120);
const SERVERS: [&str; 3] = ["s1", "s2", "s3"];

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// Runs a command of the test's own (docker, nsenter); fails the test if it fails.
fn must(cmd: &mut Command) -> String {
    let out = cmd.output().expect("the command runs");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// One compose project: its names, network and image; `down -v` (and the image removed, when
/// this project built it) when dropped.
struct Deployment {
    project: String,
    prefix: String,
    net: String,
    image: String,
    owns_image: bool,
    dir: PathBuf,
}

/// One member as `rkube status -o json` shows it.
#[derive(Debug, Clone)]
struct Member {
    name: String,
    /// The member ID, in hex.
    id: String,
    role: String,
    term: u64,
    applied_index: u64,
}

impl Member {
    fn from_json(row: &serde_json::Value) -> Option<Self> {
        Some(Member {
            name: row["name"].as_str()?.to_string(),
            id: row["id"].as_str()?.to_string(),
            role: row["role"].as_str()?.to_string(),
            term: row["term"].as_u64()?,
            applied_index: row["applied_index"].as_u64()?,
        })
    }
}

impl Deployment {
    /// A project with a random name on a /24 of its own in 172.29.100-199.0/24 (not `avoid`).
    fn new(image: &str, owns_image: bool, avoid: Option<&str>) -> Self {
        let tag = format!("{:08x}", rand::random::<u32>());
        let net = loop {
            let net = format!("172.29.{}", 100 + rand::random::<u8>() % 100);
            if Some(net.as_str()) != avoid {
                break net;
            }
        };
        Deployment {
            project: format!("rkubetest{tag}"),
            prefix: format!("rkt{tag}"),
            net,
            image: image.to_string(),
            owns_image,
            dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose"),
        }
    }

    /// docker-compose with the deployment's file and, when given, more files and variables.
    fn compose_with(&self, files: &[&str], env: &[(&str, &Path)], args: &[&str]) -> Output {
        let mut cmd = Command::new("docker-compose");
        for f in ["docker-compose.yml"].iter().chain(files) {
            cmd.arg("-f").arg(self.dir.join(f));
        }
        cmd.args(["-p", &self.project])
            .args(args)
            .env("RKUBE_IMAGE", &self.image)
            .env("RKUBE_NET", &self.net)
            .env("RKUBE_PREFIX", &self.prefix);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("docker-compose runs")
    }

    fn compose(&self, args: &[&str]) -> Output {
        self.compose_with(&[], &[], args)
    }

    fn must_compose(&self, args: &[&str]) {
        let out = self.compose(args);
        assert!(
            out.status.success(),
            "docker-compose {args:?}: {}",
            text(&out.stderr)
        );
    }

    fn container(&self, server: &str) -> String {
        format!("{}-{server}", self.prefix)
    }

    fn network(&self) -> String {
        format!("{}_rkube", self.project)
    }

    fn ip(&self, server: &str) -> String {
        let n = SERVERS.iter().position(|s| *s == server).expect("a server");
        format!("{}.{}", self.net, 11 + n)
    }

    /// The control-plane endpoint's address (the compose file's `.10`).
    fn endpoint_ip(&self) -> String {
        format!("{}.10", self.net)
    }

    fn client_urls(&self, servers: &[&str]) -> String {
        servers
            .iter()
            .map(|s| format!("https://{}:2379", self.ip(s)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `rkube ARGS` inside a server's container, with the admin's certificate.
    fn rkube(&self, inside: &str, args: &[&str]) -> Output {
        Command::new("docker")
            .args(["exec", &self.container(inside), "/bin/rkube"])
            .args(args)
            .args([
                "--cacert",
                "/data/pki/ca.crt",
                "--cert",
                "/data/pki/admin.crt",
            ])
            .args(["--key", "/data/pki/admin.key"])
            .output()
            .expect("docker exec runs")
    }

    /// `rkube status` of `members`, asked from inside `from`'s container.
    fn status(&self, from: &str, members: &[&str]) -> Option<Vec<Member>> {
        let urls = self.client_urls(members);
        let out = self.rkube(from, &["status", "-o", "json", "--endpoints", &urls]);
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).ok()?;
        rows.iter().map(Member::from_json).collect()
    }

    /// The last `tail` lines a container (a server or agent) logged, under a heading.
    fn logs(&self, name: &str, tail: usize) -> String {
        let c = self.container(name);
        let out = Command::new("docker")
            .args(["logs", "--tail", &tail.to_string(), &c])
            .output()
            .map(|o| format!("{}{}", text(&o.stdout), text(&o.stderr)))
            .unwrap_or_default();
        format!("--- docker logs {c} ---\n{out}")
    }

    /// Waits until the members answer as voters (a leader and followers) and every one of them
    /// has applied what the most advanced one had applied at the look before, and returns them.
    /// The cluster writes all the time (node leases, controllers), so on a busy machine the
    /// members' applied indexes, read one after the other, are seldom within a few entries of
    /// each other at one look; catching up to an earlier look is what "caught up" can promise.
    async fn wait_caught_up(&self, from: &str, members: &[&str]) -> Vec<Member> {
        let deadline = std::time::Instant::now() + BOUND;
        let mut earlier: Option<u64> = None;
        loop {
            let rows = self.status(from, members);
            if let Some(rows) = &rows {
                let leaders = rows.iter().filter(|m| m.role == "leader").count();
                let voters = rows
                    .iter()
                    .filter(|m| m.role == "leader" || m.role == "follower")
                    .count();
                let min = rows.iter().map(|m| m.applied_index).min();
                let max = rows.iter().map(|m| m.applied_index).max();
                let caught_up = matches!((min, earlier), (Some(min), Some(e)) if min >= e);
                if leaders == 1 && voters == members.len() && caught_up {
                    return rows.clone();
                }
                earlier = max;
            }
            if std::time::Instant::now() >= deadline {
                // What each member said last, for the next engineer.
                let logs: Vec<String> = members.iter().map(|m| self.logs(m, 30)).collect();
                panic!(
                    "timed out after {BOUND:?} waiting for {members:?} voting and caught up; \
                     last answer from {from}: {rows:?}\n{}",
                    logs.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until `n` pods of the `web` deployment are Running, as `k` sees them. On timeout
    /// the failure shows what the cluster and every container said, for the next engineer.
    async fn wait_running(&self, k: &Kubectl, n: usize, what: &str) {
        let deadline = std::time::Instant::now() + BOUND;
        while running(k, n).await.is_none() {
            if std::time::Instant::now() >= deadline {
                let mut seen = Vec::new();
                for args in [
                    &["get", "pods", "-o", "wide"][..],
                    &["get", "nodes", "-o", "wide"],
                    &["get", "replicasets", "-o", "wide"],
                    &["get", "events", "--sort-by=.lastTimestamp"],
                ] {
                    let out = k.run(args).await;
                    seen.push(format!(
                        "--- kubectl {} ---\n{}{}",
                        args.join(" "),
                        out.stdout,
                        out.stderr
                    ));
                }
                for c in SERVERS.iter().chain(&["a1", "a2"]) {
                    seen.push(self.logs(c, 40));
                }
                panic!(
                    "timed out after {BOUND:?} waiting for {what}\n{}",
                    seen.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The admin kubeconfig the first server made, copied out as an operator would.
    async fn kubeconfig(&self, dir: &Path) -> (Kubectl, Kubeconfig) {
        let path = dir.join("admin.kubeconfig");
        let s1 = self.container("s1");
        let deadline = std::time::Instant::now() + BOUND;
        loop {
            let copied = Command::new("docker")
                .args(["cp", &format!("{s1}:/data/pki/admin.kubeconfig")])
                .arg(&path)
                .output()
                .expect("docker runs");
            if copied.status.success() {
                break;
            }
            if std::time::Instant::now() > deadline {
                // What the first server and the engine said, for the next engineer.
                let logs = Command::new("docker")
                    .args(["logs", "--tail", "60", &s1])
                    .output();
                let ps = Command::new("docker").args(["ps", "-a"]).output();
                let show = |o: std::io::Result<Output>| {
                    o.map(|o| format!("{}{}", text(&o.stdout), text(&o.stderr)))
                        .unwrap_or_default()
                };
                panic!(
                    "no admin kubeconfig from {s1} within {BOUND:?}: {}\n--- docker logs {s1} ---\n{}\n--- docker ps -a ---\n{}",
                    text(&copied.stderr),
                    show(logs),
                    show(ps)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let env = dir.join("env");
        std::fs::write(&env, format!("export KUBECONFIG={}\n", path.display())).unwrap();
        let original = std::fs::read_to_string(&path).unwrap();
        let k = Kubectl::from_env_file(&env, dir).unwrap();
        // `--init` writes the control-plane endpoint into the admin kubeconfig.
        let endpoint = format!("https://{}:6443", self.endpoint_ip());
        assert!(
            original.contains(&format!("server: {endpoint}\n")),
            "the admin kubeconfig names the endpoint {endpoint}: {original}"
        );
        let kc = Kubeconfig {
            path,
            original,
            first: endpoint,
        };
        (k, kc)
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let _ = self.compose(&["down", "-v", "--timeout", "1"]);
        if self.owns_image {
            let _ = Command::new("docker").args(["rmi", &self.image]).output();
        }
    }
}

/// The admin kubeconfig, pointed at the control-plane endpoint or at one server's API.
struct Kubeconfig {
    path: PathBuf,
    original: String,
    first: String,
}

impl Kubeconfig {
    fn point_at(&self, d: &Deployment, server: &str) {
        let url = format!("https://{}:6443", d.ip(server));
        std::fs::write(&self.path, self.original.replace(&self.first, &url)).unwrap();
    }
}

/// Retries a kubectl command until a server accepts it (a leader may be being elected).
async fn kubectl_until_ok(k: &Kubectl, args: &[&str]) -> String {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let out = k.run(args).await;
        if out.success {
            return out.stdout;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "kubectl {args:?} not accepted within {BOUND:?}: {}",
            out.stderr
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn running(k: &Kubectl, n: usize) -> Option<()> {
    let out = k
        .run(&[
            "get",
            "pods",
            "-l",
            "app=web",
            "--field-selector=status.phase=Running",
            "--no-headers",
        ])
        .await
        .stdout;
    (out.lines().count() == n).then_some(())
}

/// Every key of the store (one per line of `rkube kv get / --prefix --keys-only`).
fn keys(d: &Deployment, inside: &str, rev: Option<i64>) -> BTreeSet<String> {
    let url = d.client_urls(&[inside]);
    let rev = rev.unwrap_or(0).to_string();
    let args = [
        "kv",
        "get",
        "/",
        "--prefix",
        "--keys-only",
        "--rev",
        &rev,
        "--endpoints",
        &url,
    ];
    let out = d.rkube(inside, &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// Who the bearer token authenticates as on the server at `url` (kubectl auth whoami, with no
/// other credentials).
fn whoami(url: &str, ca: &Path, token: &str, home: &Path) -> Output {
    let empty = home.join("empty.kubeconfig");
    std::fs::write(&empty, "apiVersion: v1\nkind: Config\n").unwrap();
    Command::new("kubectl")
        .env("KUBECONFIG", &empty)
        .env("HOME", home)
        .args([
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .args(["--server", url, "--token", token, "--request-timeout=20s"])
        .arg(format!("--certificate-authority={}", ca.display()))
        .output()
        .expect("kubectl runs")
}

#[tokio::test]
async fn the_compose_deployment_survives_losing_a_server_and_a_partition_and_restores_a_backup() {
    // Five containers of servers and agents: a cluster test beside them on two cores would
    // starve into spurious elections (seen in CI: 5 s of split votes at a cluster's start).
    let _turn = cluster_tests::machine_turn();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let image = format!("rkube:test-{:08x}", rand::random::<u32>());
    let d = Deployment::new(&image, true, None);
    let built = Command::new(root.join("deploy/build-image.sh"))
        .arg(&d.image)
        .env("RKUBE_BIN", rkube_bin())
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", text(&built.stderr));
    d.must_compose(&["up", "-d"]);

    let home = tempfile::tempdir().unwrap();
    let (k, kc) = d.kubeconfig(home.path()).await;
    k.wait_nodes_ready(&["a1", "a2"]).await;
    k.run(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=3",
    ])
    .await
    .ok();
    k.run(&["create", "configmap", "settings", "--from-literal=mode=ha"])
        .await
        .ok();
    d.wait_running(&k, 3, "3 pods Running").await;
    // A service account token, signed with the cluster's sa.key: the restored cluster must
    // still accept it.
    let token = k
        .run(&["create", "token", "default", "--duration=2h"])
        .await
        .ok()
        .trim()
        .to_string();
    let ca = home.path().join("ca.crt");
    must(
        Command::new("docker")
            .args(["cp", &format!("{}:/data/pki/ca.crt", d.container("s1"))])
            .arg(&ca),
    );
    let sa = "system:serviceaccount:default:default";
    let who = whoami(
        &format!("https://{}:6443", d.ip("s1")),
        &ca,
        &token,
        home.path(),
    );
    assert_eq!(text(&who.stdout), sa, "{}", text(&who.stderr));

    // The joined servers are learners until they have caught up: only with three voters does
    // losing one leave a quorum, so the operator (and the test) waits for them.
    d.wait_caught_up("s1", &SERVERS).await;

    // The control-plane endpoint: with the kubeconfig as `--init` wrote it, kubectl works again
    // within 3 s of the new leader whichever server is killed — the leader, the next leader
    // (the server the kubeconfig reached after the first failover), then a follower.
    let mut killed: Vec<&str> = Vec::new();
    let mut from = "s1";
    for round in 0..3 {
        let rows = d.wait_caught_up(from, &SERVERS).await;
        let leader = rows
            .iter()
            .find(|m| m.role == "leader")
            .unwrap()
            .name
            .clone();
        let victim = if round < 2 {
            SERVERS.into_iter().find(|s| *s == leader).unwrap()
        } else {
            SERVERS.into_iter().find(|s| !killed.contains(s)).unwrap()
        };
        killed.push(victim);
        let others: Vec<&str> = SERVERS.into_iter().filter(|s| *s != victim).collect();
        from = others[0];
        must(Command::new("docker").args(["kill", "-s", "KILL", &d.container(victim)]));
        if victim == leader {
            wait_for("a new leader among the others", BOUND, || async {
                let rows = d.status(others[0], &others)?;
                rows.into_iter().find(|m| m.role == "leader").map(|_| ())
            })
            .await;
        }
        let since = std::time::Instant::now();
        wait_for("kubectl through the endpoint", BOUND, || async {
            let out = k
                .run(&["get", "ns", "default", "-o", "name", "--request-timeout=2s"])
                .await;
            out.success.then_some(())
        })
        .await;
        let took = since.elapsed();
        eprintln!("killed {victim} (leader {leader}): kubectl through the endpoint after {took:?}");
        assert!(
            took <= Duration::from_secs(3),
            "kubectl through the endpoint took {took:?} after the new leader (killed {victim})"
        );
        must(Command::new("docker").args(["start", &d.container(victim)]));
    }
    assert_eq!(std::fs::read_to_string(&kc.path).unwrap(), kc.original);
    let rows = d.wait_caught_up(from, &SERVERS).await;

    // Leadership handed to another server while the leader lives (etcdctl move-leader): the
    // endpoint moves with it, and the agents, whose watches went through it, keep starting
    // pods: the old holder cuts the connections it accepted there before its address comes off.
    let leader = rows.iter().find(|m| m.role == "leader").unwrap();
    let next = rows.iter().find(|m| m.role == "follower").unwrap();
    for file in ["admin.crt", "admin.key"] {
        must(
            Command::new("docker")
                .args([
                    "cp",
                    &format!("{}:/data/pki/{file}", d.container(&leader.name)),
                ])
                .arg(home.path().join(file)),
        );
    }
    let moved = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://{}:2379", d.ip(&leader.name)))
        .arg(format!("--cacert={}", ca.display()))
        .arg(format!(
            "--cert={}",
            home.path().join("admin.crt").display()
        ))
        .arg(format!("--key={}", home.path().join("admin.key").display()))
        .args(["move-leader", &next.id])
        .output()
        .expect("etcdctl runs");
    assert!(
        moved.status.success(),
        "move-leader: {}",
        text(&moved.stderr)
    );
    wait_for("the new leader", BOUND, || async {
        let rows = d.status(&next.name, &SERVERS)?;
        rows.iter()
            .any(|m| m.name == next.name && m.role == "leader")
            .then_some(())
    })
    .await;
    let since = std::time::Instant::now();
    kubectl_until_ok(&k, &["scale", "deployment", "web", "--replicas=4"]).await;
    d.wait_running(&k, 4, "4 pods Running after the leader moved")
        .await;
    eprintln!(
        "leader moved from {} to {}: 4 pods Running after {:?}",
        leader.name,
        next.name,
        since.elapsed()
    );

    // The first server stopped and removed: the others elect a leader and keep serving
    // (kubectl now through the second server).
    d.must_compose(&["rm", "-s", "-f", "s1"]);
    kc.point_at(&d, "s2");
    kubectl_until_ok(
        &k,
        &[
            "scale",
            "deployment",
            "web",
            "--replicas=5",
            "--request-timeout=10s",
        ],
    )
    .await;
    d.wait_running(&k, 5, "5 pods Running").await;
    // Started again, it comes back from its volume and catches up.
    d.must_compose(&["up", "-d", "s1"]);
    let members = d.wait_caught_up("s2", &SERVERS).await;

    // The leader cut off the network: the other two elect a new leader and take writes.
    let old = members.iter().find(|m| m.role == "leader").unwrap().clone();
    let rest: Vec<&str> = SERVERS.into_iter().filter(|s| *s != old.name).collect();
    kc.point_at(&d, rest[0]);
    let (old_c, old_ip) = (d.container(&old.name), d.ip(&old.name));
    must(Command::new("docker").args(["network", "disconnect", &d.network(), &old_c]));
    let new = wait_for("a new leader among the others", BOUND, || async {
        let rows = d.status(rest[0], &rest)?;
        rows.into_iter()
            .find(|m| m.role == "leader" && m.term > old.term)
    })
    .await;
    eprintln!(
        "{} was leader in term {}; {} leads in term {}",
        old.name, old.term, new.name, new.term
    );
    kubectl_until_ok(
        &k,
        &[
            "create",
            "configmap",
            "while-cut-off",
            "--from-literal=leader-was-cut-off=yes",
        ],
    )
    .await;
    let put = d.rkube(
        rest[0],
        &[
            "kv",
            "put",
            "/deploy/majority",
            "yes",
            "--endpoints",
            &d.client_urls(&rest),
        ],
    );
    assert!(put.status.success(), "{}", text(&put.stderr));

    // The old leader accepts no writes. Its address left with its interface; put back on the
    // loopback of its network namespace, it lets clients inside reach the member's sockets
    // while still no other member can.
    let pid = must(Command::new("docker").args(["inspect", "-f", "{{.State.Pid}}", &old_c]));
    let pid = pid.trim();
    let lo = |verb: &str| {
        must(
            Command::new("nsenter")
                .args(["-t", pid, "-n", "ip", "addr", verb])
                .arg(format!("{old_ip}/32"))
                .args(["dev", "lo"]),
        );
    };
    lo("add");
    let refused = d.rkube(
        &old.name,
        &[
            "kv",
            "put",
            "/deploy/isolated",
            "x",
            "--endpoints",
            &d.client_urls(&[&old.name]),
        ],
    );
    let err = text(&refused.stderr);
    assert!(!refused.status.success(), "the cut-off leader took a write");
    assert!(
        err.contains("no leader") || err.contains("timed out"),
        "the cut-off leader's refusal should say it has no leader: {err}"
    );
    let api = Command::new("nsenter")
        .args(["-t", pid, "-n", "kubectl", "--kubeconfig"])
        .arg(&kc.path)
        .args([
            "--server",
            &format!("https://{old_ip}:6443"),
            "--request-timeout=30s",
        ])
        .args(["create", "configmap", "isolated-write"])
        .output()
        .unwrap();
    assert!(
        !api.status.success(),
        "the cut-off leader's API took a write: {}",
        text(&api.stdout)
    );
    eprintln!(
        "the cut-off leader refused: {err}; its API: {}",
        text(&api.stderr).trim()
    );
    lo("del");

    // Reconnected at its address, it follows the new leader and has what was written meanwhile.
    must(Command::new("docker").args([
        "network",
        "connect",
        "--ip",
        &old_ip,
        "--alias",
        &old.name,
        &d.network(),
        &old_c,
    ]));
    let rows = d.wait_caught_up(&old.name, &SERVERS).await;
    let healed = rows.iter().find(|m| m.name == old.name).unwrap();
    assert_eq!(healed.role, "follower", "{rows:?}");
    assert!(healed.term >= new.term, "{rows:?}");
    wait_for(
        "the reconnected member to apply the majority's write",
        BOUND,
        || async {
            let local = d.rkube(
                &old.name,
                &[
                    "kv",
                    "get",
                    "/deploy/majority",
                    "--serializable",
                    "--endpoints",
                    &d.client_urls(&[&old.name]),
                ],
            );
            (text(&local.stdout) == "/deploy/majority\nyes\n").then_some(())
        },
    )
    .await;
    assert!(!keys(&d, &old.name, None).contains("/deploy/isolated"));
    let gone = k.run(&["get", "configmap", "isolated-write"]).await.err();
    assert!(
        gone.contains("NotFound") || gone.contains("not found"),
        "{gone}"
    );

    // A backup, as deploy/README.md takes it: a snapshot from one member, and the CA and
    // service-account keys.
    let from = rest[0];
    let saved = d.rkube(
        from,
        &[
            "snapshot",
            "save",
            "/data/snapshot.db",
            "--endpoints",
            &d.client_urls(&[from]),
        ],
    );
    assert!(saved.status.success(), "{}", text(&saved.stderr));
    let backup = tempfile::tempdir().unwrap();
    std::fs::create_dir(backup.path().join("pki")).unwrap();
    let cp = |src: String, dst: PathBuf| {
        must(Command::new("docker").args(["cp", &src]).arg(dst));
    };
    cp(
        format!("{}:/data/snapshot.db", d.container(from)),
        backup.path().join("snapshot.db"),
    );
    for f in ["ca.crt", "ca.key", "sa.key"] {
        cp(
            format!("{}:/data/pki/{f}", d.container(from)),
            backup.path().join("pki").join(f),
        );
    }
    let status: serde_json::Value = serde_json::from_str(&must(
        Command::new(rkube_bin())
            .args(["snapshot", "status", "-o", "json"])
            .arg(backup.path().join("snapshot.db")),
    ))
    .unwrap();
    let rev = status["revision"].as_i64().unwrap();
    let saved_keys = keys(&d, from, Some(rev));
    assert_eq!(
        status["totalKey"].as_u64(),
        Some(saved_keys.len() as u64),
        "the snapshot at revision {rev} should hold every key the cluster had then"
    );
    assert!(saved_keys.contains("/registry/configmaps/default/while-cut-off"));

    // Restored into a fresh deployment: its own network and volumes, the first server's data
    // dir made from the snapshot and its PKI from the backup's keys, the others joining it.
    let d2 = Deployment::new(&image, false, Some(&d.net));
    let restored = d2.compose_with(
        &["restore.yml"],
        &[("RKUBE_BACKUP", backup.path())],
        &["run", "--rm", "restore"],
    );
    assert!(restored.status.success(), "{}", text(&restored.stderr));
    let said = text(&restored.stdout);
    assert!(
        said.contains(&format!(
            "restored {} keys at revision {rev}",
            saved_keys.len()
        )),
        "{said}"
    );
    d2.must_compose(&["up", "--no-start"]);
    cp(
        backup.path().join("pki").display().to_string(),
        PathBuf::from(format!("{}:/data/pki", d2.container("s1"))),
    );
    d2.must_compose(&["up", "-d"]);
    let home2 = tempfile::tempdir().unwrap();
    let (k2, _) = d2.kubeconfig(home2.path()).await;
    d2.wait_caught_up("s1", &SERVERS).await;
    // Every saved key is there; a member's own EndpointSlice for the kubernetes Service
    // (kubernetes-<member>) is taken out by the leader while that member is not yet back in
    // the restored cluster, and comes back once it is.
    let mut missing: Vec<String> = Vec::new();
    let held = tokio::time::timeout(BOUND, async {
        loop {
            let now = keys(&d2, "s1", None);
            missing = saved_keys.difference(&now).cloned().collect();
            if missing.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    assert!(held.is_ok(), "the restored cluster lacks {missing:?}");
    k2.wait_nodes_ready(&["a1", "a2"]).await;
    d2.wait_running(&k2, 5, "the restored 5 pods Running").await;
    let mode = k2
        .run(&[
            "get",
            "configmap",
            "settings",
            "-o",
            "jsonpath={.data.mode}",
        ])
        .await
        .ok();
    assert_eq!(mode, "ha");
    k2.run(&["get", "configmap", "while-cut-off"]).await.ok();
    // The same CA and service-account key: the old cluster's token is good here too.
    let who = whoami(
        &format!("https://{}:6443", d2.ip("s1")),
        &ca,
        &token,
        home2.path(),
    );
    assert_eq!(text(&who.stdout), sa, "{}", text(&who.stderr));
    k2.run(&["scale", "deployment", "web", "--replicas=2"])
        .await
        .ok();
    d2.wait_running(&k2, 2, "the restored cluster scaled down to 2 pods")
        .await;
}

/// deploy/systemd/install.sh staged into a temp root as a packager would (`--destdir`): the
/// binary, both units (checked by `systemd-analyze verify` where it exists), the settings
/// files written once and kept on a second run, and bad input refused before anything is
/// written.
#[test]
fn the_systemd_install_script_stages_a_host_and_refuses_bad_input() {
    use std::os::unix::fs::PermissionsExt;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/install.sh");
    let install = |dest: &Path, args: &[&str]| {
        Command::new(&script)
            .arg("--destdir")
            .arg(dest)
            .arg("--bin")
            .arg(rkube_bin())
            .args(args)
            .output()
            .expect("install.sh runs")
    };
    let host = [
        "server",
        "agent",
        "--name",
        "n1",
        "--address",
        "10.0.0.1",
        "--init",
        "--servers",
        "https://10.0.0.1:6443,https://10.0.0.2:6443",
    ];
    let dest = tempfile::tempdir().unwrap();
    let d = dest.path();
    let first = install(d, &host);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let mode = |p: &str| std::fs::metadata(d.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(
        std::fs::metadata(d.join("usr/local/bin/rkube"))
            .unwrap()
            .len(),
        std::fs::metadata(rkube_bin()).unwrap().len()
    );
    assert_eq!(mode("usr/local/bin/rkube"), 0o755);
    for (path, want) in [
        ("etc/rkube/server.env", 0o600),
        ("etc/rkube/agent.env", 0o600),
        ("etc/rkube/pki", 0o700),
        ("var/lib/rkube/server", 0o700),
        ("var/lib/rkube/agent", 0o700),
        ("etc/systemd/system/rkube-server.service", 0o644),
        ("etc/systemd/system/rkube-agent.service", 0o644),
    ] {
        assert_eq!(mode(path), want, "{path}");
    }
    let server_env = std::fs::read_to_string(d.join("etc/rkube/server.env")).unwrap();
    for line in [
        "RKUBE_NAME=n1",
        "RKUBE_ADDRESS=10.0.0.1",
        "RKUBE_SERVER_ARGS=--init --join-file /etc/rkube/join.json",
    ] {
        assert!(
            server_env.lines().any(|l| l == line),
            "{line} not in:\n{server_env}"
        );
    }
    let agent_env = std::fs::read_to_string(d.join("etc/rkube/agent.env")).unwrap();
    for line in [
        "RKUBE_SERVERS=https://10.0.0.1:6443,https://10.0.0.2:6443",
        "RKUBE_AGENT_ARGS=--join-from /etc/rkube/join.json",
    ] {
        assert!(
            agent_env.lines().any(|l| l == line),
            "{line} not in:\n{agent_env}"
        );
    }

    // Run again after the operator edited a setting: nothing changes, the edit stays.
    let edited = server_env.replace("RKUBE_NAME=n1", "RKUBE_NAME=n9");
    std::fs::write(d.join("etc/rkube/server.env"), &edited).unwrap();
    let again = install(d, &host);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).contains("nothing changed"),
        "{}",
        text(&again.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(d.join("etc/rkube/server.env")).unwrap(),
        edited
    );

    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        // The units' dependencies (network-online.target, ...) come from the machine's unit dir.
        for dir in ["/usr/lib/systemd/system", "/lib/systemd/system"] {
            if Path::new(dir).join("sysinit.target").exists() {
                std::fs::create_dir_all(d.join("usr/lib/systemd")).unwrap();
                must(
                    Command::new("cp")
                        .args(["-a", dir])
                        .arg(d.join("usr/lib/systemd/system")),
                );
                break;
            }
        }
        let verify = Command::new("systemd-analyze")
            .arg(format!("--root={}", d.display()))
            .args(["verify", "/etc/systemd/system/rkube-server.service"])
            .arg("/etc/systemd/system/rkube-agent.service")
            .output()
            .unwrap();
        assert!(
            verify.status.success() && verify.stderr.is_empty(),
            "systemd-analyze verify: {}",
            text(&verify.stderr)
        );
    }

    for (args, says) in [
        (
            &["server", "--address", "10.0.0.256"][..],
            "not an IPv4 address",
        ),
        (&["server"][..], "needs this host's --address"),
        (&["agent", "--address", "10.0.0.5"][..], "needs --servers"),
        (
            &["agent", "--address", "10.0.0.5", "--servers", "http://x"][..],
            "not an API server URL",
        ),
        (&["agent", "--init"][..], "goes with the server role"),
        (
            &["server", "--init", "--join-from", "f"][..],
            "exclude each other",
        ),
        (
            &["server", "--name", "No_Good", "--address", "10.0.0.5"][..],
            "not a valid node name",
        ),
        (
            &["server", "--frobnicate"][..],
            "unknown option --frobnicate",
        ),
        (&["worker"][..], "unknown role 'worker'"),
        (&[][..], "no role given"),
    ] {
        let dest = tempfile::tempdir().unwrap();
        let out = install(dest.path(), args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            std::fs::read_dir(dest.path()).unwrap().count(),
            0,
            "{args:?} wrote files before refusing"
        );
    }
}
