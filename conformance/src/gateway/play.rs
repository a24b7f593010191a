//! One gateway case on one target (direct etcd, or the front proxy of a profile): every step resolved for the
//! target, sent with `curl`, and its answer normalised into the case's transcript.
//!
//! Normalised like the etcdctl suite's output (the kit's [`Normalizer`], one set of rules): the run's prefix as
//! `<P>`, revisions relative to the run's start, cluster, member and lease IDs as `<IDn>`, raft terms and sizes
//! redacted, base64 keys and values decoded. Beyond those, an auth token (random by nature) is `<TOKEN>`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use base64::Engine as _;
use regex::Regex;
use serde::Serialize;
use serde_json::Value;
use testkit::Normalizer;

use super::case::{Action, Case, Request};
use super::curl::{self, Answer, Http, Server, Stream};

static BASE64: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"<b64:([^<>]*)>").expect("a valid regex"));

/// One step's answer, normalised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Record {
    /// The step as written.
    pub step: Vec<String>,
    /// The HTTP status (requests and streams only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// Each JSON value of the answer (a stream's lines, one each) as compact JSON with sorted keys; a body that
    /// is not JSON as its text.
    pub answer: Vec<String>,
}

/// Everything a case showed on one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transcript {
    pub case: String,
    pub records: Vec<Record>,
}

/// One run of a case.
#[derive(Clone, Debug)]
pub struct Played {
    pub transcript: Transcript,
    /// The revision read through the target as the run started (`<REV+0>`).
    pub start_revision: i64,
}

/// The state of a run: the normaliser, the last token, the open streams.
struct Run {
    norm: Normalizer,
    token: Option<String>,
}

impl Run {
    fn resolve(&self, text: &str) -> Result<String, String> {
        let mut s = self.norm.resolve(text)?;
        if s.contains("<TOKEN>") {
            let token = self
                .token
                .as_deref()
                .ok_or("<TOKEN> before any auth/authenticate answer")?;
            s = s.replace("<TOKEN>", token);
        }
        Ok(BASE64
            .replace_all(&s, |c: &regex::Captures<'_>| {
                base64::engine::general_purpose::STANDARD.encode(c[1].as_bytes())
            })
            .into_owned())
    }

    fn request(&self, r: &Request) -> Result<Http, String> {
        Ok(Http {
            method: r.method.clone(),
            path: self.resolve(&r.path)?,
            headers: r
                .headers
                .iter()
                .map(|(n, v)| Ok((n.clone(), self.resolve(v)?)))
                .collect::<Result<_, String>>()?,
            body: r.body.as_deref().map(|b| self.resolve(b)).transpose()?,
        })
    }

    /// A body's JSON values, each normalised (a token kept for `<TOKEN>` first); a body that is not a sequence of
    /// JSON values is kept as its text.
    fn values(&mut self, body: &str) -> Vec<String> {
        let parsed: Result<Vec<Value>, _> = serde_json::Deserializer::from_str(body)
            .into_iter::<Value>()
            .collect();
        match parsed {
            Ok(values) if !values.is_empty() => values
                .into_iter()
                .map(|mut v| {
                    if let Some(t) = v.get("token").and_then(Value::as_str) {
                        self.token = Some(t.to_string());
                        v["token"] = Value::String("<TOKEN>".into());
                    }
                    self.norm.gateway_json(&mut v);
                    v.to_string()
                })
                .collect(),
            _ => body.lines().map(str::to_string).collect(),
        }
    }

    fn answered(&mut self, step: Vec<String>, a: Answer) -> Record {
        Record {
            step,
            status: Some(a.status),
            content_type: Some(a.content_type),
            answer: self.values(&a.body),
        }
    }
}

/// A request that got no HTTP answer: curl's message, without the port (which differs by run).
fn no_answer(step: Vec<String>, error: &str) -> Record {
    static PORT: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"127\.0\.0\.1:\d+").expect("a valid regex"));
    Record {
        step,
        status: None,
        content_type: None,
        answer: vec![format!(
            "<no answer: {}>",
            PORT.replace_all(error.trim(), "127.0.0.1:<PORT>")
        )],
    }
}

