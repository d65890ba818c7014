//! The side-by-side benchmark's chart: one PNG, two panels. Left, throughput: one
//! horizontal bar per contender in events/s, the relay's bars in blue. Right, latency
//! commit → consumer: per contender one bar per writer rate up to its p50, with a dark
//! marker at its p99, on a log scale (a few ms for the relay, seconds for polling).
//!
//! plotters is built without its `ttf` feature (no fontconfig, no freetype, no system
//! library), so text goes through ab_glyph and a TrueType font read at run time, never
//! shipped in the repository: the file named by `OUTBOX_RELAY_BENCH_FONT`, else DejaVu
//! Sans or Liberation Sans where Linux distributions put them (Debian: fonts-dejavu-core).
//! The font is looked up and registered once per process.

use std::fmt::Display;
use std::iter::once;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One contender's throughput, as in the markdown table.
pub struct Throughput {
    pub name: String,
    pub events_per_second: f64,
}

/// One latency run: a contender at one writer rate.
pub struct Latency {
    pub contender: String,
    pub rate: u32,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

const FONT_ENV: &str = "OUTBOX_RELAY_BENCH_FONT";
const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
];
const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1600, 700);
const RELAY_BLUE: RGBColor = RGBColor(31, 119, 180);
const CEILING_GREY: RGBColor = RGBColor(90, 90, 90);
const OTHER_GREY: RGBColor = RGBColor(175, 175, 175);
/// one colour per writer rate, slowest first; p99 markers are a darker shade of it
const RATE_COLOURS: &[RGBColor] = &[
    RGBColor(102, 170, 220),
    RGBColor(245, 160, 80),
    RGBColor(110, 190, 110),
    RGBColor(200, 120, 200),
];
/// past this, figures are clamped: keeps the axes' arithmetic finite on absurd input
const HUGE: f64 = 1e300;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Draws the chart into `path` (PNG). `title` goes above both panels (the machine's
/// short description). Errors say what is missing (no font found: name the paths tried
/// and the Debian package fonts-dejavu-core, or OUTBOX_RELAY_BENCH_FONT).
pub fn render_png(
    path: &Path,
    title: &str,
    throughput: &[Throughput],
    latency: &[Latency],
) -> Result<(), String> {
    register_font_once()?;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).or_say("clearing the canvas")?;
    let body = root.titled(title, (FONT, 24)).or_say("the title")?;
    let (left, right) = body.split_horizontally(SIZE.0 / 2);
    draw_throughput(&left, throughput)?;
    draw_latency(&right, latency)?;
    let writing = format!("writing {}", path.display());
    root.present().or_say(&writing)
}

/// plotters wants the font's bytes `'static`: leaked once, the outcome kept for later calls
fn register_font_once() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let registered = REGISTERED.get_or_init(|| {
        let path = find_font()?;
        let bytes = std::fs::read(&path).or_say(&format!("reading {}", path.display()))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a TrueType/OpenType font", path.display()))?;
        Ok(path)
    });
    registered.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// `OUTBOX_RELAY_BENCH_FONT` if set (then it must be a file), else the first common path
fn find_font() -> Result<PathBuf, String> {
    if let Some(chosen) = std::env::var_os(FONT_ENV).filter(|v| !v.is_empty()) {
        let chosen = PathBuf::from(chosen);
        let missing = format!("chart font: {FONT_ENV}={} is not a file", chosen.display());
        return Some(chosen).filter(|p| p.is_file()).ok_or(missing);
    }
    let found = FONT_PATHS.iter().map(PathBuf::from).find(|p| p.is_file());
    found.ok_or_else(|| {
        format!(
            "no TrueType font for the chart: tried {}; install the Debian package \
             fonts-dejavu-core, or set {FONT_ENV} to a .ttf file",
            FONT_PATHS.join(", ")
        )
    })
}

/// every drawing error becomes a `String` that says what was being drawn
trait OrSay<T> {
    fn or_say(self, what: &str) -> Result<T, String>;
}

impl<T, E: Display> OrSay<T> for Result<T, E> {
    fn or_say(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("chart: {what}: {e}"))
    }
}

fn text(size: u32, align: HPos, vertical: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font()).pos(Pos::new(align, vertical))
}

