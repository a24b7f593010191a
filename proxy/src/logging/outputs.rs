//! `--log-outputs`: where log lines go, with the values etcd's server takes: `default` (stderr), `stderr`,
//! `stdout`, or file paths, comma-separated; every line goes to each of them. `/dev/null` among them discards
//! everything (as zap does). `systemd/journal` is refused: this proxy does not write to journald itself (under
//! systemd, its stderr reaches the journal anyway).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::sync::Arc;

/// One place lines are written to.
#[derive(Clone, Debug)]
enum Output {
    Stderr,
    Stdout,
    File(Arc<File>),
}

/// Every place lines are written to (none: discarded).
#[derive(Clone, Debug)]
pub struct LogOutputs {
    outputs: Vec<Output>,
}

/// What `--log-outputs` names, before any file is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Stderr,
    Stdout,
    File(String),
}

/// The targets `value` names: etcd's rules (duplicates once, `default` alone, `/dev/null` discards all).
pub fn parse(value: &str) -> Result<Vec<Target>, String> {
    let mut names: Vec<&str> = value.split(',').filter(|v| !v.is_empty()).collect();
    if names.is_empty() {
        names.push("default");
    }
    names.sort_unstable();
    names.dedup();
    if names.len() > 1 && names.contains(&"default") {
        return Err("--log-outputs: multi logoutput for \"default\" is not supported yet".into());
    }
    if names.contains(&"systemd/journal") {
        return Err(
            "--log-outputs=systemd/journal is not supported: use stderr, which systemd sends to the journal".into(),
        );
    }
    if names.contains(&"/dev/null") {
        return Ok(Vec::new());
    }
    Ok(names
        .into_iter()
        .map(|name| match name {
            "default" | "stderr" => Target::Stderr,
            "stdout" => Target::Stdout,
            path => Target::File(path.to_string()),
        })
        .collect())
}

impl LogOutputs {
    /// Opens the files among `targets` (appending, created if missing, as zap opens them).
    pub fn open(targets: &[Target]) -> Result<Self, String> {
        let mut outputs = Vec::new();
        for target in targets {
            outputs.push(match target {
                Target::Stderr => Output::Stderr,
                Target::Stdout => Output::Stdout,
                Target::File(path) => {
                    let file = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .map_err(|e| format!("--log-outputs: cannot open {path}: {e}"))?;
                    Output::File(Arc::new(file))
                }
            });
        }
        Ok(Self { outputs })
    }
}

/// Writes each line it is given to every output (a line that one output refuses still reaches the others).
pub struct Tee<'a> {
    outputs: &'a [Output],
}

impl Write for Tee<'_> {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        for output in self.outputs {
            let _ = match output {
                Output::Stderr => io::stderr().lock().write_all(line),
                Output::Stdout => io::stdout().lock().write_all(line),
                Output::File(file) => (&**file).write_all(line),
            };
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogOutputs {
    type Writer = Tee<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Tee {
            outputs: &self.outputs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_and_empty_are_stderr() {
        assert_eq!(parse("default"), Ok(vec![Target::Stderr]));
        assert_eq!(parse(""), Ok(vec![Target::Stderr]));
    }

    #[test]
    fn several_outputs_each_once() {
        assert_eq!(
            parse("stdout,/var/log/p.log,stderr,stdout"),
            Ok(vec![
                Target::File("/var/log/p.log".into()),
                Target::Stderr,
                Target::Stdout
            ])
        );
    }

    #[test]
    fn default_does_not_combine_and_dev_null_discards_all() {
        assert_eq!(
            parse("default,stdout").unwrap_err(),
            "--log-outputs: multi logoutput for \"default\" is not supported yet"
        );
        assert_eq!(parse("stderr,/dev/null"), Ok(vec![]));
        assert!(
            parse("systemd/journal")
                .unwrap_err()
                .contains("not supported")
        );
    }

    #[test]
    fn every_file_receives_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.log");
        let b = dir.path().join("b.log");
        std::fs::write(&a, "before\n").unwrap();
        let targets = [
            Target::File(a.display().to_string()),
            Target::File(b.display().to_string()),
        ];
        let outputs = LogOutputs::open(&targets).unwrap();
        let mut tee = tracing_subscriber::fmt::MakeWriter::make_writer(&outputs);
        tee.write_all(b"one\n").unwrap();
        tee.write_all(b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&a).unwrap(), "before\none\ntwo\n");
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "one\ntwo\n");
    }

    #[test]
    fn a_file_that_cannot_be_opened_is_one_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("p.log");
        let err = LogOutputs::open(&[Target::File(path.display().to_string())]).unwrap_err();
        assert!(
            err.starts_with(&format!("--log-outputs: cannot open {}: ", path.display())),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }
}
