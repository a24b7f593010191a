//! Scenarios as data: `testdata/conformance/<area>/<name>.scn`.
//!
//! A scenario is a sequence of lines:
//!
//! ```text
//! # comment (the first comment lines describe the scenario)
//! @own-etcd                          it changes cluster-wide state: give it a fresh etcd of its own
//! @model-unsupported: <reason>       the sim's model etcd does not implement this (listed in the report)
//! @container-unsupported: <reason>   etcd in a container cannot run it reliably (listed in the report)
//! @storage-version-settled           before its first step, wait until etcd (3.6 on) reports the storage version
//!                                    it settles on a few seconds after start (a snapshot's header carries it)
//! $ put <P>a 1                       run `etcdctl put <P>a 1`, record its exit code, stdout and stderr
//! $ txn -w json <<EOF                ... with the lines up to `EOF` on its stdin
//! & w1 $ watch <P>a                  start `etcdctl watch <P>a` in the background, named w1
//! wait w1 3                          sync point: wait until w1 printed at least 3 lines
//! wait w1 "text"                     sync point: wait until w1's stdout contains "text"
//! send w1 watch <P>b                 write a line to w1's stdin (interactive watch)
//! stop w1                            SIGTERM w1 and record everything it printed
//! exit w1                            wait until w1 exits by itself and record everything
//! kill w1 4                          SIGKILL w1 and record only its first 4 stdout lines (periodic output)
//! until "text" $ get <P>k            run the command (unrecorded) until its stdout contains "text"
//! until-not "text" $ get <P>k        ... until it no longer contains "text"
//! ```
//!
//! Arguments are split on whitespace; double or single quotes group. Placeholders: `<P>` (the scenario's key
//! prefix), `<DIR>` (its scratch directory), `<REV+n>` (the revision when it started, plus n), `<IDn>` (an ID
//! seen in earlier output).

use std::path::{Path, PathBuf};

/// How a background command ends before its output is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finish {
    Terminate,
    Exit,
    KillKeepLines(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Ctl {
        args: Vec<String>,
        stdin: Option<String>,
    },
    Spawn {
        name: String,
        args: Vec<String>,
    },
    WaitLines {
        name: String,
        lines: usize,
    },
    WaitText {
        name: String,
        text: String,
    },
    Send {
        name: String,
        line: String,
    },
    Finish {
        name: String,
        how: Finish,
    },
    Until {
        text: String,
        present: bool,
        args: Vec<String>,
    },
}

impl Step {
    /// Whether the step leaves a record in the transcript.
    pub fn is_recorded(&self) -> bool {
        matches!(self, Step::Ctl { .. } | Step::Finish { .. })
    }
}

/// One step as written, with its line number, for transcripts and error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub number: usize,
    pub source: String,
    pub step: Step,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// `<area>/<name>`, e.g. `kv/range-prefix`.
    pub id: String,
    pub path: PathBuf,
    pub description: String,
    pub own_etcd: bool,
    /// Waits for etcd's settled storage version before its first step (`@storage-version-settled`).
    pub storage_version_settled: bool,
    /// Why the model etcd cannot run it, if it cannot.
    pub model_unsupported: Option<String>,
    /// Why the testcontainers backend cannot run it, if it cannot (the process backends still do).
    pub container_unsupported: Option<String>,
    pub lines: Vec<Line>,
}

impl Scenario {
    /// The insta snapshot name: `<area>__<name>`.
    pub fn snapshot_name(&self) -> String {
        self.id.replace('/', "__")
    }

