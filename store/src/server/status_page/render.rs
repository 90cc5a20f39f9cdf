//! The page as HTML: its style and refresh script, the header, the members, the nodes and the
//! events (the charts are `chart.rs`'s).

use std::collections::HashMap;
use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::chart::render_charts;
use super::format::{ago, ago_secs, bytes, clock, esc};
use super::report::{Nodes, Report, Role};
use crate::server::history::EventKind;

/// How often the page's script fetches the page again.
const REFRESH_SECONDS: u64 = 5;

const STYLE: &str = r#"
:root{--fg:#1d2433;--muted:#667085;--line:#e4e7ec;--bg:#f6f7f9;--card:#fff;--ok:#12805c;--okbg:#e3f6ee;--bad:#b42318;--badbg:#fdecea;--warn:#a15c07;--warnbg:#fef4e4;--lead:#3b4cca;--leadbg:#e8ebfd}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1240px;margin:0 auto;padding:20px 20px 40px}
header h1{font-size:22px;margin:0 0 2px}
header h1 small{font-weight:400;color:var(--muted);font-size:15px}
.sub{color:var(--muted);margin:0 0 16px}
section{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px;margin:0 0 16px}
h2{font-size:15px;margin:0 0 10px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{color:var(--muted);font-weight:500;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.badge,.nowrap{white-space:nowrap}
tr:last-child td{border-bottom:0}
tr.down td{color:var(--muted)}
.id{color:var(--muted);font-size:12px;font-family:ui-monospace,monospace}
.badge{display:inline-block;padding:1px 8px;border-radius:999px;font-size:12px;font-weight:600}
.leader{background:var(--leadbg);color:var(--lead)}
.follower,.learner,.muted{background:var(--line);color:var(--muted)}
.ok{background:var(--okbg);color:var(--ok)}
.bad{background:var(--badbg);color:var(--bad)}
.warnb{background:var(--warnbg);color:var(--warn)}
.tag{font-size:11px;color:var(--muted);margin-left:6px}
.err{color:var(--bad);font-size:12px}
.charts{display:grid;grid-template-columns:repeat(3,1fr);gap:14px}
figure{margin:0}
figcaption{font-weight:600;font-size:13px;margin-bottom:4px}
svg.chart{width:100%;height:auto;display:block}
.legend{font-size:12px;color:var(--muted);margin-top:2px}
.sw{display:inline-block;width:10px;height:3px;border-radius:2px;vertical-align:middle;margin-right:4px}
.legend span+span{margin-left:12px}
.note{color:var(--muted);margin:0}
.dot{display:inline-block;width:8px;height:8px;border-radius:50%;margin-right:6px;vertical-align:middle}
.banner{padding:8px 20px;font-weight:500}
.banner.error{background:var(--badbg);color:var(--bad)}
.banner.warn{background:var(--warnbg);color:var(--warn)}
footer{color:var(--muted);font-size:12px}
@media (max-width:900px){.charts{grid-template-columns:1fr}}
"#;

/// Fetches the page again every few seconds and swaps its content in (counting the swaps in
/// `body[data-refreshes]`); shows a banner when the member does not answer, and writes any
/// script error into the page.
const SCRIPT: &str = r#"
window.onerror = function (msg) {
  var e = document.getElementById('script-error');
  if (e) { e.hidden = false; e.textContent = 'Script error: ' + msg; }
};
(function () {
  var every = REFRESH_MS, refreshes = 0;
  function refresh() {
    fetch(location.pathname, { cache: 'no-store' })
      .then(function (r) { if (!r.ok) { throw new Error('HTTP ' + r.status); } return r.text(); })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, 'text/html').getElementById('content');
        var old = document.getElementById('content');
        if (fresh && old) { old.replaceWith(fresh); }
        document.getElementById('stale').hidden = true;
        document.body.setAttribute('data-refreshes', String(++refreshes));
      })
      .catch(function (e) {
        var s = document.getElementById('stale');
        s.hidden = false;
        s.textContent = 'This member does not answer (' + e.message + '): the page shows what it said last.';
      })
      .then(function () { setTimeout(refresh, every); });
  }
  setTimeout(refresh, every);
})();
"#;