fn draw_throughput(area: &Area, throughput: &[Throughput]) -> Result<(), String> {
    let caption = "throughput, events/s (higher is better)";
    if throughput.is_empty() {
        return draw_placeholder(area, caption, "throughput not measured");
    }
    let label_width = 250;
    let rows = throughput.len() as f64;
    // non-finite and negative figures draw no bar and print "n/a"
    let figure = |t: &Throughput| finite(t.events_per_second).filter(|v| *v >= 0.0);
    let largest = throughput.iter().filter_map(figure).fold(0.0, f64::max);
    // 30 % headroom on the right for the figure printed after the longest bar; at least
    // 0..10 so that an all-zero run still gets whole ticks
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 19))
        .margin(12)
        .margin_right(24)
        .set_label_area_size(LabelAreaPosition::Left, label_width + 12)
        .set_label_area_size(LabelAreaPosition::Bottom, 40)
        .build_cartesian_2d(0.0..(largest * 1.3).max(10.0), 0.0..rows)
        .or_say("laying out the throughput panel")?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_y_mesh().y_labels(0).x_labels(6);
    let tick = |v: &f64| thousands(*v);
    mesh.x_desc("events/s").x_label_formatter(&tick);
    mesh.label_style((FONT, 14));
    mesh.draw().or_say("the throughput axes")?;
    let style = text(15, HPos::Left, VPos::Center);
    for (index, contender) in throughput.iter().enumerate() {
        let row = rows - 1.0 - index as f64; // the first contender on top
        let colour = match contender.name.as_str() {
            name if name.starts_with("relay") => RELAY_BLUE,
            name if name.starts_with("ceiling") => CEILING_GREY,
            _ => OTHER_GREY,
        };
        let events = figure(contender);
        let bar_end = events.unwrap_or(0.0);
        let bar = Rectangle::new([(0.0, row + 0.2), (bar_end, row + 0.8)], colour.filled());
        chart.draw_series(once(bar)).or_say("a throughput bar")?;
        let printed = events.map_or("n/a".into(), |v| format!("{}/s", thousands(v)));
        let (end_x, middle) = chart.backend_coord(&(bar_end, row + 0.5));
        let at = relative(area, (end_x + 6, middle));
        put(area, &printed, &style, at)?;
        let at = relative(area, (chart.backend_coord(&(0.0, row)).0 - 8, middle));
        let name_style = text(15, HPos::Right, VPos::Center);
        draw_wrapped(area, &contender.name, &name_style, (label_width, 3), at)?;
    }
    Ok(())
}