    pub fn parse(id: &str, path: &Path, text: &str) -> Result<Self, String> {
        let mut sc = Scenario {
            id: id.to_string(),
            path: path.to_path_buf(),
            description: String::new(),
            own_etcd: false,
            storage_version_settled: false,
            model_unsupported: None,
            container_unsupported: None,
            lines: Vec::new(),
        };
        let mut it = text.lines().enumerate().peekable();
        let mut in_header = true;
        while let Some((i, raw)) = it.next() {
            let number = i + 1;
            let line = raw.trim();
            let err = |m: String| format!("{}:{number}: {m}", path.display());
            if line.is_empty() {
                continue;
            }
            if let Some(c) = line.strip_prefix('#') {
                if in_header {
                    if !sc.description.is_empty() {
                        sc.description.push(' ');
                    }
                    sc.description.push_str(c.trim());
                }
                continue;
            }
            in_header = false;
            if line == "@own-etcd" {
                sc.own_etcd = true;
                continue;
            }
            if line == "@storage-version-settled" {
                sc.storage_version_settled = true;
                continue;
            }
            if let Some(reason) = line.strip_prefix("@model-unsupported:") {
                sc.model_unsupported = Some(reason.trim().to_string());
                continue;
            }
            if let Some(reason) = line.strip_prefix("@container-unsupported:") {
                sc.container_unsupported = Some(reason.trim().to_string());
                continue;
            }
            let mut source = line.to_string();
            let step = if let Some(rest) = line.strip_prefix("$ ") {
                let (cmd, heredoc) = match rest.rsplit_once("<<") {
                    Some((cmd, tag)) if is_tag(tag.trim()) => (cmd, Some(tag.trim().to_string())),
                    _ => (rest, None),
                };
                let stdin = match heredoc {
                    None => None,
                    Some(tag) => {
                        let mut body = String::new();
                        loop {
                            let Some((_, l)) = it.next() else {
                                return Err(err(format!("heredoc not closed by {tag}")));
                            };
                            if l.trim() == tag {
                                break;
                            }
                            body.push_str(l);
                            body.push('\n');
                            source.push('\n');
                            source.push_str(l);
                        }
                        source.push('\n');
                        source.push_str(&tag);
                        Some(body)
                    }
                };
                Step::Ctl {
                    args: split_args(cmd).map_err(err)?,
                    stdin,
                }
            } else if let Some(rest) = line.strip_prefix("& ") {
                let (name, cmd) = rest
                    .split_once(" $ ")
                    .ok_or_else(|| err("expected `& NAME $ ARGS`".into()))?;
                Step::Spawn {
                    name: name.trim().to_string(),
                    args: split_args(cmd).map_err(err)?,
                }
            } else if let Some(rest) = line.strip_prefix("wait ") {
                let (name, n) = rest.trim().split_once(' ').ok_or_else(|| {
                    err("expected `wait NAME LINES` or `wait NAME \"TEXT\"`".into())
                })?;
                let n = n.trim();
                if n.starts_with('"') {
                    let text = split_args(n).map_err(err)?;
                    if text.len() != 1 {
                        return Err(err("expected one quoted text".into()));
                    }
                    Step::WaitText {
                        name: name.to_string(),
                        text: text[0].clone(),
                    }
                } else {
                    Step::WaitLines {
                        name: name.to_string(),
                        lines: n.parse().map_err(|e| err(format!("lines: {e}")))?,
                    }
                }
            } else if let Some(rest) = line.strip_prefix("send ") {
                let (name, text) = rest
                    .split_once(' ')
                    .ok_or_else(|| err("expected `send NAME TEXT`".into()))?;
                Step::Send {
                    name: name.to_string(),
                    line: text.to_string(),
                }
            } else if let Some(name) = line.strip_prefix("stop ") {
                Step::Finish {
                    name: name.trim().to_string(),
                    how: Finish::Terminate,
                }
            } else if let Some(name) = line.strip_prefix("exit ") {
                Step::Finish {
                    name: name.trim().to_string(),
                    how: Finish::Exit,
                }
            } else if let Some(rest) = line.strip_prefix("kill ") {
                let (name, n) = rest
                    .trim()
                    .split_once(' ')
                    .ok_or_else(|| err("expected `kill NAME LINES`".into()))?;
                Step::Finish {
                    name: name.to_string(),
                    how: Finish::KillKeepLines(
                        n.trim().parse().map_err(|e| err(format!("lines: {e}")))?,
                    ),
                }
            } else if let Some(rest) = line
                .strip_prefix("until-not ")
                .map(|r| (r, false))
                .or_else(|| line.strip_prefix("until ").map(|r| (r, true)))
                .map(|(r, p)| (r.to_string(), p))
            {
                let (rest, present) = rest;
                let (quoted, cmd) = rest
                    .split_once(" $ ")
                    .ok_or_else(|| err("expected `until \"TEXT\" $ ARGS`".into()))?;
                let text = split_args(quoted).map_err(err)?;
                if text.len() != 1 {
                    return Err(err("expected one quoted text".into()));
                }
                Step::Until {
                    text: text[0].clone(),
                    present,
                    args: split_args(cmd).map_err(err)?,
                }
            } else {
                return Err(err(format!("unknown step {line:?}")));
            };
            sc.lines.push(Line {
                number,
                source,
                step,
            });
        }
        if !sc.lines.iter().any(|l| l.step.is_recorded()) {
            return Err(format!("{}: no recorded step", path.display()));
        }
        Ok(sc)
    }
}

