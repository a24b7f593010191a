//! Writing a [`Report`]: `<name>.json` (everything), `<name>.md` (tables, and the issues' [`targets`] when the
//! run checks them) and SVG charts; and two reports side by side ([`compare`]): `<base>-vs-<other>.md`.

pub mod charts;
pub mod compare;
pub mod table;
pub mod targets;

use std::path::{Path, PathBuf};

use crate::results::Report;

/// Writes a mode's report as `<name>.md` (`markdown`) and `<name>.json` (`report`) into `dir`; returns their paths.
/// The one writer of `bench list`, `failover`, `tree` and `gateway`.
pub fn write_md_json<T: serde::Serialize>(
    dir: &Path,
    name: &str,
    markdown: String,
    report: &T,
) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let md = dir.join(format!("{name}.md"));
    let json = dir.join(format!("{name}.json"));
    std::fs::write(&md, markdown).map_err(|e| format!("write {}: {e}", md.display()))?;
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(&json, text).map_err(|e| format!("write {}: {e}", json.display()))?;
    Ok(vec![md, json])
}

/// Writes all outputs into `dir`; returns the paths written.
pub fn write(report: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let json = dir.join(format!("{}.json", report.name));
    std::fs::write(
        &json,
        serde_json::to_string_pretty(report).map_err(std::io::Error::other)?,
    )?;
    let mut written = vec![json];
    written.extend(write_rendered(report, dir)?);
    Ok(written)
}

/// Writes the markdown and the charts only (the JSON is the source; parsing it back is not bit-exact for
/// floats, so re-rendering leaves it alone).
pub fn write_rendered(report: &Report, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let markdown = dir.join(format!("{}.md", report.name));
    std::fs::write(&markdown, table::markdown(report))?;
    written.push(markdown);
    written.extend(charts::draw_all(report, dir)?);
    Ok(written)
}

/// Writes the comparison of two runs as `<base name>-vs-<other name>.md` into `dir`; returns its path.
pub fn write_comparison(base: &Report, other: &Report, dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}-vs-{}.md", base.name, other.name));
    std::fs::write(&path, compare::markdown(base, other))?;
    Ok(path)
}
