//! The case language of `testdata/gateway/<area>/<name>.gw`: a script of HTTP requests to etcd's gateway.
//!
//! ```text
//! # What the case shows (the first comment lines are its description).
//! @own-etcd                        # optional: a fresh etcd per target (a case that turns auth on)
//!
//! > POST /v3/kv/put                # a request: method and path
//! {"key":"<b64:<P>a>","value":"<b64:1>"}
//!
//! > POST /v3/kv/range
//! Authorization: <TOKEN>           # headers come first, `Name: value`
//! {"key":"<b64:<P>a>"}             # then the body, as many lines as it takes, sent as written
//!
//! > STREAM w POST /v3/watch        # a streamed answer kept open under the name `w`
//! {"create_request":{"key":"<b64:<P>a>"}}
//! > READ w 1                       # waits for (and records) the next line(s) of `w`
//! > CLOSE w                        # the client goes away
//! ```
//!
//! A request without body lines sends no body. In paths, header values and bodies: `<P>` is the run's key prefix,
//! `<REV+n>` a revision relative to the run's start, `<IDn:dec>` an ID seen in an earlier answer (in decimal, as
//! JSON carries it), `<TOKEN>` the token of the last `auth/authenticate` answer, and `<b64:TEXT>` the base64 of TEXT
//! once the others are resolved (`<b64:<P>a>`: the run's key `a`).

use std::path::{Path, PathBuf};

/// One case file.
#[derive(Clone, Debug)]
pub struct Case {
    /// `<area>/<name>`.
    pub id: String,
    pub path: PathBuf,
    pub description: String,
    /// Needs an etcd of its own per target (it changes cluster-wide state: auth).
    pub own_etcd: bool,
    pub steps: Vec<Step>,
}

impl Case {
    /// Its insta snapshot's name: `<area>__<name>`.
    pub fn snapshot_name(&self) -> String {
        self.id.replace('/', "__")
    }
}

/// A request as written (placeholders unresolved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    /// `None`: no body at all.
    pub body: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// A request whose whole answer is read (unary calls, and streams that end with their request body, such as
    /// `/v3/lease/keepalive`).
    Call(Request),
    /// A request whose answer stays open, read line by line under a name.
    Stream { name: String, request: Request },
    /// Wait for the next `count` lines of a stream.
    Read { name: String, count: usize },
    /// The client closes a stream.
    Close { name: String },
}

/// One step and where it is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub line: usize,
    /// As written, one item per line: the transcript shows it.
    pub text: Vec<String>,
    pub action: Action,
}