fn is_tag(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_uppercase())
}

/// Splits on whitespace; double or single quotes group (no escapes inside).
pub fn split_args(s: &str) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let mut cur = String::new();
    let mut in_arg = false;
    let mut quote: Option<char> = None;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_arg = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_arg {
                    args.push(std::mem::take(&mut cur));
                    in_arg = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_arg = true;
            }
        }
    }
    if quote.is_some() {
        return Err(format!("unclosed quote in {s:?}"));
    }
    if in_arg {
        args.push(cur);
    }
    Ok(args)
}

/// Every `*.scn` under `root`, parsed, sorted by id.
pub fn load_all(root: &Path) -> Result<Vec<Scenario>, String> {
    let mut out = Vec::new();
    let areas = std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    for area in areas.flatten() {
        if !area.path().is_dir() {
            continue;
        }
        let area_name = area.file_name().to_string_lossy().into_owned();
        for file in std::fs::read_dir(area.path())
            .map_err(|e| e.to_string())?
            .flatten()
        {
            let path = file.path();
            if path.extension().is_none_or(|e| e != "scn") {
                continue;
            }
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            out.push(Scenario::parse(
                &format!("{area_name}/{name}"),
                &path,
                &text,
            )?);
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind_of_step() {
        let text = r#"# Checks a thing.
# Second line.
@own-etcd
@storage-version-settled
@model-unsupported: no auth in the model
@container-unsupported: flaky in a container
$ put <P>a "hello world"
$ txn -w json <<EOF
put <P>b 2


EOF
& w1 $ watch <P>a
wait w1 3
send w1 watch <P>b
stop w1
kill w1 4
exit w1
until "x y" $ get <P>a
until-not "x" $ get <P>a
"#;
        let sc = Scenario::parse("kv/x", Path::new("x.scn"), text).unwrap();
        assert_eq!(sc.description, "Checks a thing. Second line.");
        assert!(sc.own_etcd);
        assert!(sc.storage_version_settled);
        assert_eq!(
            sc.model_unsupported.as_deref(),
            Some("no auth in the model")
        );
        assert_eq!(
            sc.container_unsupported.as_deref(),
            Some("flaky in a container")
        );
        let steps: Vec<Step> = sc.lines.iter().map(|l| l.step.clone()).collect();
        assert_eq!(
            steps[0],
            Step::Ctl {
                args: vec!["put".into(), "<P>a".into(), "hello world".into()],
                stdin: None
            }
        );
        assert_eq!(
            steps[1],
            Step::Ctl {
                args: vec!["txn".into(), "-w".into(), "json".into()],
                stdin: Some("put <P>b 2\n\n\n".into())
            }
        );
        assert_eq!(
            steps[6],
            Step::Finish {
                name: "w1".into(),
                how: Finish::KillKeepLines(4)
            }
        );
        assert_eq!(
            steps[8],
            Step::Until {
                text: "x y".into(),
                present: true,
                args: vec!["get".into(), "<P>a".into()]
            }
        );
        assert_eq!(steps.len(), 10);
    }

    #[test]
    fn rejects_unknown_steps_and_scenarios_that_record_nothing() {
        assert!(Scenario::parse("a/b", Path::new("b.scn"), "frobnicate\n").is_err());
        assert!(Scenario::parse("a/b", Path::new("b.scn"), "# nothing\n").is_err());
    }
}