pub fn render(r: &Report) -> String {
    let now = r.generated_at;
    let names: HashMap<&str, &str> = r
        .members
        .iter()
        .map(|m| (m.id.as_str(), m.label()))
        .collect();
    let name_of = |id: &str| {
        names
            .get(id)
            .map_or_else(|| id.to_string(), |n| n.to_string())
    };
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <link rel=\"icon\" href=\"data:,\"><title>rkube · {member}</title>\
         <noscript><meta http-equiv=\"refresh\" content=\"10\"></noscript>\
         <style>{STYLE}</style></head><body>\
         <div id=\"script-error\" class=\"banner error\" hidden></div>\
         <div id=\"stale\" class=\"banner warn\" hidden></div>\
         <main id=\"content\" data-generated=\"{generated}\">",
        member = esc(&r.member),
        generated = esc(&now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    );
    let leader = match &r.leader {
        Some(id) => format!(
            "leader <b id=\"leader\" data-leader=\"{}\">{}</b>",
            esc(id),
            esc(&name_of(id))
        ),
        None => "<b id=\"leader\" class=\"err\">no leader known</b>".to_string(),
    };
    let _ = write!(
        out,
        "<header><h1>rkube <small>member {member} · <span class=\"id\">{id}</span></small></h1>\
         <p class=\"sub\">cluster <span class=\"id\">{cluster}</span> · term {term} · {leader} · \
         as of {time} UTC</p></header>",
        member = esc(&r.member),
        id = esc(&r.member_id),
        cluster = esc(&r.cluster_id),
        term = r.term,
        time = now.format("%H:%M:%S"),
    );
    render_members(&mut out, r);
    render_charts(&mut out, r);
    render_nodes(&mut out, &r.nodes, now);
    render_events(&mut out, r, &name_of);
    let _ = write!(
        out,
        "<footer>Served by {member} on its metrics port, read-only; the same report as JSON at \
         <a href=\"/status.json\">/status.json</a>. The page refreshes every {REFRESH_SECONDS} s; \
         charts and events are this member's own memory since it started.</footer></main>\
         <script>{script}</script></body></html>",
        member = esc(&r.member),
        script = SCRIPT.replace("REFRESH_MS", &(REFRESH_SECONDS * 1000).to_string()),
    );
    out
}

