#!/usr/bin/env python3
"""The record keeping and the report of vs-etcd.sh (standard library only).

vs-etcd.sh calls it to write each JSON line of results.jsonl:

  header ...          {"type": "run"}: date, machine, versions, settings
  members ...         {"type": "members"}: each member's command line as run, and for etcd the
                      effective settings its log prints
  record ...          {"type": "result"}: one workload of one system in one round, from the
                      output of `rkube bench` (its BENCH_JSON line) or `etcdctl check perf`
(and it writes {"type": "half"} lines itself: when each system ran in a round, and the load).

  report RESULTS.jsonl --out PREFIX

writes PREFIX.md (header, then per workload a markdown table: ratio of the medians over rounds
(rkube / etcd), the range of the per-round ratios, and each system's median with its min-max
over rounds) and two SVG charts, PREFIX-throughput.svg and PREFIX-latency.svg (one panel per
workload and metric, each on its own linear scale; bars are medians, whiskers min-max).
"""

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

SYSTEMS = ("rkube", "etcd")
COLORS = {"rkube": "#3b6ea5", "etcd": "#d9822b"}

# name: (table title, short label for charts)
WORKLOADS = {
    "put-1": ("put, 1 client, to the leader", "put, 1 client"),
    "put-16": ("put, 16 clients, to the leader", "put, 16 clients"),
    "put-256": ("put, 256 clients, to the leader", "put, 256 clients"),
    "range-l-1": ("linearizable range (get of one key), 1 client", "lin. range, 1 client"),
    "range-l-256": ("linearizable range (get of one key), 256 clients over all members",
                    "lin. range, 256"),
    "range-s-1": ("serializable range (get of one key), 1 client", "ser. range, 1 client"),
    "range-s-256": ("serializable range (get of one key), 256 clients over all members",
                    "ser. range, 256"),
    "watch": ("watch event latency, 1,000 watchers, 1,000 puts/s", "watch"),
    "watch-200": ("watch event latency, 1,000 watchers, 200 puts/s", "watch, 200 puts/s"),
    "checkperf": ("etcdctl check perf", "check perf"),
    "failover": ("failover: SIGKILL of the leader to the first successful write", "failover"),
}


# ---------------------------------------------------------------------------------------------
# Records


def hide(text, pairs):
    """Replaces each FROM of FROM=TO in `pairs` (longest first) in `text`."""
    for pair in sorted(pairs or [], key=lambda p: -len(p.split("=", 1)[0])):
        old, _, new = pair.partition("=")
        if old:
            text = text.replace(old, new)
    return text


def cmd_header(a):
    print(json.dumps({
        "type": "run",
        "date": a.date,
        "machine": {"cores": a.cores, "cpu": a.cpu, "mem_gib": a.mem_gib, "kernel": a.kernel,
                    "fs": a.fs, "fs_options": a.fs_options, "load": a.load},
        "versions": {"rkube": a.rkube, "tree": a.tree, "etcd": a.etcd, "etcdctl": a.etcdctl},
        "settings": {"heartbeat_ms": a.heartbeat_ms, "election_ms": a.election_ms,
                     "rounds": a.rounds, "workloads": a.workloads.split(),
                     "checkperf_load": a.checkperf_load, "sizes": a.sizes},
    }))


def cmd_members(a):
    cmdlines = []
    for pid in a.pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdlines.append(None)
            continue
        argv = [x.decode(errors="replace") for x in argv if x]
        if argv:
            argv[0] = Path(argv[0]).name
        cmdlines.append(hide(" ".join(argv), a.hide))
    effective = []
    if a.etcd_log:
        wanted = re.compile(r"embed: (heartbeat|election|snapshot count) = |maximum number of CPUs")
        try:
            for line in Path(a.etcd_log).read_text(errors="replace").splitlines():
                if wanted.search(line):
                    # Without the timestamp: "embed: heartbeat = 100ms".
                    effective.append(re.sub(r"^\S+ \S+ [A-Z] \| ", "", line))
        except OSError:
            pass
    print(json.dumps({"type": "members", "system": a.system, "round": a.round,
                      "cmdlines": cmdlines, "effective": effective}))


