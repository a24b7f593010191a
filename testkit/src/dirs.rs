//! Temporary directories for etcd data, logs and scratch files, and reading the end of a log.

use std::path::Path;

/// A temporary directory, on tmpfs (`/dev/shm`) when there is one so that etcd's fsyncs cost little; removed when
/// dropped, so a failing test cleans up too.
pub fn temp_dir(prefix: &str) -> std::io::Result<tempfile::TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return Ok(dir);
    }
    builder.tempdir()
}

/// The last `n` lines of a file, for failure reports (empty if it cannot be read).
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    last_lines(&text, n)
}

/// The last `n` lines of `text`.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a", 5), "a");
        assert_eq!(last_lines("", 3), "");
    }

    #[test]
    fn a_temp_dir_is_removed_when_dropped() {
        let dir = temp_dir("testkit-dirs-").expect("temp dir");
        let path = dir.path().to_path_buf();
        std::fs::write(path.join("f"), "x").expect("write");
        assert!(path.join("f").exists());
        drop(dir);
        assert!(!path.exists(), "{} outlived its guard", path.display());
    }
}