/// The current revision, read through the target's gateway: a range of the run's prefix.
async fn start_revision(server: &Server, prefix: &str) -> Result<i64, String> {
    let key = base64::engine::general_purpose::STANDARD.encode(prefix.as_bytes());
    let req = Http {
        method: "POST".into(),
        path: "/v3/kv/range".into(),
        headers: Vec::new(),
        body: Some(format!("{{\"key\":\"{key}\"}}")),
    };
    let a = curl::call(server, &req).await?;
    let v: Value = serde_json::from_str(&a.body).map_err(|e| {
        format!(
            "reading the start revision through the gateway: HTTP {}, {e}: {}",
            a.status,
            a.body.trim()
        )
    })?;
    v["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .ok_or_else(|| {
            format!(
                "reading the start revision: no header.revision in {}",
                a.body.trim()
            )
        })
}

/// Plays `case` on `server` under `prefix`. An `Err` is a case that could not be carried out (curl failed, a
/// placeholder was unknown, the start revision could not be read); different answers are a different transcript.
pub async fn play(case: &Case, server: &Server, prefix: &str) -> Result<Played, String> {
    let base = start_revision(server, prefix).await?;
    let mut run = Run {
        norm: Normalizer::new(prefix, "", base),
        token: None,
    };
    let mut streams: BTreeMap<String, Stream> = BTreeMap::new();
    let mut records = Vec::new();
    for step in &case.steps {
        let at = |m: String| format!("{}:{}: {m}", case.path.display(), step.line);
        match &step.action {
            Action::Call(r) => {
                let req = run.request(r).map_err(at)?;
                match curl::call(server, &req).await {
                    Ok(answer) => records.push(run.answered(step.text.clone(), answer)),
                    // No HTTP answer (a reset stream, a closed connection) is an answer too, which direct etcd
                    // does not give: recorded, so that the rest of the case still runs and shows.
                    Err(e) => records.push(no_answer(step.text.clone(), &e)),
                }
            }
            Action::Stream { name, request } => {
                let req = run.request(request).map_err(at)?;
                let stream = match Stream::open(server, &req).await {
                    Ok(s) => s,
                    Err(e) => {
                        records.push(no_answer(step.text.clone(), &e));
                        continue;
                    }
                };
                records.push(Record {
                    step: step.text.clone(),
                    status: Some(stream.status),
                    content_type: Some(stream.content_type.clone()),
                    answer: Vec::new(),
                });
                streams.insert(name.clone(), stream);
            }
            Action::Read { name, count } => {
                // A stream that could not be opened has its failure recorded already: its reads read nothing.
                let lines = match streams.get_mut(name) {
                    Some(stream) => stream.read(*count).await,
                    None => Vec::new(),
                };
                let mut answer: Vec<String> = lines.iter().flat_map(|l| run.values(l)).collect();
                if lines.len() < *count {
                    answer.push(format!(
                        "<only {} of {count} lines within {:?}>",
                        lines.len(),
                        curl::TIMEOUT
                    ));
                }
                records.push(Record {
                    step: step.text.clone(),
                    status: None,
                    content_type: None,
                    answer,
                });
            }
            Action::Close { name } => {
                if let Some(stream) = streams.remove(name) {
                    stream.close().await;
                }
                records.push(Record {
                    step: step.text.clone(),
                    status: None,
                    content_type: None,
                    answer: Vec::new(),
                });
            }
        }
    }
    for (_, s) in streams {
        s.close().await;
    }
    Ok(Played {
        transcript: Transcript {
            case: case.id.clone(),
            records,
        },
        start_revision: base,
    })
}

/// A transcript as lines, for diffs.
pub fn render(t: &Transcript) -> String {
    let mut s = String::new();
    for r in &t.records {
        for l in &r.step {
            s.push_str(&format!("step: {l}\n"));
        }
        if let Some(st) = r.status {
            s.push_str(&format!(
                "status: {st} {}\n",
                r.content_type.as_deref().unwrap_or("")
            ));
        }
        for a in &r.answer {
            s.push_str(&format!("  | {a}\n"));
        }
    }
    s
}