PROGRESS = re.compile(r"^\d+ / \d+ ")  # etcdctl's progress bar


def last_lines(text, n=5, limit=1000):
    lines = [l.strip() for l in text.replace("\r", "\n").splitlines()]
    lines = [l for l in lines if l and not PROGRESS.match(l)]
    return " / ".join(lines[-n:])[-limit:]


def parse_checkperf(out, err, exit_code, load):
    """etcdctl 3.4's `check perf` report: PASS/FAIL lines on stdout, "Error: ..." on stderr."""
    r = {"workload": "checkperf", "load": load, "exit_code": exit_code, "verdict": None,
         "throughput": None, "slowest_ms": None, "stddev_ms": None, "errors": 0,
         "error_kinds": {}, "failed_checks": []}
    m = re.search(r"Throughput (?:is|too low:) (\d+) writes/s", out)
    if m:
        r["throughput"] = int(m.group(1))
    m = re.search(r"Slowest request took(?: too long:)? ([0-9.]+)s", out)
    if m:
        r["slowest_ms"] = round(float(m.group(1)) * 1000, 2)
    m = re.search(r"Stddev (?:is|too high:) ([0-9.]+)s", out)
    if m:
        r["stddev_ms"] = round(float(m.group(1)) * 1000, 2)
    for m in re.finditer(r"ERROR\((.*?)\) -> (\d+)\s*$", out, re.M | re.S):
        r["error_kinds"][m.group(1).strip()] = int(m.group(2))
        r["errors"] += int(m.group(2))
    lines = [l.strip() for l in out.splitlines()]
    r["failed_checks"] = [l for l in lines if l.startswith("FAIL:") and "ERROR(" not in l
                          or l.startswith(("Slowest request took too long", "Stddev too high"))]
    if lines and lines[-1] in ("PASS", "FAIL"):
        r["verdict"] = lines[-1]
    # The report lines come only after the whole run (and its clean-up delete) finished.
    r["completed"] = r["throughput"] is not None and r["verdict"] is not None
    r["clean"] = r["completed"] and r["errors"] == 0
    return r


def cmd_record(a):
    out = Path(a.out).read_text(errors="replace") if Path(a.out).exists() else ""
    err = Path(a.err).read_text(errors="replace") if Path(a.err).exists() else ""
    rec = {"type": "result", "round": a.round, "system": a.system, "name": a.name,
           "exit_code": a.exit_code, "elapsed_s": a.elapsed, "ok": False, "result": None,
           "error": None}
    if a.kind == "bench":
        found = [l[len("BENCH_JSON "):] for l in out.splitlines() if l.startswith("BENCH_JSON ")]
        if a.exit_code == 0 and found:
            rec["ok"] = True
            rec["result"] = json.loads(found[-1])
    else:
        rec["result"] = parse_checkperf(out, err, a.exit_code, a.checkperf_load)
        rec["ok"] = rec["result"]["completed"]
    if a.exit_code in (124, 137):
        rec["error"] = f"stopped after WORKLOAD_TIMEOUT (exit code {a.exit_code})"
    elif a.kind == "bench" and not rec["ok"]:
        rec["error"] = last_lines(err + "\n" + out)
    elif a.kind == "checkperf" and not rec["ok"]:
        # etcdctl exits with "Error: ..." on stderr when a request outside the measured puts
        # (the first get, the final delete of the prefix) or the connection fails.
        fatal = [l for l in err.replace("\r", "\n").splitlines() if l.startswith("Error:")]
        rec["error"] = fatal[-1][:1000] if fatal else last_lines(err + "\n" + out)
    if rec["error"] is not None:
        rec["error"] = hide(rec["error"], a.hide) or f"exit code {a.exit_code}, no output"
    if a.name != "failover":
        rss = [None if x in ("", "null") else int(x) for x in a.rss_kb.split(",")]
        rec["rss_kb"] = rss if rss and all(x is not None for x in rss) else None
        before, after = a.fsyncs_before.split(), a.fsyncs_after.split()
        fs = None
        if len(before) == 2 and len(after) == 2 and "-" not in (before[0], after[0]):
            log = int(after[0]) - int(before[0])
            backend = None
            if before[1] != "-" and after[1] != "-":
                backend = int(after[1]) - int(before[1])
            if log >= 0 and (backend is None or backend >= 0):
                fs = {"log": log, "backend": backend}
        rec["fsyncs"] = fs
    print(json.dumps(rec))


