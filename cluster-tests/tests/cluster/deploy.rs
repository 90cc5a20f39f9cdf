//! deploy/: the compose deployment of three servers and two agents on the machine's Docker
//! engine (an image built from this build's binary, a private network the test makes), driven
//! as an operator would: up, a kubectl workload, a server stopped and removed while the cluster
//! keeps serving.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use cluster_tests::kubectl::Kubectl;
use cluster_tests::{rkube_bin, wait_for};

const BOUND: Duration = Duration::from_secs(120);

/// One compose project: its names, network and image; `down -v` and the image removed when
/// dropped.
struct Deployment {
    project: String,
    prefix: String,
    net: String,
    image: String,
    file: PathBuf,
}

impl Deployment {
    fn compose(&self, args: &[&str]) -> std::process::Output {
        Command::new("docker-compose")
            .arg("-f")
            .arg(&self.file)
            .args(["-p", &self.project])
            .args(args)
            .env("RKUBE_IMAGE", &self.image)
            .env("RKUBE_NET", &self.net)
            .env("RKUBE_PREFIX", &self.prefix)
            .output()
            .expect("docker-compose runs")
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        let _ = self.compose(&["down", "-v", "--timeout", "1"]);
        let _ = Command::new("docker").args(["rmi", &self.image]).output();
    }
}

#[tokio::test]
async fn the_compose_deployment_serves_and_survives_losing_a_server() {
    let tag = format!("{:08x}", rand::random::<u32>());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let d = Deployment {
        project: format!("rkubetest{tag}"),
        prefix: format!("rkt{tag}"),
        // A private /24 of the test's own in 172.29.0.0/16.
        net: format!("172.29.{}", 100 + rand::random::<u8>() % 100),
        image: format!("rkube:test-{tag}"),
        file: root.join("deploy/compose/docker-compose.yml"),
    };
    let built = Command::new(root.join("deploy/build-image.sh"))
        .arg(&d.image)
        .env("RKUBE_BIN", rkube_bin())
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let up = d.compose(&["up", "-d"]);
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    // The admin kubeconfig the first server made, copied out as an operator would.
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = home.path().join("admin.kubeconfig");
    let s1 = format!("{}-s1", d.prefix);
    wait_for("the first server's admin kubeconfig", BOUND, || async {
        Command::new("docker")
            .args(["cp", &format!("{s1}:/data/pki/admin.kubeconfig")])
            .arg(&kubeconfig)
            .output()
            .ok()
            .filter(|o| o.status.success())
    })
    .await;
    let env = home.path().join("env");
    std::fs::write(
        &env,
        format!("export KUBECONFIG={}\n", kubeconfig.display()),
    )
    .unwrap();
    let k = Kubectl::from_env_file(&env, home.path()).unwrap();
    wait_for("both agents' nodes Ready", BOUND, || async {
        let out = k.run(&["get", "nodes", "--no-headers"]).await.stdout;
        (out.lines().filter(|l| l.contains(" Ready ")).count() == 2).then_some(())
    })
    .await;
    let running = |n: usize| {
        let k = &k;
        async move {
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
    };
    k.run(&[
        "create",
        "deployment",
        "web",
        "--image=busybox",
        "--replicas=3",
    ])
    .await
    .ok();
    wait_for("3 pods Running", BOUND, || running(3)).await;

    // The joined servers are learners until they have caught up: only with three voters does
    // losing one leave a quorum, so the operator (and the test) waits for them.
    wait_for("three voting members", BOUND, || async {
        let out = Command::new("docker")
            .args(["exec", &s1, "/bin/rkube", "member", "list"])
            .args(["--endpoints", &format!("https://{}.11:2379", d.net)])
            .args([
                "--cacert",
                "/data/pki/ca.crt",
                "--cert",
                "/data/pki/admin.crt",
            ])
            .args(["--key", "/data/pki/admin.key"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (text
            .lines()
            .filter(|l| l.trim_end().ends_with("false"))
            .count()
            == 3)
            .then_some(())
    })
    .await;

    // The first server stopped and removed: the others elect a leader and keep serving
    // (kubectl now through the second server).
    let stop = d.compose(&["rm", "-s", "-f", "s1"]);
    assert!(
        stop.status.success(),
        "{}",
        String::from_utf8_lossy(&stop.stderr)
    );
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    std::fs::write(
        &kubeconfig,
        text.replace(&format!("{}.11:", d.net), &format!("{}.12:", d.net)),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let out = k
            .run(&[
                "scale",
                "deployment",
                "web",
                "--replicas=5",
                "--request-timeout=10s",
            ])
            .await;
        if out.success {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no scale-up accepted by the remaining servers within {BOUND:?}: {}",
            out.stderr
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    wait_for("5 pods Running", BOUND, || running(5)).await;
}