fn render_members(out: &mut String, r: &Report) {
    let leader_page = r
        .members
        .iter()
        .any(|m| m.this_member && m.role == Role::Leader);
    let _ =
        write!(
        out,
        "<section id=\"members\"><h2>Members</h2><table><thead><tr><th>Member</th><th>Role</th>\
         <th>Term</th><th>Commit</th><th>Applied</th><th>Revision</th><th>DB size</th>\
         <th>Last contact</th>{}<th>Notes</th></tr></thead><tbody>",
        if leader_page { "<th>Replicated to</th>" } else { "" }
    );
    for m in &r.members {
        let reachable = m.status.is_some();
        let _ = write!(
            out,
            "<tr data-member=\"{name}\" data-id=\"{id}\" data-role=\"{role}\" \
             data-reachable=\"{reachable}\"{down}><td><b>{name}</b>{this}<br>\
             <span class=\"id\">{id} · {url}</span></td><td><span class=\"badge {role}\">{role}</span>",
            name = esc(m.label()),
            id = esc(&m.id),
            role = m.role.as_str(),
            down = if reachable { "" } else { " class=\"down\"" },
            this = if m.this_member {
                "<span class=\"tag\">this member</span>"
            } else {
                ""
            },
            url = esc(m.client_url.as_deref().unwrap_or(&m.peer_url)),
        );
        if !reachable {
            out.push_str(" <span class=\"badge bad\">unreachable</span>");
        }
        out.push_str("</td>");
        match &m.status {
            Some(s) => {
                let _ = write!(
                    out,
                    "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                     <td class=\"n\">{}</td><td class=\"n\">{}</td>",
                    s.term,
                    s.commit_index,
                    s.applied_index,
                    s.revision,
                    bytes(s.db_size_bytes)
                );
            }
            None => out.push_str(&"<td class=\"n\">—</td>".repeat(5)),
        }
        let contact = match (m.this_member, m.last_contact_seconds) {
            (true, _) => "—".to_string(),
            (false, Some(s)) => ago_secs(s),
            (false, None) => "never".to_string(),
        };
        let _ = write!(out, "<td class=\"nowrap\">{contact}</td>");
        if leader_page {
            let _ = match (m.this_member, m.matched_index) {
                (true, _) => write!(out, "<td class=\"n\">—</td>"),
                (false, Some(i)) => write!(out, "<td class=\"n\">{i}</td>"),
                (false, None) => write!(out, "<td class=\"n\">—</td>"),
            };
        }
        out.push_str("<td>");
        if let Some(e) = &m.error {
            let _ = write!(out, "<span class=\"err\">{}</span>", esc(e));
        }
        if let Some(s) = &m.status {
            for e in &s.errors {
                let _ = write!(out, "<span class=\"err\">{}</span><br>", esc(e));
            }
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table></section>");
}

fn render_nodes(out: &mut String, nodes: &Nodes, now: DateTime<Utc>) {
    out.push_str("<section id=\"nodes\"><h2>Nodes</h2>");
    match nodes {
        Nodes::NotServed => out.push_str(
            "<p class=\"note\">This member serves no Kubernetes API (<code>--store-only</code>): \
             there are no nodes.</p>",
        ),
        Nodes::Failed { error } => {
            let _ = write!(
                out,
                "<p class=\"err\">The nodes could not be read: {}</p>",
                esc(error)
            );
        }
        Nodes::Listed { items } if items.is_empty() => out.push_str(
            "<p class=\"note\">No node has registered yet (start an agent: <code>rkube agent</code>).</p>",
        ),
        Nodes::Listed { items } => {
            out.push_str(
                "<table><thead><tr><th>Node</th><th>Ready</th><th>Conditions</th>\
                 <th>Last heartbeat</th></tr></thead><tbody>",
            );
            for n in items {
                let ready = n.condition("Ready");
                let status = ready.map_or("Unknown", |c| c.status.as_str());
                let class = match status {
                    "True" => "ok",
                    "False" => "bad",
                    _ => "warnb",
                };
                let label = match status {
                    "True" => "Ready",
                    "False" => "NotReady",
                    _ => "Unknown",
                };
                let _ = write!(
                    out,
                    "<tr data-node=\"{name}\" data-ready=\"{status}\"><td><b>{name}</b>{cordon}</td>\
                     <td><span class=\"badge {class}\">{label}</span>",
                    name = esc(&n.name),
                    status = esc(status),
                    cordon = if n.unschedulable {
                        " <span class=\"badge warnb\">SchedulingDisabled</span>"
                    } else {
                        ""
                    },
                );
                if let Some(c) = ready.filter(|c| c.status != "True" && !c.message.is_empty()) {
                    let _ = write!(out, "<br><span class=\"err\">{}</span>", esc(&c.message));
                }
                out.push_str("</td><td>");
                for c in &n.conditions {
                    // Ready is good when True, a pressure or unavailability condition when False.
                    let good = if c.type_ == "Ready" { "True" } else { "False" };
                    let class = match c.status.as_str() {
                        "True" | "False" if c.status == good => "ok",
                        "True" | "False" => "bad",
                        _ => "warnb",
                    };
                    let _ = write!(
                        out,
                        "<span class=\"badge {class}\" title=\"{title}\">{t}={s}</span> ",
                        t = esc(&c.type_),
                        s = esc(&c.status),
                        title = esc(&format!("{}: {}", c.reason, c.message)),
                    );
                }
                let heartbeat = n
                    .conditions
                    .iter()
                    .filter_map(|c| c.last_heartbeat_time.as_deref())
                    .filter_map(|t| DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.with_timezone(&Utc))
                    .max();
                let _ = write!(
                    out,
                    "</td><td>{}</td></tr>",
                    heartbeat.map_or("—".to_string(), |t| ago(t, now))
                );
            }
            out.push_str("</tbody></table>");
        }
    }
    out.push_str("</section>");
}

fn render_events(out: &mut String, r: &Report, name_of: &dyn Fn(&str) -> String) {
    let now = r.generated_at;
    out.push_str("<section id=\"events\"><h2>Leader changes and snapshots</h2>");
    if r.events.is_empty() {
        out.push_str("<p class=\"note\">Nothing yet.</p></section>");
        return;
    }
    out.push_str("<table><thead><tr><th>When (UTC)</th><th></th><th>What</th></tr></thead><tbody>");
    for e in r.events.iter().rev() {
        let (kind, color, what) = match &e.kind {
            EventKind::Started { member } => (
                "started",
                "#667085",
                format!("{} started; its history begins here", esc(member)),
            ),
            EventKind::Leader { leader, term } => (
                "leader",
                "#3b4cca",
                format!(
                    "<b>{}</b> leads, term {term}",
                    esc(&name_of(&format!("{leader:x}")))
                ),
            ),
            EventKind::NoLeader { term } => (
                "no-leader",
                "#b42318",
                format!("no leader known (term {term}): an election, or this member is cut off"),
            ),
            EventKind::RaftSnapshotBuilt { index, term } => (
                "raft-snapshot",
                "#12a67a",
                format!("Raft snapshot built at log index {index} (term {term})"),
            ),
            EventKind::RaftSnapshotInstalled { index, term } => (
                "raft-snapshot-installed",
                "#e07a1f",
                format!(
                    "Raft snapshot installed from the leader at log index {index} (term {term}): \
                     this member was too far behind"
                ),
            ),
            EventKind::ScheduledSnapshot {
                file,
                revision,
                bytes: size,
            } => (
                "scheduled-snapshot",
                "#12a67a",
                format!(
                    "scheduled snapshot <code>{}</code> at revision {revision} ({})",
                    esc(file),
                    bytes(*size as i64)
                ),
            ),
            EventKind::ScheduledSnapshotFailed { error } => (
                "scheduled-snapshot-failed",
                "#b42318",
                format!("scheduled snapshot failed: {}", esc(error)),
            ),
        };
        let _ = write!(
            out,
            "<tr data-event=\"{kind}\"><td>{when}</td><td class=\"id\">{ago}</td>\
             <td><i class=\"dot\" style=\"background:{color}\"></i>{what}</td></tr>",
            when = clock(e.at, now),
            ago = ago(e.at, now),
        );
    }
    out.push_str("</tbody></table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::status_page::testing::report;

    #[test]
    fn the_page_shows_members_roles_and_who_does_not_answer() {
        let html = render(&report());
        assert!(html.contains(
            "data-member=\"n1\" data-id=\"1\" data-role=\"leader\" data-reachable=\"true\""
        ));
        assert!(html.contains(
            "data-member=\"n3\" data-id=\"3\" data-role=\"follower\" data-reachable=\"false\""
        ));
        assert!(html.contains(">unreachable</span>"));
        assert!(html.contains("transport error"));
        assert!(html.contains("leader <b id=\"leader\" data-leader=\"1\">n1</b>"));
        assert!(html.contains("<th>Replicated to</th>"), "the leader's page");
        assert!(html.contains("3.0 MiB"));
    }

    #[test]
    fn the_page_shows_nodes_events_and_charts() {
        let html = render(&report());
        assert!(html.contains("data-node=\"agent1\" data-ready=\"True\""));
        assert!(html.contains("MemoryPressure=False"));
        assert!(html.contains("10 s ago"), "the node's heartbeat");
        assert!(html.contains("<b>n1</b> leads, term 3"));
        assert!(html.contains("rkube-snapshot-x.snap</code> at revision 50 (2.0 KiB)"));
        for id in ["proposals", "commit", "fsync"] {
            assert!(html.contains(&format!("id=\"chart-{id}\"")), "{id}");
        }
        // The commit latency has three gaps: four lines per series.
        let commit = html
            .split("id=\"chart-commit\"")
            .nth(1)
            .and_then(|s| s.split("</svg>").next())
            .expect("commit chart");
        assert_eq!(commit.matches("<polyline").count(), 8, "{commit}");
    }

    #[test]
    fn without_the_kubernetes_api_the_page_says_there_are_no_nodes() {
        let mut r = report();
        r.nodes = Nodes::NotServed;
        assert!(render(&r).contains("serves no Kubernetes API (<code>--store-only</code>)"));
        r.nodes = Nodes::Listed { items: vec![] };
        assert!(render(&r).contains("No node has registered yet"));
    }

    #[test]
    fn text_from_the_cluster_is_escaped() {
        let mut r = report();
        r.members[2].error = Some("<script>alert(1)</script>".into());
        r.nodes = Nodes::Failed {
            error: "a \"quoted\" & <b>".into(),
        };
        let html = render(&r);
        assert!(!html.contains("<script>alert"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("a &quot;quoted&quot; &amp; &lt;b&gt;"));
    }

    #[test]
    fn an_empty_history_draws_empty_charts() {
        let mut r = report();
        r.samples.clear();
        r.events.clear();
        let html = render(&r);
        assert_eq!(html.matches("no measurements yet").count(), 3);
        assert!(html.contains("data-points=\"0\""));
        assert!(html.contains("Nothing yet."));
    }
}
