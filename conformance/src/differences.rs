//! `testdata/conformance/differences.txt`: the scenarios where the proxy answers differently from etcd by
//! design. One entry per line, `<area>/<name>: <reason>`, or `<area>/<name>@<etcd version>: <reason>` for one version only; `#` starts a comment. An entry is a decision, not a
//! shrug. A listed scenario that answers like etcd passes with a note on stderr (an intermittent defect must not
//! make CI flaky); remove the entry once its cause is fixed.

use std::collections::BTreeMap;
use std::path::Path;

/// Scenario id → the reason the proxy differs there.
pub fn load(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (id, reason) = line.split_once(':').ok_or_else(|| {
            format!(
                "{}:{}: expected `<area>/<name>: <reason>`",
                path.display(),
                i + 1
            )
        })?;
        if reason.trim().is_empty() {
            return Err(format!(
                "{}:{}: an entry needs its reason",
                path.display(),
                i + 1
            ));
        }
        out.insert(id.trim().to_string(), reason.trim().to_string());
    }
    Ok(out)
}
