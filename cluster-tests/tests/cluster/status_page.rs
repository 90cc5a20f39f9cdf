//! The status page on a member's metrics port as a person sees it: headless Chromium loads it
//! from a three-member cluster with the Kubernetes API and one agent, and finds the members and
//! who leads, the node, the charts, no script error; after a member is killed, the next load
//! shows it as unreachable.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cluster_tests::{wait_for, Cluster, Options};

const BOUND: Duration = Duration::from_secs(90);

/// Debian's `chromium`, or the smaller `chromium-headless-shell`.
fn browser() -> PathBuf {
    ["chromium", "chromium-headless-shell"]
        .into_iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        })
        .expect("no chromium on PATH: install Debian's chromium package (.ci/run does)")
}

/// What one headless load printed.
struct Load {
    stdout: String,
    stderr: String,
}

/// Runs headless Chromium on `url` with `args` (a profile of its own under `dir`).
async fn chromium(dir: &Path, url: &str, args: &[&str]) -> Load {
    let out = tokio::time::timeout(
        BOUND,
        tokio::process::Command::new(browser())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--enable-logging=stderr",
                "--v=0",
                // Long enough for the page's script to fetch the page once more and swap it in.
                "--virtual-time-budget=8000",
            ])
            .arg(format!(
                "--user-data-dir={}",
                dir.join("chromium").display()
            ))
            .args(args)
            .arg(url)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium finishes within 90 s")
    .expect("chromium runs");
    let load = Load {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(out.status.success(), "chromium failed: {}", load.stderr);
    load
}

/// The page's DOM after its scripts ran, checked for script errors.
async fn dom(dir: &Path, url: &str) -> String {
    let load = chromium(dir, url, &["--dump-dom"]).await;
    assert!(
        !load.stderr.contains("Uncaught"),
        "the page's script failed:\n{}",
        load.stderr
    );
    let marker = load
        .stdout
        .split("id=\"script-error\"")
        .nth(1)
        .and_then(|rest| rest.split("</div>").next())
        .expect("the page has its script-error marker");
    assert!(
        !marker.contains("Script error"),
        "the page reported a script error: {marker}"
    );
    assert!(
        load.stdout.contains("data-refreshes=\""),
        "the page's script did not refresh it:\n{}",
        load.stdout
    );
    load.stdout
}

/// The `<tr>` of a member on the page.
fn member_row<'a>(dom: &'a str, name: &str) -> &'a str {
    dom.split("<tr ")
        .find(|row| row.starts_with(&format!("data-member=\"{name}\"")))
        .unwrap_or_else(|| panic!("no row for member {name} in:\n{dom}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_members_nodes_and_charts_and_a_killed_member_as_unreachable() {
    let c = Cluster::start(Options {
        kubernetes_api: true,
        agents: 1,
        ..Options::default()
    })
    .await
    .expect("cluster starts");
    c.wait_leader().await;

    // Until the page has everything to show: three members answering, the agent's node
    // Ready, and two samples for a line (one every 10 s).
    let (leader, report) = wait_for(
        "the leader's status page to show three members, a Ready node and two samples",
        BOUND,
        || async {
            let leader = c.leader().await?;
            let json = c.get_metrics_path(leader, "/status.json").await?;
            let report: serde_json::Value = serde_json::from_str(&json).ok()?;
            let members = report["members"].as_array()?;
            let answering = members.iter().filter(|m| m["status"].is_object()).count();
            let ready = report["nodes"]["items"].as_array()?.iter().any(|n| {
                n["name"] == "agent1"
                    && n["conditions"].as_array().is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            });
            let samples = report["samples"].as_array()?.len();
            (members.len() == 3 && answering == 3 && ready && samples >= 2)
                .then_some((leader, report))
        },
    )
    .await;
    assert_eq!(
        report["leader"].as_str(),
        Some(format!("{:x}", c.id_of(leader)).as_str()),
        "{report}"
    );
    let leader_name = &c.members[leader].name;
    let url = format!("http://{}/", c.members[leader].metrics);

    let page = dom(c.path(), &url).await;
    assert_eq!(page.matches("data-member=\"").count(), 3, "{page}");
    assert_eq!(page.matches("data-role=\"leader\"").count(), 1, "{page}");
    assert!(member_row(&page, leader_name).contains("data-role=\"leader\""));
    assert!(page.contains(&format!("data-leader=\"{:x}\"", c.id_of(leader))));
    for m in &c.members {
        assert!(
            member_row(&page, &m.name).contains("data-reachable=\"true\""),
            "{} is not shown as reachable:\n{page}",
            m.name
        );
    }
    assert!(
        page.contains("data-node=\"agent1\" data-ready=\"True\""),
        "{page}"
    );
    for chart in ["proposals", "commit", "fsync"] {
        let svg = page
            .split(&format!("id=\"chart-{chart}\""))
            .nth(1)
            .and_then(|rest| rest.split("</svg>").next())
            .unwrap_or_else(|| panic!("no {chart} chart in:\n{page}"));
        assert!(
            svg.contains("<polyline"),
            "the {chart} chart draws no line: {svg}"
        );
    }
    assert!(page.contains("data-event=\"leader\""), "{page}");
    // The same page at /status.
    let status = c
        .get_metrics_path(leader, "/status")
        .await
        .expect("/status");
    assert!(status.contains("id=\"chart-proposals\""));

    let shot = c.path().join("status-page.png");
    chromium(
        c.path(),
        &url,
        &[
            "--hide-scrollbars",
            "--window-size=1280,1600",
            &format!("--screenshot={}", shot.display()),
        ],
    )
    .await;
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "not a PNG of a page: {} bytes",
        png.len()
    );

    // A follower dies: the leader's next page shows it as unreachable.
    let victim = (leader + 1) % c.members.len();
    let victim_name = &c.members[victim].name;
    c.kill(victim).await;
    let page = dom(c.path(), &url).await;
    let row = member_row(&page, victim_name);
    assert!(
        row.contains("data-reachable=\"false\"") && row.contains(">unreachable<"),
        "{victim_name} is not shown as unreachable: {row}"
    );
    for (i, m) in c.members.iter().enumerate().filter(|(i, _)| *i != victim) {
        assert!(
            member_row(&page, &m.name).contains("data-reachable=\"true\""),
            "member {i} ({}) is shown as unreachable:\n{page}",
            m.name
        );
    }
}
