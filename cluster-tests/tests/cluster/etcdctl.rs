//! etcdctl 3.4 (Debian's etcd-client, which `.ci/run` installs) against a three-member cluster,
//! with only the variables `rkube up` writes to DIR/env. Every command's output is checked
//! against what etcd prints for it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cluster_tests::{wait_for, Etcdctl};

use super::common::{b64, json, started_cluster};

/// The `"Name" : value` lines of `-w fields`, values unquoted.
fn fields(out: &str) -> BTreeMap<String, String> {
    out.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(" : ")?;
            Some((
                name.trim_matches('"').to_string(),
                value.trim().trim_matches('"').to_string(),
            ))
        })
        .collect()
}

/// Puts a key with `-w json` and returns the revision of the write.
async fn etcdctl_put(etcdctl: &Etcdctl, key: &str, value: &str) -> i64 {
    json(&etcdctl.ok(&["put", key, value, "-w", "json"]).await)["header"]["revision"]
        .as_i64()
        .expect("a put answers with the revision it wrote")
}

/// The simple output of `get` for these key/value pairs.
fn kv_lines(kvs: &[(&str, &str)]) -> String {
    kvs.iter().map(|(k, v)| format!("{k}\n{v}\n")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_put_get_delete_and_compaction() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    assert_eq!(etcdctl.endpoints().len(), 3, "DIR/env names every member");

    assert_eq!(
        etcdctl
            .ok(&["put", "/registry/minions/node-1", "node"])
            .await,
        "OK\n"
    );
    let nginx_v1 = etcdctl_put(&etcdctl, "/registry/pods/default/nginx", "nginx-v1").await;
    etcdctl_put(&etcdctl, "/registry/pods/default/web", "web").await;
    etcdctl_put(&etcdctl, "/registry/pods/kube-system/dns", "dns").await;
    assert_eq!(
        etcdctl
            .ok(&[
                "put",
                "/registry/pods/default/nginx",
                "nginx-v2",
                "--prev-kv"
            ])
            .await,
        "OK\n/registry/pods/default/nginx\nnginx-v1\n",
        "put --prev-kv prints the value it replaced"
    );
    let pods = [
        ("/registry/pods/default/nginx", "nginx-v2"),
        ("/registry/pods/default/web", "web"),
        ("/registry/pods/kube-system/dns", "dns"),
    ];

    assert_eq!(
        etcdctl.ok(&["get", "/registry/pods/", "--prefix"]).await,
        kv_lines(&pods)
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/", "--prefix", "--keys-only"])
            .await,
        "/registry/minions/node-1\n\n/registry/pods/default/nginx\n\n\
         /registry/pods/default/web\n\n/registry/pods/kube-system/dns\n\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/pods/", "--prefix", "--limit=2"])
            .await,
        kv_lines(&pods[..2])
    );
    assert_eq!(
        etcdctl
            .ok(&[
                "get",
                "/registry/pods/default/nginx",
                &format!("--rev={nginx_v1}")
            ])
            .await,
        "/registry/pods/default/nginx\nnginx-v1\n",
        "get --rev reads the value as of that revision"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/pods/", "--prefix", "--print-value-only"])
            .await,
        "nginx-v2\nweb\ndns\n"
    );
    assert_eq!(
        etcdctl
            .ok(&[
                "get",
                "/registry/pods/default/web",
                "--from-key",
                "--keys-only"
            ])
            .await,
        "/registry/pods/default/web\n\n/registry/pods/kube-system/dns\n\n"
    );

    let latest = json(
        &etcdctl
            .ok(&["get", "/registry/minions/node-1", "-w", "json"])
            .await,
    )["header"]["revision"]
        .as_i64()
        .expect("header revision");
    let page = json(
        &etcdctl
            .ok(&[
                "get",
                "/registry/pods/",
                "--prefix",
                "--limit=1",
                "-w",
                "json",
            ])
            .await,
    );
    assert_eq!(page["header"]["revision"].as_i64(), Some(latest), "{page}");
    assert_eq!(page["count"].as_i64(), Some(3), "{page}");
    assert_eq!(page["more"].as_bool(), Some(true), "{page}");
    let kvs = page["kvs"].as_array().expect("kvs");
    assert_eq!(kvs.len(), 1, "{page}");
    assert_eq!(
        kvs[0]["key"].as_str(),
        Some(b64("/registry/pods/default/nginx").as_str())
    );
    assert_eq!(kvs[0]["value"].as_str(), Some(b64("nginx-v2").as_str()));
    assert_eq!(kvs[0]["create_revision"].as_i64(), Some(nginx_v1));
    assert_eq!(kvs[0]["mod_revision"].as_i64(), Some(latest));
    assert_eq!(kvs[0]["version"].as_i64(), Some(2));

    let f = fields(
        &etcdctl
            .ok(&["get", "/registry/pods/default/nginx", "-w", "fields"])
            .await,
    );
    for (name, value) in [
        ("Key", "/registry/pods/default/nginx".to_string()),
        ("Value", "nginx-v2".to_string()),
        ("CreateRevision", nginx_v1.to_string()),
        ("ModRevision", latest.to_string()),
        ("Version", "2".to_string()),
        ("Lease", "0".to_string()),
        ("Revision", latest.to_string()),
        ("Count", "1".to_string()),
        ("More", "false".to_string()),
    ] {
        assert_eq!(f.get(name), Some(&value), "field {name} in {f:?}");
    }
    assert_eq!(f.get("ClusterID").map(|id| id != "0"), Some(true), "{f:?}");

    assert_eq!(
        etcdctl
            .ok(&["del", "/registry/pods/default/", "--prefix", "--prev-kv"])
            .await,
        format!("2\n{}", kv_lines(&pods[..2])),
        "del --prev-kv prints the count, then each deleted key and value"
    );
    assert_eq!(
        etcdctl
            .ok(&["del", "/registry/pods/default/", "--prefix"])
            .await,
        "0\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/", "--prefix", "--keys-only"])
            .await,
        "/registry/minions/node-1\n\n/registry/pods/kube-system/dns\n\n"
    );
    assert_eq!(
        etcdctl.fails(&["put", "", "x"]).await,
        "etcdserver: key is not provided"
    );

    let head = etcdctl_put(&etcdctl, "/registry/minions/node-1", "node-v2").await;
    assert_eq!(
        etcdctl.ok(&["compaction", &head.to_string()]).await,
        format!("compacted revision {head}\n")
    );
    assert_eq!(
        etcdctl
            .fails(&[
                "get",
                "/registry/pods/default/nginx",
                &format!("--rev={nginx_v1}")
            ])
            .await,
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/registry/minions/node-1", &format!("--rev={head}")])
            .await,
        "/registry/minions/node-1\nnode-v2\n",
        "the compaction revision itself stays readable"
    );
    assert_eq!(
        etcdctl
            .fails(&["compaction", &(head - 1).to_string()])
            .await,
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        etcdctl
            .fails(&["compaction", &(head + 1000).to_string()])
            .await,
        "etcdserver: mvcc: required revision is a future revision"
    );
    assert_eq!(
        etcdctl
            .fails(&[
                "get",
                "/registry/",
                "--prefix",
                &format!("--rev={}", head + 1000)
            ])
            .await,
        "etcdserver: mvcc: required revision is a future revision"
    );
}

