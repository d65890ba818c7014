//! What a run leaves: the markdown table on stdout, results.json (and `--json`'s copy)
//! and chart.png in `--out-dir`, and `--redraw`'s chart from an earlier results.json.

use std::path::{Path, PathBuf};

use crate::report::{self, Report};
use crate::{log, Options};

/// Prints the table and writes the JSON and the chart of `report`.
pub fn write(report: &Report, out_dir: &Path, json_copy: Option<&Path>) -> Result<(), String> {
    print!("{}", report::markdown(report));
    let json = serde_json::to_string_pretty(report).map_err(|err| err.to_string())?;
    let json_paths =
        std::iter::once(out_dir.join("results.json")).chain(json_copy.map(Path::to_path_buf));
    for path in json_paths {
        std::fs::write(&path, &json).map_err(|err| format!("writing {}: {err}", path.display()))?;
        log(&format!("wrote {}", path.display()));
    }
    // Drawn from the JSON just written, the way --redraw draws it.
    let chart_path = out_dir.join("chart.png");
    let drawn = serde_json::to_value(report)
        .ok()
        .as_ref()
        .and_then(report::chart_from_json)
        .ok_or_else(|| "the results lack the chart's figures".to_owned())
        .and_then(|(title, throughput, latency)| {
            outbox_relay_harness::chart::render_png(&chart_path, &title, &throughput, &latency)
        });
    match drawn {
        Ok(()) => log(&format!("wrote {}", chart_path.display())),
        // The table and the JSON stand without it; say why it is missing.
        Err(err) => log(&format!("no chart: {err}")),
    }
    Ok(())
}

/// `--out-dir`, created.
pub fn out_dir(options: &Options) -> Result<PathBuf, String> {
    let dir = options
        .out_dir
        .clone()
        .unwrap_or_else(|| outbox_relay_harness::repo_root().join("target/side-by-side"));
    std::fs::create_dir_all(&dir).map_err(|err| format!("creating {}: {err}", dir.display()))?;
    Ok(dir)
}

/// `--redraw`: chart.png from an earlier run's results.json.
pub fn redraw(results: &std::path::Path, options: &Options) -> Result<(), String> {
    let text = std::fs::read_to_string(results)
        .map_err(|err| format!("reading {}: {err}", results.display()))?;
    let report: serde_json::Value = serde_json::from_str(&text)
        .map_err(|err| format!("{} is not JSON: {err}", results.display()))?;
    let (title, throughput, latency) = report::chart_from_json(&report).ok_or_else(|| {
        format!(
            "{} is not a results.json of this benchmark",
            results.display()
        )
    })?;
    let out_dir = out_dir(options)?;
    let path = out_dir.join("chart.png");
    outbox_relay_harness::chart::render_png(&path, &title, &throughput, &latency)?;
    log(&format!("wrote {}", path.display()));
    Ok(())
}
