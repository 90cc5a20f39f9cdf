//! The charts of the last hour: line charts drawn on the server as inline SVG.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};

use super::format::{esc, num};
use super::report::Report;
use crate::server::history::Sample;

/// One line of a chart: values by sample, `None` where there was nothing to measure.
struct Series<'a> {
    name: &'a str,
    color: &'a str,
    points: Vec<(DateTime<Utc>, Option<f64>)>,
}

pub(super) fn render_charts(out: &mut String, r: &Report) {
    let s = &r.samples;
    let series = |name, color, f: &dyn Fn(&Sample) -> Option<f64>| Series {
        name,
        color,
        points: s.iter().map(|x| (x.at, f(x))).collect(),
    };
    let charts = [
        (
            "proposals",
            "Proposals per second",
            "/s",
            vec![
                series("proposals (as leader)", "#3b4cca", &|x| {
                    Some(x.proposals_per_second)
                }),
                series("entries committed", "#12a67a", &|x| {
                    Some(x.entries_per_second)
                }),
            ],
        ),
        (
            "commit",
            "Commit latency (proposal to apply)",
            "ms",
            vec![
                series("mean", "#3b4cca", &|x| x.commit.map(|l| l.mean_ms)),
                series("p99", "#e07a1f", &|x| x.commit.map(|l| l.p99_ms)),
            ],
        ),
        (
            "fsync",
            "WAL fsync latency",
            "ms",
            vec![
                series("mean", "#3b4cca", &|x| x.fsync.map(|l| l.mean_ms)),
                series("p99", "#e07a1f", &|x| x.fsync.map(|l| l.p99_ms)),
            ],
        ),
    ];
    let _ = write!(
        out,
        "<section id=\"charts\"><h2>Last hour <span class=\"tag\">a sample every {} s, {} so far</span></h2>\
         <div class=\"charts\">",
        r.sample_interval_seconds,
        s.len()
    );
    for (id, title, unit, series) in &charts {
        out.push_str(&chart(id, title, unit, r.generated_at, series));
    }
    out.push_str("</div></section>");
}

/// A line chart of the last hour as inline SVG.
fn chart(id: &str, title: &str, unit: &str, now: DateTime<Utc>, series: &[Series]) -> String {
    const W: f64 = 400.0;
    const H: f64 = 170.0;
    const LEFT: f64 = 44.0;
    const RIGHT: f64 = 8.0;
    const TOP: f64 = 8.0;
    const BOTTOM: f64 = 22.0;
    const SPAN: f64 = 3600.0;
    let max = series
        .iter()
        .flat_map(|s| s.points.iter().filter_map(|p| p.1))
        .fold(0.0f64, f64::max);
    let top = nice_ceiling(max);
    let x = |at: DateTime<Utc>| {
        let before = (now - at).num_milliseconds() as f64 / 1000.0;
        LEFT + (W - LEFT - RIGHT) * (1.0 - before.clamp(0.0, SPAN) / SPAN)
    };
    let y = |v: f64| TOP + (H - TOP - BOTTOM) * (1.0 - (v / top).clamp(0.0, 1.0));
    let points: usize = series
        .iter()
        .map(|s| s.points.iter().filter(|p| p.1.is_some()).count())
        .sum();
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<figure><figcaption>{title}</figcaption><svg class=\"chart\" id=\"chart-{id}\" \
         data-points=\"{points}\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{title}\" \
         xmlns=\"http://www.w3.org/2000/svg\" font-size=\"10\" fill=\"#667085\">",
        title = esc(title),
    );
    for i in 0..=4 {
        let v = top * i as f64 / 4.0;
        let yy = y(v);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{x2}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e7ec\"/>\
             <text x=\"{tx}\" y=\"{ty:.1}\" text-anchor=\"end\">{label}</text>",
            x2 = W - RIGHT,
            tx = LEFT - 4.0,
            ty = yy + 3.5,
            label = esc(&num(v)),
        );
    }
    for (minutes, anchor) in [
        (60, "start"),
        (45, "middle"),
        (30, "middle"),
        (15, "middle"),
        (0, "end"),
    ] {
        let at = now - chrono::Duration::minutes(minutes);
        let label = if minutes == 0 {
            "now".to_string()
        } else {
            format!("−{minutes} min")
        };
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"{anchor}\">{label}</text>",
            x(at),
            H - 6.0
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{TOP}\" dy=\"-1\" font-size=\"9\">{}</text>",
        esc(unit)
    );
    for s in series {
        // A gap where nothing was measured.
        let mut segments: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (at, v) in &s.points {
            match v {
                Some(v) => segments
                    .last_mut()
                    .map(|seg| seg.push((x(*at), y(*v))))
                    .unwrap_or(()),
                None if segments.last().is_some_and(|seg| !seg.is_empty()) => {
                    segments.push(Vec::new())
                }
                None => {}
            }
        }
        for seg in segments.iter().filter(|seg| !seg.is_empty()) {
            if seg.len() == 1 {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{}\"/>",
                    seg[0].0, seg[0].1, s.color
                );
            } else {
                let pts: Vec<String> = seg.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
                let _ = write!(
                    svg,
                    "<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.6\" \
                     stroke-linejoin=\"round\" points=\"{}\"/>",
                    s.color,
                    pts.join(" ")
                );
            }
        }
    }
    if points == 0 {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"12\">\
             no measurements yet</text>",
            (LEFT + W - RIGHT) / 2.0,
            (TOP + H - BOTTOM) / 2.0
        );
    }
    svg.push_str("</svg><div class=\"legend\">");
    for s in series {
        let last = s.points.iter().rev().find_map(|p| p.1);
        let _ = write!(
            svg,
            "<span><i class=\"sw\" style=\"background:{}\"></i>{} {}</span>",
            s.color,
            esc(s.name),
            last.map_or("—".to_string(), |v| format!("{} {}", num(v), esc(unit)))
        );
    }
    svg.push_str("</div></figure>");
    svg
}

/// The smallest 1, 2 or 5 times a power of ten at or above `v` (1 for nothing).
pub(super) fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let magnitude = 10f64.powf(v.log10().floor());
    for step in [1.0, 2.0, 5.0, 10.0] {
        if step * magnitude >= v * (1.0 - 1e-9) {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}