fn draw_latency(area: &Area, latency: &[Latency]) -> Result<(), String> {
    let caption = "latency commit → consumer, ms (log scale, lower is better)";
    if latency.is_empty() {
        return draw_placeholder(area, caption, "latency not measured");
    }
    // groups in the order the contenders first appear, rates ascending within each
    let mut contenders: Vec<&str> = Vec::new();
    for run in latency {
        if !contenders.contains(&run.contender.as_str()) {
            contenders.push(&run.contender);
        }
    }
    let mut rates: Vec<u32> = latency.iter().map(|r| r.rate).collect();
    rates.sort_unstable();
    rates.dedup();
    let (mut smallest, mut largest) = (f64::INFINITY, 0f64);
    let figures = |r: &Latency| [usable(r.p50_ms), usable(r.p99_ms)];
    for ms in latency.iter().flat_map(figures).flatten() {
        (smallest, largest) = (smallest.min(ms), largest.max(ms));
    }
    // whole decades, at least two, never below 0.1 ms (1 ms when there is no figure at
    // all); the smallest bar at least a third of a decade tall, and a third of a decade
    // on top keeps the highest figure clear of the legend
    let floor = (smallest.min(largest.max(1.0)).log10() - 0.3).floor();
    let low_exp = floor.clamp(-1.0, 298.0);
    let high_exp = (largest.log10() + 0.3).ceil().clamp(low_exp + 2.0, 300.0);
    let (low, high) = (10f64.powf(low_exp), 10f64.powf(high_exp));
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT, 19))
        .margin(12)
        .margin_right(20)
        .set_label_area_size(LabelAreaPosition::Left, 70)
        .set_label_area_size(LabelAreaPosition::Bottom, 60)
        .build_cartesian_2d(0.0..contenders.len() as f64, (low..high).log_scale())
        .or_say("laying out the latency panel")?;
    let mut mesh = chart.configure_mesh();
    let tick = |v: &f64| milliseconds(*v, " ms");
    mesh.disable_x_mesh().x_labels(0).y_labels(8);
    mesh.y_label_formatter(&tick).label_style((FONT, 14));
    mesh.draw().or_say("the latency axes")?;
    let slot = 0.8 / rates.len() as f64;
    let clamp = |ms: f64| ms.clamp(low, high);
    let figure_style = text(12, HPos::Center, VPos::Bottom);
    let name_style = text(15, HPos::Center, VPos::Center);
    for (group, name) in contenders.iter().enumerate() {
        for (index, rate) in rates.iter().enumerate() {
            let colour = RATE_COLOURS[index % RATE_COLOURS.len()];
            let dark = RGBColor(colour.0 / 2, colour.1 / 2, colour.2 / 2);
            let left = group as f64 + 0.1 + slot * index as f64;
            let (right, centre) = (left + slot * 0.85, left + slot * 0.425);
            let same = |r: &&Latency| r.contender == *name && r.rate == *rate;
            let run = latency.iter().rev().find(same); // the last run of a pair counts
            let (p50, p99) = run.map_or((None, None), |r| (usable(r.p50_ms), usable(r.p99_ms)));
            if let Some(p50) = p50 {
                let bar = Rectangle::new([(left, low), (right, clamp(p50))], colour.filled());
                chart.draw_series(once(bar)).or_say("a p50 bar")?;
            }
            if let Some(p99) = p99 {
                let (from, to) = (clamp(p50.unwrap_or(p99)), clamp(p99));
                let whisker =
                    PathElement::new([(centre, from), (centre, to)], dark.stroke_width(2));
                let cap = PathElement::new([(left, to), (right, to)], dark.stroke_width(4));
                chart.draw_series([whisker, cap]).or_say("a p99 marker")?;
            }
            // its figure above the highest mark, or "n/a" on the floor: nothing delivered
            let top = p99.or(p50);
            let printed = top.map_or("n/a".into(), |ms| milliseconds(ms, ""));
            let (x, y) = chart.backend_coord(&(centre, top.map_or(low, clamp)));
            let at = relative(area, (x, y - 4));
            put(area, &printed, &figure_style, at)?;
        }
        let (x, y) = chart.backend_coord(&(group as f64 + 0.5, low));
        let width = chart.backend_coord(&(1.0, low)).0 - chart.backend_coord(&(0.0, low)).0;
        let fit = ((width - 6).max(20) as u32, 2);
        draw_wrapped(area, name, &name_style, fit, relative(area, (x, y + 24)))?;
    }
    // legend along the top of the plot: the rates' colours, then the p99 marker
    let style = text(14, HPos::Left, VPos::Center);
    let (plot_x, plot_y) = chart.backend_coord(&(0.0, high));
    let (mut x, y) = relative(area, (plot_x + 10, plot_y + 14));
    let label = |rate: &u32| format!("{} events/s", thousands(f64::from(*rate)));
    let mut entries: Vec<String> = rates.iter().map(label).collect();
    entries.push("p50 bar, p99 marker".into());
    for (index, entry) in entries.iter().enumerate() {
        let swatch = match RATE_COLOURS.get(index).filter(|_| index < rates.len()) {
            Some(colour) => Rectangle::new([(x, y - 6), (x + 14, y + 6)], colour.filled()),
            None => Rectangle::new([(x, y - 2), (x + 14, y + 2)], BLACK.filled()),
        };
        area.draw(&swatch).or_say("the legend")?;
        put(area, entry, &style, (x + 20, y))?;
        x += 38 + width_of(area, entry, &style)? as i32;
    }
    Ok(())
}

fn draw_placeholder(area: &Area, caption: &str, message: &str) -> Result<(), String> {
    let (width, height) = area.dim_in_pixel();
    let (centre, middle) = (width as i32 / 2, height as i32 / 2);
    let caption_style = text(19, HPos::Center, VPos::Top);
    put(area, caption, &caption_style, (centre, 17))?; // level with the other caption
    let style = text(22, HPos::Center, VPos::Center).color(&CEILING_GREY);
    put(area, message, &style, (centre, middle))
}

fn put(area: &Area, text: &str, style: &TextStyle, at: (i32, i32)) -> Result<(), String> {
    area.draw_text(text, style, at).or_say(text)
}

fn width_of(area: &Area, text: &str, style: &TextStyle) -> Result<u32, String> {
    let size = area.estimate_text_size(text, style);
    size.map(|(width, _)| width).or_say(text)
}

/// `backend_coord` gives canvas pixels, `draw_text` on a panel wants the panel's
fn relative(area: &Area, (x, y): (i32, i32)) -> (i32, i32) {
    let (xs, ys) = area.get_pixel_range();
    (x - xs.start, y - ys.start)
}

/// `text` wrapped at words to `(max_width, max_lines)`, the lines centred vertically on
/// `anchor`; an over-long word or a line past the last is cut short with "…"
fn draw_wrapped(
    area: &Area,
    text: &str,
    style: &TextStyle,
    (max_width, max_lines): (u32, usize),
    anchor: (i32, i32),
) -> Result<(), String> {
    let fits = |s: &str| width_of(area, s, style).map(|width| width <= max_width);
    let mut lines: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        match lines.last_mut() {
            Some(line) if fits(&format!("{line} {word}"))? => *line = format!("{line} {word}"),
            _ => lines.push(word.to_string()),
        }
    }
    let cut = lines.len() > max_lines;
    lines.truncate(max_lines);
    let line_height = (style.font.get_size() * 1.25) as i32;
    let top = anchor.1 - line_height * (lines.len() as i32 - 1) / 2;
    for (index, line) in lines.iter_mut().enumerate() {
        let mut shortened = cut && index + 1 == max_lines;
        while !fits(&format!("{line}{}", if shortened { "…" } else { "" }))? && !line.is_empty() {
            line.pop();
            shortened = true;
        }
        if shortened {
            line.push('…');
        }
        let at = (anchor.0, top + line_height * index as i32);
        put(area, line, style, at)?;
    }
    Ok(())
}