# ---------------------------------------------------------------------------------------------
# Report


def num(x):
    if x is None:
        return "—"
    if isinstance(x, int) or abs(x) >= 100:
        return f"{round(x):,}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def spread(vals):
    """(median, min, max) of `vals`; the median stays an int when all values are ints and it
    is whole."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return None
    med = statistics.median(vals)
    if all(isinstance(v, int) for v in vals) and float(med).is_integer():
        med = int(med)
    return med, min(vals), max(vals)


def fmt_spread(s):
    if s is None:
        return "—"
    med, lo, hi = s
    if lo == hi:
        return num(med)
    return f"{num(med)} ({num(lo)}–{num(hi)})"


def res(key):
    return lambda rec: (rec["result"] or {}).get(key)


def rss_max_mib(rec):
    kb = rec.get("rss_kb")
    return max(kb) / 1024 if kb else None


def per_write(part, count_key):
    def get(rec):
        fs, r = rec.get("fsyncs"), rec["result"] or {}
        n = r.get(count_key)
        if not fs or fs.get(part) is None or not n:
            return None
        return fs[part] / n
    return get


LOAD = [("throughput, ops/s", res("throughput"), "up"),
        ("p50 latency, ms", res("p50_ms"), "down"),
        ("p99 latency, ms", res("p99_ms"), "down"),
        ("errors", res("errors"), None)]
FSYNC_ROWS = lambda key: [  # noqa: E731
    ("log fsyncs per write, all members", per_write("log", key), None),
    ("backend commits per write, all members (etcd's counter only)", per_write("backend", key),
     None)]
RSS_ROW = [("peak RSS of the largest member, MiB", rss_max_mib, "down")]
METRICS = {
    **{n: LOAD + FSYNC_ROWS("samples") + RSS_ROW for n in ("put-1", "put-16", "put-256")},
    **{n: LOAD + RSS_ROW for n in ("range-l-1", "range-l-256", "range-s-1", "range-s-256")},
    **{n: [("achieved put rate, puts/s", res("put_rate"), "up"),
           ("p50 event latency, ms", res("p50_ms"), "down"),
           ("p99 event latency, ms", res("p99_ms"), "down"),
           ("events received", res("events"), None),
           ("events expected", res("events_expected"), None)]
        + FSYNC_ROWS("puts") + RSS_ROW for n in ("watch", "watch-200")},
    "checkperf": [("throughput (etcdctl's figure), writes/s", res("throughput"), "up"),
                  ("slowest request, ms", res("slowest_ms"), "down"),
                  ("stddev of request time, ms", res("stddev_ms"), "down"),
                  ("request errors", res("errors"), None)] + RSS_ROW,
    "failover": [("p50 of the kills, ms", res("p50_ms"), "down"),
                 ("max of the kills, ms", res("max_ms"), "down")],
}
# Charts: (workload, metric label, unit) panels.
THROUGHPUT_PANELS = [(n, "throughput, ops/s") for n in
                     ("put-1", "put-16", "put-256", "range-l-1", "range-l-256", "range-s-1",
                      "range-s-256")] + [("watch", "achieved put rate, puts/s"),
                                         ("watch-200", "achieved put rate, puts/s"),
                                         ("checkperf", "throughput (etcdctl's figure), writes/s")]
LATENCY_PANELS = [(n, m) for n in ("put-1", "put-16", "put-256", "range-l-1", "range-l-256",
                                   "range-s-1", "range-s-256")
                  for m in ("p50 latency, ms", "p99 latency, ms")] + [
    ("watch", "p50 event latency, ms"), ("watch", "p99 event latency, ms"),
    ("watch-200", "p50 event latency, ms"), ("watch-200", "p99 event latency, ms"),
    ("checkperf", "stddev of request time, ms"), ("checkperf", "slowest request, ms"),
    ("failover", "p50 of the kills, ms"), ("failover", "max of the kills, ms")]
PANEL_UNIT = {"throughput, ops/s": "ops/s", "achieved put rate, puts/s": "puts/s",
              "throughput (etcdctl's figure), writes/s": "writes/s"}


class Results:
    def __init__(self, path):
        self.run, self.members, self.halves, self.results = None, [], [], []
        for line in Path(path).read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            kind = r.get("type")
            if kind == "run":
                self.run = r
            elif kind == "members":
                self.members.append(r)
            elif kind == "half":
                self.halves.append(r)
            elif kind == "result":
                self.results.append(r)
        self.names = [n for n in WORKLOADS if any(r["name"] == n for r in self.results)]

    def of(self, name, system):
        return sorted((r for r in self.results if r["name"] == name and r["system"] == system),
                      key=lambda r: r["round"])

    def values(self, name, system, get):
        """{round: value} of the rounds whose workload succeeded."""
        out = {}
        for r in self.of(name, system):
            if r["ok"]:
                v = get(r)
                if v is not None:
                    out[r["round"]] = v
        return out

    def metric(self, name, label):
        for lab, get, _ in METRICS[name]:
            if lab == label:
                return get
        raise KeyError(label)


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(R, name):
    title = WORKLOADS[name][0]
    if name == "checkperf":
        loads = {(r["result"] or {}).get("load") for r in R.results if r["name"] == name}
        title += " --load=" + ",".join(sorted(l for l in loads if l))
    out = [f"#### {title}", ""]
    out.append("| metric | rkube ÷ etcd (medians) | per-round ratios, min–max "
               "| rkube: median (min–max) | etcd: median (min–max) |")
    out.append("|---|---|---|---|---|")
    n_ok = {s: sum(r["ok"] for r in R.of(name, s)) for s in SYSTEMS}
    n_all = {s: len(R.of(name, s)) for s in SYSTEMS}
    out.append(f"| rounds measured | | | {n_ok['rkube']} of {n_all['rkube']} "
               f"| {n_ok['etcd']} of {n_all['etcd']} |")
    for label, get, _ in METRICS[name]:
        vals = {s: R.values(name, s, get) for s in SYSTEMS}
        if not vals["rkube"] and not vals["etcd"]:
            continue
        sp = {s: spread(vals[s].values()) for s in SYSTEMS}
        med_ratio = ratio(sp["rkube"] and sp["rkube"][0], sp["etcd"] and sp["etcd"][0])
        paired = [ratio(vals["rkube"][k], vals["etcd"][k])
                  for k in vals["rkube"] if k in vals["etcd"]]
        paired = [p for p in paired if p is not None]
        pr = f"{min(paired):.2f}–{max(paired):.2f}" if len(paired) > 1 else (
            f"{paired[0]:.2f}" if paired else "—")
        show_ratio = label not in ("errors", "request errors", "events expected") and not (
            "backend commits" in label)
        out.append(f"| {label} | {f'{med_ratio:.2f}' if show_ratio and med_ratio else '—'} "
                   f"| {pr if show_ratio else '—'} | {fmt_spread(sp['rkube'])} "
                   f"| {fmt_spread(sp['etcd'])} |")
    if name == "checkperf":
        cells = []
        for s in SYSTEMS:
            rs = R.of(name, s)
            clean = sum(1 for r in rs if r["result"] and r["result"].get("clean"))
            passed = sum(1 for r in rs if r["result"] and r["result"].get("verdict") == "PASS")
            cells.append(f"{clean} / {passed} of {len(rs)}")
        out.append(f"| rounds completed without request errors / with etcdctl's verdict PASS "
                   f"| | | {cells[0]} | {cells[1]} |")
    out.append("")
    if name == "failover":
        for s in SYSTEMS:
            kills = [f"{v:.0f}" for r in R.of(name, s) if r["ok"]
                     for v in r["result"].get("rounds_ms", [])]
            if kills:
                out.append(f"- {s} failover, every kill of every round, ms: {', '.join(kills)}")
        out.append("")
    if name == "checkperf":
        for s in SYSTEMS:
            for r in R.of(name, s):
                res_ = r["result"] or {}
                notes = res_.get("failed_checks", []) + [
                    f"ERROR({k}) × {v}" for k, v in res_.get("error_kinds", {}).items()]
                if notes:
                    out.append(f"- {s}, round {r['round']}: " + "; ".join(notes))
        out.append("")
    return out


def header(R):
    run = R.run or {}
    m, v, st = run.get("machine", {}), run.get("versions", {}), run.get("settings", {})
    out = ["## rkube vs etcd, alternating rounds (vs-etcd.sh)", ""]
    ends = [h["end"] for h in R.halves]
    out.append(f"- Date: {run.get('date', '?')} to {max(ends) if ends else '?'}. Machine: "
               f"{m.get('cores')} cores ({m.get('cpu')}), {m.get('mem_gib')} GiB RAM, kernel "
               f"{m.get('kernel')}; WORKDIR on {m.get('fs')} ({m.get('fs_options')}); everything "
               f"on loopback. Load average at the start: {m.get('load')}.")
    out.append(f"- Versions: {v.get('rkube')} (tree {v.get('tree')}), etcd {v.get('etcd')}, "
               f"etcdctl {v.get('etcdctl')}.")
    out.append(f"- Both clusters: three members, --heartbeat-interval {st.get('heartbeat_ms')} "
               f"--election-timeout {st.get('election_ms')}, mutual TLS with the same "
               f"certificates, fresh data dirs every round. {st.get('rounds')} rounds, odd "
               f"rounds rkube first, even rounds etcd first.")
    out.append(f"- Workloads: {' '.join(st.get('workloads', []))}; sizes: {st.get('sizes')}; "
               f"checkperf load: {st.get('checkperf_load')}.")
    out.append("- Tables: the median over rounds, with min–max over rounds in brackets; the "
               "ratio is of the medians (rkube ÷ etcd; above 1 is rkube ahead for throughput, "
               "below 1 is rkube faster or smaller for latency and memory); per-round ratios "
               "pair the two systems' halves of each round, which ran back to back.")
    out.append("")
    out.append("As run (paths of the machine replaced):")
    out.append("")
    for mem in sorted(R.members, key=lambda x: SYSTEMS.index(x["system"])):
        cl = [c for c in mem["cmdlines"] if c]
        if cl:
            out.append(f"- {mem['system']} member 1: `{cl[0]}`")
        if mem.get("effective"):
            out.append(f"- {mem['system']}'s log: " + "; ".join(mem["effective"]))
    out.append("")
    out.append("| round | first | rkube: UTC, load start → end | etcd: UTC, load start → end |")
    out.append("|---|---|---|---|")
    for rnd in sorted({h["round"] for h in R.halves}):
        hs = {h["system"]: h for h in R.halves if h["round"] == rnd}
        first = next((s for s, h in hs.items() if h["first"]), "?")
        cell = lambda h: (f"{h['start'][11:19]}–{h['end'][11:19]}, "  # noqa: E731
                          f"{h['load_start'].split()[0]} → {h['load_end'].split()[0]}"
                          if h else "—")
        out.append(f"| {rnd} | {first} | {cell(hs.get('rkube'))} | {cell(hs.get('etcd'))} |")
    out.append("")
    return out


def failures(R):
    out = []
    for r in R.results:
        if r.get("error"):
            rss = ""
            if r.get("rss_kb"):
                rss = " (members' peak RSS meanwhile: " + " / ".join(
                    f"{k / 1024:,.0f}" for k in r["rss_kb"]) + " MiB)"
            out.append(f"- round {r['round']}, {r['system']} {r['name']}: {r['error'][:400]}{rss}")
    return (["#### failures and errors, as recorded", ""] + out + [""]) if out else []


# SVG --------------------------------------------------------------------------------------------


def esc(s):
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def nice_ticks(top):
    """0 and 3-5 round steps covering `top`."""
    if top <= 0:
        return [0, 1]
    raw = top / 4
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def short(x):
    if x >= 10000:
        return f"{x / 1000:.0f}k"
    if x >= 1000:
        return f"{x / 1000:.1f}k".replace(".0k", "k")
    if x >= 100 or float(x).is_integer():
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def panel(x0, y0, w, h, title, sub, stats, notes):
    """Two bars (rkube, etcd): median, whisker min-max; `stats` maps system to (med, lo, hi),
    `notes` to what to write instead of a bar without results."""
    el = [f'<text x="{x0 + w / 2}" y="{y0 + 14}" class="t">{esc(title)}</text>',
          f'<text x="{x0 + w / 2}" y="{y0 + 28}" class="s">{esc(sub)}</text>']
    left, right, top, bottom = x0 + 38, x0 + w - 8, y0 + 48, y0 + h - 20
    his = [s[2] for s in stats.values() if s]
    ticks = nice_ticks(max(his) if his else 1)
    ymax = ticks[-1] or 1
    y = lambda v: bottom - (bottom - top) * v / ymax  # noqa: E731
    for t in ticks:
        el.append(f'<line x1="{left}" x2="{right}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="g"/>')
        el.append(f'<text x="{left - 4}" y="{y(t) + 3.5:.1f}" class="a">{short(t)}</text>')
    slot = (right - left) / 2
    bw = min(34, slot * 0.55)
    for i, s in enumerate(SYSTEMS):
        cx = left + slot * (i + 0.5)
        el.append(f'<text x="{cx:.1f}" y="{bottom + 14}" class="l">{s}</text>')
        st = stats.get(s)
        if not st:
            el.append(f'<text x="{cx:.1f}" y="{bottom - 6}" class="l">{notes.get(s, "")}</text>')
            continue
        med, lo, hi = st
        el.append(f'<rect x="{cx - bw / 2:.1f}" y="{y(med):.1f}" width="{bw:.1f}" '
                  f'height="{bottom - y(med):.1f}" fill="{COLORS[s]}"/>')
        if hi > lo:
            el.append(f'<path d="M{cx:.1f} {y(lo):.1f}V{y(hi):.1f}M{cx - 6:.1f} {y(lo):.1f}'
                      f'h12M{cx - 6:.1f} {y(hi):.1f}h12" class="w"/>')
        el.append(f'<text x="{cx + bw / 2 + 2:.1f}" y="{y(med) + 4:.1f}" class="v">'
                  f'{num(med)}</text>')
    return el


def chart(R, panels, title, path):
    panels = [(n, m) for n, m in panels if n in R.names]
    cols, pw, ph = 4, 200, 190
    rows = max(1, math.ceil(len(panels) / cols))
    width, height = cols * pw + 20, rows * ph + 70
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
          f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
          "<style>text{fill:#222}.t{font-size:12px;font-weight:bold;text-anchor:middle}"
          ".s{font-size:10.5px;text-anchor:middle;fill:#555}.a{font-size:9.5px;"
          "text-anchor:end;fill:#666}.l{font-size:10.5px;text-anchor:middle}"
          ".v{font-size:9.5px}.g{stroke:#ddd;stroke-width:1}"
          ".w{stroke:#222;stroke-width:1.2;fill:none}</style>",
          f'<rect width="{width}" height="{height}" fill="#fff"/>',
          f'<text x="10" y="22" font-size="15" font-weight="bold">{esc(title)}</text>',
          f'<text x="10" y="40" font-size="11" fill="#555">bars: median over rounds; '
          f'whiskers: min–max over rounds; each panel on its own linear scale</text>']
    for i, s in enumerate(SYSTEMS):
        lx = width - 150 + i * 70
        el.append(f'<rect x="{lx}" y="12" width="12" height="12" fill="{COLORS[s]}"/>')
        el.append(f'<text x="{lx + 16}" y="22" font-size="12">{s}</text>')
    for k, (name, label) in enumerate(panels):
        x0, y0 = 10 + (k % cols) * pw, 55 + (k // cols) * ph
        get = R.metric(name, label)
        stats = {s: spread(R.values(name, s, get).values()) for s in SYSTEMS}
        r = ratio(stats["rkube"] and stats["rkube"][0], stats["etcd"] and stats["etcd"][0])
        unit = PANEL_UNIT.get(label, label.split(", ")[-1])
        what = label.split(",")[0].replace(" event latency", "").replace(" latency", "")
        what = "put rate" if name.startswith("watch") and label in PANEL_UNIT else (
            "" if label in PANEL_UNIT else what.replace(" of the kills", " of kills"))
        ttl = WORKLOADS[name][1] + (f": {what}" if what else "")
        sub = unit + (f" · rkube ÷ etcd {r:.2f}" if r is not None else "")
        notes = {s: "failed" if R.of(name, s) else "not run" for s in SYSTEMS}
        el += panel(x0, y0, pw - 10, ph - 8, ttl, sub, stats, notes)
    el.append("</svg>")
    Path(path).write_text("\n".join(el) + "\n")


def cmd_report(a):
    R = Results(a.results)
    prefix = Path(a.out)
    base = prefix.name
    md = header(R)
    md += [f"![throughput, rkube and etcd]({base}-throughput.svg)", "",
           f"![latency, rkube and etcd]({base}-latency.svg)", ""]
    for name in R.names:
        md += table(R, name)
    md += failures(R)
    prefix.with_name(base + ".md").write_text("\n".join(md))
    chart(R, THROUGHPUT_PANELS, "rkube vs etcd: throughput", prefix.with_name(base + "-throughput.svg"))
    chart(R, LATENCY_PANELS, "rkube vs etcd: latency", prefix.with_name(base + "-latency.svg"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("header")
    for f in ("date", "cpu", "kernel", "fs", "fs-options", "load", "rkube", "tree", "etcd",
              "etcdctl", "workloads", "checkperf-load", "sizes"):
        h.add_argument("--" + f, default="")
    for f in ("cores", "heartbeat-ms", "election-ms", "rounds"):
        h.add_argument("--" + f, type=int, default=0)
    h.add_argument("--mem-gib", type=float, default=0)
    m = sub.add_parser("members")
    m.add_argument("--system", required=True)
    m.add_argument("--round", type=int, required=True)
    m.add_argument("--hide", action="append", help="FROM=TO, replaced in command lines")
    m.add_argument("--etcd-log", default="")
    m.add_argument("pids", nargs="*")
    r = sub.add_parser("record")
    r.add_argument("--kind", choices=("bench", "checkperf"), required=True)
    r.add_argument("--round", type=int, required=True)
    r.add_argument("--system", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--exit-code", type=int, required=True)
    r.add_argument("--elapsed", type=float, default=0)
    r.add_argument("--rss-kb", default="")
    r.add_argument("--fsyncs-before", default="- -")
    r.add_argument("--fsyncs-after", default="- -")
    r.add_argument("--out", required=True)
    r.add_argument("--err", required=True)
    r.add_argument("--checkperf-load", default="")
    r.add_argument("--hide", action="append")
    rep = sub.add_parser("report")
    rep.add_argument("results")
    rep.add_argument("--out", required=True, help="PREFIX of PREFIX.md and PREFIX-*.svg")
    a = p.parse_args()
    {"header": cmd_header, "members": cmd_members, "record": cmd_record,
     "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