/// Lines a watch prints for one event: its type, then (with --prev-kv) the previous key and
/// value, then the key and value (empty for a delete).
fn event_lines(kind: &str, prev: Option<(&str, &str)>, kv: (&str, &str)) -> Vec<String> {
    let mut lines = vec![kind.to_string()];
    if let Some((k, v)) = prev {
        lines.extend([k.to_string(), v.to_string()]);
    }
    lines.extend([kv.0.to_string(), kv.1.to_string()]);
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_replays_from_a_revision_then_follows() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let first = etcdctl_put(&etcdctl, "/w/a", "1").await;
    etcdctl_put(&etcdctl, "/w/b", "2").await;
    let a3 = etcdctl_put(&etcdctl, "/w/a", "3").await;
    assert_eq!(etcdctl.ok(&["del", "/w/b"]).await, "1\n");

    let watch = etcdctl.spawn(&[
        "watch",
        "/w",
        "--prefix",
        &format!("--rev={first}"),
        "--prev-kv",
    ]);
    let mut expected: Vec<String> = [
        event_lines("PUT", None, ("/w/a", "1")),
        event_lines("PUT", None, ("/w/b", "2")),
        event_lines("PUT", Some(("/w/a", "1")), ("/w/a", "3")),
        event_lines("DELETE", Some(("/w/b", "2")), ("/w/b", "")),
    ]
    .concat();
    assert_eq!(
        watch
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected,
        "the history since --rev, with previous values"
    );
    // Replayed history means the watch is in place: new events follow. The key outside the
    // prefix is written first, so it would show before /w/c if it were wrongly sent.
    etcdctl.ok(&["put", "/x/outside", "9"]).await;
    etcdctl.ok(&["put", "/w/c", "4"]).await;
    expected.extend(event_lines("PUT", None, ("/w/c", "4")));
    assert_eq!(
        watch
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected
    );
    watch.stop().await;

    // One key, from a later revision, without previous values.
    let single = etcdctl.spawn(&["watch", "/w/a", &format!("--rev={a3}")]);
    let mut expected = event_lines("PUT", None, ("/w/a", "3"));
    assert_eq!(
        single
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected
    );
    etcdctl.ok(&["put", "/w/b", "5"]).await;
    assert_eq!(etcdctl.ok(&["del", "/w/a"]).await, "1\n");
    expected.extend(event_lines("DELETE", None, ("/w/a", "")));
    assert_eq!(
        single
            .wait_lines(expected.len(), Duration::from_secs(30))
            .await,
        expected,
        "a watch on one key sees only that key"
    );
    single.stop().await;

    // Past history that was compacted away: every member cancels the watch and etcdctl says
    // why. etcdctl's requests go round the members, so each member is asked on its own once
    // it has applied the compaction (a follower applies it a moment after the member that
    // answered it).
    let head = etcdctl_put(&etcdctl, "/w/d", "6").await;
    etcdctl.ok(&["compaction", &head.to_string()]).await;
    for endpoint in etcdctl.endpoints() {
        let member = etcdctl.with_endpoint(&endpoint);
        wait_for(
            &format!("{endpoint} to apply the compaction"),
            Duration::from_secs(30),
            || async {
                let old = member
                    .run(&["get", "/w/a", &format!("--rev={first}"), "--consistency=s"])
                    .await;
                old.stderr.contains("compacted").then_some(())
            },
        )
        .await;
        let out = member
            .run(&["watch", "/w", "--prefix", &format!("--rev={first}")])
            .await;
        assert!(!out.success, "{endpoint}: {out:?}");
        assert!(
            out.stderr.contains(
                "watch was canceled (etcdserver: mvcc: required revision has been compacted)"
            ),
            "{endpoint}: {out:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_txn_runs_the_branch_its_compares_choose() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let flag = etcdctl_put(&etcdctl, "/txn/flag", "on").await;
    etcdctl.ok(&["put", "/txn/a", "1"]).await;
    etcdctl.ok(&["put", "/txn/b", "2"]).await;
    let txn = |input: String| {
        let etcdctl = etcdctl.clone();
        async move {
            let out = etcdctl
                .run_with_input(&["txn", "--interactive=false"], &input)
                .await;
            assert!(out.success, "txn {input:?} failed: {out:?}");
            out.stdout
        }
    };

    // compares, blank line, success ops, blank line, failure ops, blank line.
    assert_eq!(
        txn("value(\"/txn/flag\") = \"on\"\n\nput /txn/result yes\nget /txn/flag\n\nput /txn/result no\n\n".into()).await,
        "SUCCESS\n\nOK\n\n/txn/flag\non\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/txn/result", "--print-value-only"])
            .await,
        "yes\n"
    );
    assert_eq!(
        txn(format!("mod(\"/txn/flag\") > \"{flag}\"\n\nput /txn/result yes\n\nput /txn/result no\nget /txn/a\n\n")).await,
        "FAILURE\n\nOK\n\n/txn/a\n1\n"
    );
    assert_eq!(
        etcdctl
            .ok(&["get", "/txn/result", "--print-value-only"])
            .await,
        "no\n"
    );
    // Several compares must all hold; here the second does not.
    assert_eq!(
        txn(format!("create(\"/txn/flag\") = \"{flag}\"\nversion(\"/txn/a\") = \"2\"\n\nput /txn/result both\n\ndel /txn/result\n\n")).await,
        "FAILURE\n\n1\n"
    );
    let resp = json(&{
        let out = etcdctl
            .run_with_input(
                &["txn", "--interactive=false", "-w", "json"],
                "version(\"/txn/a\") = \"1\"\nvalue(\"/txn/b\") != \"9\"\n\ndel /txn --prefix\n\n\n",
            )
            .await;
        assert!(out.success, "{out:?}");
        out.stdout
    });
    assert_eq!(resp["succeeded"].as_bool(), Some(true), "{resp}");
    assert_eq!(
        resp["responses"][0]["Response"]["ResponseDeleteRange"]["deleted"].as_i64(),
        Some(3),
        "{resp}"
    );
    assert_eq!(etcdctl.ok(&["get", "/txn", "--prefix"]).await, "");

    let out = etcdctl
        .run_with_input(
            &["txn", "--interactive=false"],
            "\nput /txn/dup 1\nput /txn/dup 2\n\n\n",
        )
        .await;
    assert_eq!(
        out.error(),
        Some("etcdserver: duplicate key given in txn request"),
        "{out:?}"
    );
}