/// NaN and ±infinity are no figure; absurd ones are clamped
fn finite(value: f64) -> Option<f64> {
    Some(value).filter(|v| v.is_finite()).map(|v| v.min(HUGE))
}

/// a latency that can be drawn on a log axis
fn usable(ms: Option<f64>) -> Option<f64> {
    ms.and_then(finite).filter(|ms| *ms > 0.0)
}

/// 180000 → "180,000"; absurd figures in scientific notation
fn thousands(value: f64) -> String {
    let whole = value.round();
    let (upper, lower) = ((whole / 1000.0).trunc(), whole % 1000.0);
    match whole {
        w if w >= 1e15 => format!("{w:.2e}"),
        w if w >= 1000.0 => format!("{},{lower:03}", thousands(upper)),
        w => format!("{w}"),
    }
}

/// 0.5 → "0.5", 150 → "150", 1000 → "1 s" (on the axis, with a unit), huge → "1e9"
fn milliseconds(ms: f64, unit: &str) -> String {
    match ms {
        v if v >= 1e6 => format!("{v:.0e}{unit}"),
        v if v >= 1000.0 && v % 1000.0 == 0.0 && !unit.is_empty() => format!("{} s", v / 1000.0),
        v if v >= 10.0 => format!("{v:.0}{unit}"),
        v => format!("{}{unit}", format!("{v:.1}").trim_end_matches(".0")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// renders into a temp file and checks it is a PNG of some substance; skipped
    /// (Ok, with a note) where the machine has no font
    fn render(throughput: &[Throughput], latency: &[Latency]) {
        if let Err(missing) = find_font() {
            return eprintln!("skipped: {missing}");
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("chart.png");
        render_png(&path, "test machine, 2 cores", throughput, latency).expect("rendered");
        let png = std::fs::read(&path).expect("the chart was written");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(png.len() > 5_000, "suspiciously small: {} bytes", png.len());
    }

    fn bar(name: &str, events_per_second: f64) -> Throughput {
        Throughput {
            name: name.into(),
            events_per_second,
        }
    }

    fn run(contender: &str, rate: u32, p50_ms: Option<f64>, p99_ms: Option<f64>) -> Latency {
        Latency {
            contender: contender.into(),
            rate,
            p50_ms,
            p99_ms,
        }
    }

    #[test]
    fn renders_sample_data() {
        let throughput = [
            bar("ceiling: pg_recvlogical → /dev/null", 200_000.0),
            bar("relay → Kafka (defaults)", 180_000.0),
            bar("Debezium (Kafka Connect + Outbox Event Router)", 30_000.0),
            bar("polling relay, 4 workers", 12_000.0),
        ];
        let mut latency = Vec::new();
        for rate in [1000, 5000, 20000] {
            latency.push(run("relay", rate, Some(9.0), Some(20.0)));
            latency.push(run("Debezium", rate, Some(150.0), Some(900.0)));
            let delivered = rate < 20000; // polling 1 s gives up at 20000/s
            latency.push(run("polling 1 s", rate, delivered.then_some(520.0), None));
        }
        render(&throughput, &latency);
    }

    #[test]
    fn renders_without_latency_and_twice() {
        render(&[bar("relay → Kafka (defaults)", 180_000.0)], &[]);
        render(&[], &[]); // the font is registered once, the second call finds it
    }

    #[test]
    fn survives_nan_zero_negative_and_huge_figures() {
        let odd = [f64::NAN, 0.0, -5.0, f64::INFINITY, f64::NEG_INFINITY, 1e308];
        let throughput: Vec<_> = odd.iter().map(|v| bar(&format!("relay {v}"), *v)).collect();
        let mut latency: Vec<_> = odd
            .iter()
            .map(|v| run("odd", 7, Some(*v), Some(*v)))
            .collect();
        latency.push(run("none", 0, None, None));
        latency.push(run("", u32::MAX, Some(1e-9), Some(f64::NAN)));
        latency.push(run(&"x".repeat(500), 1, Some(3.0), Some(2.0))); // p99 below p50
        render(&throughput, &latency);
        render(&[bar("ceiling", 0.0)], &[run("relay", 1000, None, None)]);
    }
}
