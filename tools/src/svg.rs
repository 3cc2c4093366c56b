//! Minimal SVG charts: no fonts to embed, no libraries; any browser renders them.

use std::fmt::Write;

/// A named series of (x, y) points.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const W: f64 = 720.0;
const H: f64 = 420.0;
const L: f64 = 60.0; // left margin
const R: f64 = 150.0; // right margin (legend)
const T: f64 = 40.0;
const B: f64 = 50.0;
const COLORS: [&str; 12] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
    "#17becf", "#393b79", "#637939",
];

fn header(title: &str) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{title}</text>"#,
        (L + W - R) / 2.0
    );
    s
}

fn axes(s: &mut String, y_max: f64, y_label: &str, x_label: &str) {
    let (x0, y0, x1) = (L, H - B, W - R);
    let _ = write!(
        s,
        r#"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="black"/><line x1="{x0}" y1="{T}" x2="{x0}" y2="{y0}" stroke="black"/>"#
    );
    for k in 0..=5 {
        let v = y_max * k as f64 / 5.0;
        let y = y0 - (y0 - T) * k as f64 / 5.0;
        let _ = write!(
            s,
            r##"<line x1="{x0}" y1="{y}" x2="{x1}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{v:.2}</text>"##,
            x0 - 6.0,
            y + 4.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text><text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">{y_label}</text>"#,
        (x0 + x1) / 2.0,
        H - 12.0,
        (T + y0) / 2.0,
        (T + y0) / 2.0
    );
}

fn legend(s: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = T + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}">{name}</text>"#,
            W - R + 16.0,
            y,
            COLORS[i % COLORS.len()],
            W - R + 34.0,
            y + 10.0
        );
    }
}

/// A line chart of `series` (x = nodes).
pub fn lines(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let xs: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).collect();
    let x_max = xs.iter().copied().fold(1.0, f64::max);
    let y_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(1.0, f64::max).ceil();
    let mut s = header(title);
    axes(&mut s, y_max, y_label, x_label);
    let px = |x: f64| L + (W - R - L) * (x / x_max);
    let py = |y: f64| (H - B) - (H - B - T) * (y / y_max);
    let mut ticks: Vec<f64> = xs.clone();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for x in ticks {
        let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">{x}</text>"#, px(x), H - B + 16.0);
    }
    for (i, ser) in series.iter().enumerate() {
        let pts: Vec<String> =
            ser.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
        let c = COLORS[i % COLORS.len()];
        let _ =
            write!(s, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        for &(x, y) in &ser.points {
            let _ = write!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#, px(x), py(y));
        }
    }
    legend(&mut s, &series.iter().map(|x| x.name.as_str()).collect::<Vec<_>>());
    s.push_str("</svg>\n");
    s
}

/// A grouped bar chart: one group per entry of `groups`, one bar per series (x = group index).
pub fn bars(title: &str, groups: &[String], series: &[Series]) -> String {
    let y_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(1.0, f64::max).ceil();
    let mut s = header(title);
    axes(&mut s, y_max, "ratio", "");
    let group_w = (W - R - L) / groups.len().max(1) as f64;
    let bar_w = (group_w * 0.8) / series.len().max(1) as f64;
    for (g, name) in groups.iter().enumerate() {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{name}</text>"#,
            L + group_w * (g as f64 + 0.5),
            H - B + 16.0
        );
    }
    for (i, ser) in series.iter().enumerate() {
        for &(g, v) in &ser.points {
            let h = (H - B - T) * (v / y_max);
            let x = L + group_w * g + group_w * 0.1 + bar_w * i as f64;
            let _ = write!(
                s,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="{}"/>"#,
                H - B - h,
                bar_w * 0.95,
                COLORS[i % COLORS.len()]
            );
        }
    }
    // The 1.0 line: DSM as fast as threads.
    let y1 = (H - B) - (H - B - T) / y_max;
    let _ = write!(
        s,
        r#"<line x1="{L}" y1="{y1:.1}" x2="{}" y2="{y1:.1}" stroke="black" stroke-dasharray="4 3"/>"#,
        W - R
    );
    legend(&mut s, &series.iter().map(|x| x.name.as_str()).collect::<Vec<_>>());
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_well_formed_svg() {
        let ser = vec![Series { name: "sor".into(), points: vec![(1.0, 1.0), (2.0, 1.7)] }];
        let l = lines("t", "nodes", "speedup", &ser);
        assert!(l.starts_with("<svg") && l.trim_end().ends_with("</svg>") && l.contains("polyline"));
        let b = bars("t", &["sor".into()], &ser);
        assert!(b.contains("<rect") && b.matches("<svg").count() == 1);
    }
}