/// Every `.gw` file under `root`, sorted by id.
pub fn load_all(root: &Path) -> Result<Vec<Case>, String> {
    let mut out = Vec::new();
    let areas = std::fs::read_dir(root).map_err(|e| format!("{}: {e}", root.display()))?;
    for area in areas {
        let area = area.map_err(|e| e.to_string())?.path();
        if !area.is_dir() || area.file_name().is_some_and(|n| n == "snapshots") {
            continue;
        }
        let files = std::fs::read_dir(&area).map_err(|e| format!("{}: {e}", area.display()))?;
        for file in files {
            let file = file.map_err(|e| e.to_string())?.path();
            if file.extension().is_some_and(|e| e == "gw") {
                out.push(load(root, &file)?);
            }
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    if out.is_empty() {
        return Err(format!("no .gw case under {}", root.display()));
    }
    Ok(out)
}

fn load(root: &Path, file: &Path) -> Result<Case, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let id = file
        .strip_prefix(root)
        .map_err(|e| e.to_string())?
        .with_extension("")
        .to_string_lossy()
        .into_owned();
    parse(&id, file, &text).map_err(|e| format!("{}:{e}", file.display()))
}

/// Parses a case; errors are `LINE: message`.
pub fn parse(id: &str, path: &Path, text: &str) -> Result<Case, String> {
    let mut description = Vec::new();
    let mut own_etcd = false;
    let mut steps: Vec<Step> = Vec::new();
    // The request being written: its step, and whether its body has started (headers come before it).
    let mut open: Option<(Step, bool)> = None;
    for (i, raw) in text.lines().enumerate() {
        let number = i + 1;
        if let Some(rest) = raw.strip_prefix("> ") {
            if let Some((step, _)) = open.take() {
                steps.push(finish(step));
            }
            let (step, is_request) = step_line(number, rest.trim())?;
            if is_request {
                open = Some((step, false));
            } else {
                steps.push(step);
            }
            continue;
        }
        match &mut open {
            None => {
                let line = raw.trim();
                if let Some(c) = line.strip_prefix('#') {
                    if steps.is_empty() {
                        description.push(c.trim().to_string());
                    }
                } else if line == "@own-etcd" {
                    own_etcd = true;
                } else if !line.is_empty() {
                    return Err(format!(
                        "{number}: expected `> ` a step, `#` or `@own-etcd`, got {line:?}"
                    ));
                }
            }
            Some((step, body_started)) => {
                if raw.starts_with('#') && !*body_started {
                    continue;
                }
                let request = match &mut step.action {
                    Action::Call(r) | Action::Stream { request: r, .. } => r,
                    _ => unreachable!("only requests stay open"),
                };
                if !*body_started && let Some((name, value)) = header(raw) {
                    request.headers.push((name, value));
                    step.text.push(raw.to_string());
                    continue;
                }
                if !*body_started && raw.trim().is_empty() {
                    continue;
                }
                *body_started = true;
                let body = request.body.get_or_insert_with(String::new);
                if !body.is_empty() {
                    body.push('\n');
                }
                body.push_str(raw);
            }
        }
    }
    if let Some((step, _)) = open.take() {
        steps.push(finish(step));
    }
    if steps.is_empty() {
        return Err("0: a case needs at least one step".into());
    }
    check_stream_names(&steps)?;
    Ok(Case {
        id: id.to_string(),
        path: path.to_path_buf(),
        description: description.join(" ").trim().to_string(),
        own_etcd,
        steps,
    })
}

/// Every READ and CLOSE names a stream opened before and not closed yet; no name is opened twice at once.
fn check_stream_names(steps: &[Step]) -> Result<(), String> {
    let mut open: Vec<&str> = Vec::new();
    for step in steps {
        match &step.action {
            Action::Stream { name, .. } if open.contains(&name.as_str()) => {
                return Err(format!("{}: stream {name:?} is open already", step.line));
            }
            Action::Stream { name, .. } => open.push(name),
            Action::Read { name, .. } if !open.contains(&name.as_str()) => {
                return Err(format!("{}: no open stream {name:?}", step.line));
            }
            Action::Close { name } => {
                let before = open.len();
                open.retain(|n| n != name);
                if open.len() == before {
                    return Err(format!("{}: no open stream {name:?}", step.line));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Trailing blank lines of a body are layout, not body; the body goes into the step's text.
fn finish(mut step: Step) -> Step {
    if let Action::Call(r) | Action::Stream { request: r, .. } = &mut step.action
        && let Some(b) = &mut r.body
    {
        let trimmed = b.trim_end_matches(['\n', ' ']).to_string();
        step.text.extend(trimmed.lines().map(str::to_string));
        *b = trimmed;
    }
    step
}

fn header(line: &str) -> Option<(String, String)> {
    let (name, value) = line.split_once(": ")?;
    let ok = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then(|| (name.to_string(), value.trim().to_string()))
}

/// A `> ` line: the step, and whether it is a request (which body and header lines follow).
fn step_line(number: usize, line: &str) -> Result<(Step, bool), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let err = |m: &str| format!("{number}: {m}: {line:?}");
    let request = |method: &str, path: &str| -> Result<Request, String> {
        if !method.chars().all(|c| c.is_ascii_uppercase()) || !path.starts_with('/') {
            return Err(err("expected `METHOD /path`"));
        }
        Ok(Request {
            method: method.to_string(),
            path: path.to_string(),
            headers: Vec::new(),
            body: None,
        })
    };
    let (action, is_request) = match words.as_slice() {
        ["STREAM", name, method, path] => (
            Action::Stream {
                name: name.to_string(),
                request: request(method, path)?,
            },
            true,
        ),
        ["READ", name, count] => (
            Action::Read {
                name: name.to_string(),
                count: count.parse().map_err(|_| err("READ takes a count"))?,
            },
            false,
        ),
        ["CLOSE", name] => (
            Action::Close {
                name: name.to_string(),
            },
            false,
        ),
        [method, path] => (Action::Call(request(method, path)?), true),
        _ => {
            return Err(err(
                "expected `METHOD /path`, `STREAM name METHOD /path`, `READ name N` or `CLOSE name`",
            ));
        }
    };
    Ok((
        Step {
            line: number,
            text: vec![format!("> {line}")],
            action,
        },
        is_request,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_is_requests_with_headers_and_bodies_and_named_streams() {
        let text = "# Puts, then reads.\n# Two lines.\n@own-etcd\n\n> POST /v3/kv/put\n{\"key\":\"<b64:<P>a>\",\n \"value\":\"eA==\"}\n\n> POST /v3/kv/range\nAuthorization: <TOKEN>\n{\"key\":\"<b64:<P>a>\"}\n> GET /v3/kv/range\n> STREAM w POST /v3/watch\n{}\n> READ w 2\n> CLOSE w\n";
        let c = parse("kv/x", Path::new("x.gw"), text).unwrap();
        assert_eq!(c.description, "Puts, then reads. Two lines.");
        assert!(c.own_etcd);
        assert_eq!(c.steps.len(), 6);
        let Action::Call(put) = &c.steps[0].action else {
            panic!()
        };
        assert_eq!(
            put.body.as_deref(),
            Some("{\"key\":\"<b64:<P>a>\",\n \"value\":\"eA==\"}")
        );
        let Action::Call(range) = &c.steps[1].action else {
            panic!()
        };
        assert_eq!(
            range.headers,
            [("Authorization".to_string(), "<TOKEN>".to_string())]
        );
        assert_eq!(
            c.steps[1].text,
            [
                "> POST /v3/kv/range",
                "Authorization: <TOKEN>",
                "{\"key\":\"<b64:<P>a>\"}"
            ]
        );
        let Action::Call(get) = &c.steps[2].action else {
            panic!()
        };
        assert_eq!((get.method.as_str(), get.body.as_ref()), ("GET", None));
        assert!(matches!(&c.steps[3].action, Action::Stream { name, .. } if name == "w"));
        assert_eq!(
            c.steps[4].action,
            Action::Read {
                name: "w".into(),
                count: 2
            }
        );
        assert_eq!(c.steps[5].action, Action::Close { name: "w".into() });
        assert_eq!(c.snapshot_name(), "kv__x");
    }

    #[test]
    fn bad_lines_are_refused_with_their_line_number() {
        assert!(parse("a/b", Path::new("x"), "").is_err());
        let e = parse("a/b", Path::new("x"), "> post kv\n").unwrap_err();
        assert!(e.starts_with("1:"), "{e}");
        let e = parse("a/b", Path::new("x"), "# ok\nstray\n").unwrap_err();
        assert!(e.starts_with("2:"), "{e}");
        assert!(parse("a/b", Path::new("x"), "> READ w many\n").is_err());
        let e = parse(
            "a/b",
            Path::new("x"),
            "> STREAM w POST /v3/watch\n> READ v 1\n",
        )
        .unwrap_err();
        assert!(e.starts_with("2: no open stream"), "{e}");
        let e = parse(
            "a/b",
            Path::new("x"),
            "> STREAM w POST /v3/watch\n> CLOSE w\n> CLOSE w\n",
        )
        .unwrap_err();
        assert!(e.starts_with("3:"), "{e}");
    }
}