/// The hexadecimal lease ID in `lease <id> granted with TTL(...)`.
fn granted_lease(out: &str) -> String {
    let id = out
        .strip_prefix("lease ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("not a lease grant: {out}"));
    assert!(
        id.chars().all(|ch| ch.is_ascii_hexdigit()),
        "not a lease grant: {out}"
    );
    id.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_leases_keep_alive_list_revoke_and_expire() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let out = etcdctl.ok(&["lease", "grant", "60"]).await;
    let id = granted_lease(&out);
    assert_eq!(out, format!("lease {id} granted with TTL(60s)\n"));
    let decimal = i64::from_str_radix(&id, 16).expect("hex lease id");
    for key in ["/lease/a", "/lease/b"] {
        assert_eq!(
            etcdctl
                .ok(&["put", key, "x", &format!("--lease={id}")])
                .await,
            "OK\n"
        );
    }
    assert_eq!(
        fields(&etcdctl.ok(&["get", "/lease/a", "-w", "fields"]).await).get("Lease"),
        Some(&decimal.to_string())
    );
    assert_eq!(
        etcdctl.ok(&["lease", "keep-alive", "--once", &id]).await,
        format!("lease {id} keepalived with TTL(60)\n")
    );
    let ttl = etcdctl.ok(&["lease", "timetolive", &id, "--keys"]).await;
    let remaining: i64 = ttl
        .strip_prefix(&format!("lease {id} granted with TTL(60s), remaining("))
        .and_then(|rest| rest.split_once("s), attached keys([/lease/a /lease/b])\n"))
        .filter(|(_, tail)| tail.is_empty())
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected timetolive output: {ttl}"));
    assert!((50..=60).contains(&remaining), "{ttl}");
    let list = etcdctl.ok(&["lease", "list"]).await;
    assert_eq!(list, format!("found 1 leases\n{id}\n"));

    assert_eq!(
        etcdctl.ok(&["lease", "revoke", &id]).await,
        format!("lease {id} revoked\n")
    );
    assert_eq!(
        etcdctl.ok(&["get", "/lease/", "--prefix"]).await,
        "",
        "revoking a lease deletes its keys"
    );
    assert_eq!(
        etcdctl.ok(&["lease", "timetolive", &id]).await,
        format!("lease {id} already expired\n")
    );
    assert_eq!(
        etcdctl.fails(&["lease", "keep-alive", "--once", &id]).await,
        "etcdserver: requested lease not found"
    );
    assert_eq!(
        etcdctl.fails(&["lease", "revoke", &id]).await,
        "failed to revoke lease (etcdserver: requested lease not found)"
    );
    assert_eq!(
        etcdctl
            .fails(&["put", "/lease/c", "x", &format!("--lease={id}")])
            .await,
        "etcdserver: requested lease not found"
    );
    assert_eq!(
        etcdctl.fails(&["lease", "grant", "9999999999"]).await,
        "failed to grant lease (etcdserver: too large lease TTL)"
    );

    // A lease nobody keeps alive expires and takes its keys with it.
    let short = granted_lease(&etcdctl.ok(&["lease", "grant", "3"]).await);
    etcdctl
        .ok(&["put", "/lease/short", "x", &format!("--lease={short}")])
        .await;
    wait_for(
        "the unrenewed lease's key to be deleted",
        Duration::from_secs(30),
        || async {
            etcdctl
                .ok(&["get", "/lease/short", "--keys-only"])
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        etcdctl.ok(&["lease", "timetolive", &short]).await,
        format!("lease {short} already expired\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_member_list_add_promote_and_remove_a_learner() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    let started: BTreeSet<String> = (0..3)
        .map(|i| {
            let m = &c.members[i];
            format!(
                "{:x}, started, {}, https://{}, https://{}, false",
                c.id_of(i),
                m.name,
                m.peer,
                m.client
            )
        })
        .collect();
    let list = |out: String| -> BTreeSet<String> { out.lines().map(str::to_string).collect() };
    // Each member publishes its name and client URL once it has joined: wait for all three.
    wait_for(
        "every member to publish its attributes",
        Duration::from_secs(30),
        || async { (list(etcdctl.ok(&["member", "list"]).await) == started).then_some(()) },
    )
    .await;

    // A learner that is never started: the spare port slot after the last member.
    let port = c.members[2]
        .peer
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .expect("peer port");
    let peer_url = format!("https://127.0.0.1:{}", port + 10);
    let out = etcdctl
        .ok(&[
            "member",
            "add",
            "n9",
            &format!("--peer-urls={peer_url}"),
            "--learner",
        ])
        .await;
    let (first, rest) = out.split_once('\n').expect("several lines");
    let words: Vec<&str> = first.split_whitespace().collect();
    assert!(
        words.len() == 6 && words[0] == "Member" && words[2..5] == ["added", "to", "cluster"],
        "{out}"
    );
    let id = words[1].to_string();
    let cluster_id = u64::from_str_radix(words[5], 16).expect("hex cluster id");
    assert_eq!(
        json(&etcdctl.ok(&["member", "list", "-w", "json"]).await)["header"]["cluster_id"].as_u64(),
        Some(cluster_id)
    );
    assert!(rest.contains("\nETCD_NAME=\"n9\"\n"), "{out}");
    assert!(
        rest.contains(&format!("n9={peer_url}"))
            && (0..3).all(|i| rest.contains(&format!(
                "{}=https://{}",
                c.members[i].name, c.members[i].peer
            ))),
        "ETCD_INITIAL_CLUSTER names every member: {out}"
    );
    assert!(
        rest.contains(&format!("ETCD_INITIAL_ADVERTISE_PEER_URLS=\"{peer_url}\""))
            && rest.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{out}"
    );
    let mut with_learner = started.clone();
    with_learner.insert(format!("{id}, unstarted, , {peer_url}, , true"));
    assert_eq!(list(etcdctl.ok(&["member", "list"]).await), with_learner);

    assert_eq!(
        etcdctl.fails(&["member", "promote", &id]).await,
        "etcdserver: can only promote a learner member which is in sync with leader"
    );
    assert_eq!(
        etcdctl.ok(&["member", "remove", &id]).await,
        // etcd prints both IDs with %16x: right-aligned, space-padded.
        format!(
            "Member {:16x} removed from cluster {cluster_id:16x}\n",
            u64::from_str_radix(&id, 16).expect("hex member id")
        )
    );
    assert_eq!(list(etcdctl.ok(&["member", "list"]).await), started);
    assert_eq!(
        etcdctl.fails(&["member", "remove", &id]).await,
        "etcdserver: member not found"
    );
    assert_eq!(
        etcdctl.fails(&["member", "promote", &id]).await,
        "etcdserver: member not found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_endpoint_status_health_and_hashkv_cover_the_cluster() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    for n in 0..10 {
        etcdctl.ok(&["put", &format!("/e/{n}"), "x"]).await;
    }
    let leader = c.wait_leader().await;
    let client_url = |i: usize| format!("https://{}", c.members[i].client);
    let all_urls: BTreeSet<String> = (0..3).map(client_url).collect();

    // endpoint, ID, version, db size, is leader, is learner, raft term, raft index,
    // raft applied index, errors
    let status = etcdctl.ok(&["endpoint", "status", "--cluster"]).await;
    let rows: Vec<Vec<&str>> = status.lines().map(|l| l.split(", ").collect()).collect();
    assert_eq!(rows.len(), 3, "{status}");
    let mut urls = BTreeSet::new();
    for row in &rows {
        assert_eq!(row.len(), 10, "{status}");
        let i = (0..3)
            .find(|&i| row[0] == client_url(i))
            .unwrap_or_else(|| panic!("unknown endpoint in {status}"));
        urls.insert(row[0].to_string());
        assert_eq!(row[1], format!("{:x}", c.id_of(i)), "{status}");
        assert!(!row[2].is_empty(), "a version: {status}");
        assert_eq!(
            row[4],
            if i == leader { "true" } else { "false" },
            "{status}"
        );
        assert_eq!(row[5], "false", "no learners: {status}");
        assert!(row[7].parse::<u64>().is_ok_and(|n| n > 0), "{status}");
        assert_eq!(row[9], "", "no errors: {status}");
    }
    assert_eq!(urls, all_urls, "{status}");
    let statuses = json(
        &etcdctl
            .ok(&["endpoint", "status", "--cluster", "-w", "json"])
            .await,
    );
    let leaders: BTreeSet<u64> = statuses
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| s["Status"]["leader"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        leaders,
        BTreeSet::from([c.id_of(leader)]),
        "every member names the same leader: {statuses}"
    );

    let health = etcdctl.run(&["endpoint", "health", "--cluster"]).await;
    assert!(health.success, "{health:?}");
    // etcdctl 3.4 reports health on stderr.
    let healthy: BTreeSet<String> = format!("{}{}", health.stdout, health.stderr)
        .lines()
        .filter_map(|l| {
            l.split_once(" is healthy: successfully committed proposal: took = ")
                .map(|(url, _)| url.to_string())
        })
        .collect();
    assert_eq!(healthy, all_urls, "{health:?}");

    let revision = c.wait_converged(&[0, 1, 2]).await;
    let hashkv = etcdctl.ok(&["endpoint", "hashkv", "--cluster"]).await;
    let hashes: BTreeMap<String, u32> = hashkv
        .lines()
        .filter_map(|l| {
            let (url, hash) = l.split_once(", ")?;
            Some((url.to_string(), hash.parse().ok()?))
        })
        .collect();
    assert_eq!(
        hashes.keys().cloned().collect::<BTreeSet<_>>(),
        all_urls,
        "{hashkv}"
    );
    let distinct: BTreeSet<u32> = hashes.values().copied().collect();
    assert_eq!(distinct.len(), 1, "members disagree: {hashkv}");
    assert_eq!(
        distinct.first().copied(),
        c.hash_kv(0, revision).await,
        "etcdctl shows the HashKV at the current revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_snapshot_save_writes_a_backup_rkube_reads() {
    let c = started_cluster().await;
    let etcdctl = c.etcdctl();
    for n in 0..20 {
        etcdctl.ok(&["put", &format!("/s/{n:02}"), "x"]).await;
    }
    let revision = c.wait_converged(&[0, 1, 2]).await;
    // etcdctl takes a snapshot from exactly one endpoint.
    let first = etcdctl.endpoints()[0].clone();
    let one = etcdctl.with_endpoint(&first);
    let file = c.path().join("etcdctl.snap");
    let file_s = file.to_string_lossy().into_owned();
    let out = one.run(&["snapshot", "save", &file_s]).await;
    assert!(out.success, "snapshot save failed: {out:?}");
    assert_eq!(out.stdout, format!("Snapshot saved at {file_s}\n"));
    let len = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    assert!(len > 0, "the snapshot file is missing or empty");
    // etcd's snapshot format: etcdctl reads the file it saved.
    let etcd_status = json(&one.ok(&["snapshot", "status", &file_s, "-w", "json"]).await);
    assert_eq!(
        etcd_status["revision"].as_i64(),
        Some(revision),
        "{etcd_status}"
    );
    assert_eq!(
        etcd_status["totalSize"].as_u64(),
        Some(len - 32),
        "{etcd_status}"
    );

    let status = std::process::Command::new(cluster_tests::rkube_bin())
        .args(["snapshot", "status", &file_s, "-o", "json"])
        .output()
        .expect("rkube runs");
    assert!(
        status.status.success(),
        "rkube cannot read etcdctl's snapshot: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status = json(&String::from_utf8_lossy(&status.stdout));
    assert_eq!(status["revision"].as_i64(), Some(revision), "{status}");
    assert_eq!(status["totalKey"].as_u64(), Some(20), "{status}");
}
