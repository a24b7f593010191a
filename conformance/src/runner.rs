//! Runs one scenario against one target and returns its normalised transcript, with where it started and (where
//! an etcd stands behind the target) what etcd itself holds under the run's keys afterwards.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use testkit::{Background, Etcdctl, Normalizer, Output};

use crate::scenario::{Finish, Scenario, Step};

/// How long a sync point (`wait`, `until`) may take.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

/// What one recorded step showed, normalised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Record {
    /// The step as written in the scenario (with its heredoc), one line per item.
    pub step: Vec<String>,
    /// The exit code; absent for a background command killed on purpose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit: Option<i32>,
    /// Normalised output, one line per item (readable in snapshots).
    pub stdout: Vec<String>,
    pub stderr: Vec<String>,
}

fn lines(s: &str) -> Vec<String> {
    s.lines().map(str::to_string).collect()
}

/// Everything a scenario showed on one target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Transcript {
    pub scenario: String,
    pub records: Vec<Record>,
}

/// Where a scenario runs: an etcdctl for the target's endpoint, its key prefix and scratch directory, and where
/// etcd keeps what it writes.
pub struct Place {
    pub ctl: Etcdctl,
    pub prefix: String,
    pub dir: String,
    /// Read on etcd itself after the run; `None` where no etcd stands behind the target (the model).
    pub stored: Option<Stored>,
    /// The storage version to wait for before the first step (`@storage-version-settled`, etcd 3.6 on).
    pub storage_version: Option<&'static str>,
}

/// Where etcd itself keeps the keys a run writes: read after the run on etcd, not through the target, so that
/// a proxy that rewrites keys (a namespace) is seen to keep them where it should.
pub struct Stored {
    /// etcdctl on etcd itself.
    pub ctl: Etcdctl,
    /// The run's prefix as etcd keeps it: the proxy's namespace, then the run's prefix (written `<P>`).
    pub root: String,
    /// Read every key etcd holds (a fresh etcd of the run's own), not only those under `root`: a key outside
    /// it shows as it is.
    pub whole_keyspace: bool,
}

/// Runs `args` (unrecorded) until its stdout contains `text` (`present`) or no longer does, within
/// [`SYNC_TIMEOUT`].
async fn until(ctl: &Etcdctl, args: &[String], text: &str, present: bool) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + SYNC_TIMEOUT;
    loop {
        let out = ctl.run(args, None).await;
        if out.code == Some(0) && out.stdout.contains(text) == present {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "condition not met within {SYNC_TIMEOUT:?}; last: {out:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until etcd's Status reports storage version `version`, which etcd 3.6+ settles on a few seconds after
/// start (reporting none, then an older one, until then).
async fn settle_storage_version(ctl: &Etcdctl, version: &str) -> Result<(), String> {
    let args = ["endpoint", "status", "-w", "json"].map(String::from);
    let text = format!("\"storageVersion\":\"{version}\"");
    until(ctl, &args, &text, true)
        .await
        .map_err(|e| format!("waiting for storage version {version}: {e}"))
}

/// One run of a scenario on one target.
#[derive(Clone, Debug)]
pub struct Played {
    /// What the target answered: compared between targets, `direct`'s checked against its snapshot.
    pub transcript: Transcript,
    /// The revision the target reported as the run started (`<REV+0>`): the transcript's revisions are relative
    /// to it, so two runs on fresh etcds that agree here and in their transcripts agree in absolute revisions.
    pub start_revision: i64,
    /// What etcd held after the run ([`Stored`]), one key per line, normalised like the transcript (keys under
    /// the root as `<P>`, revisions relative to the start); `None` without a [`Stored`].
    pub stored: Option<Vec<String>>,
}

/// The current revision, read through the target itself.
pub async fn current_revision(ctl: &Etcdctl, prefix: &str) -> Result<i64, String> {
    let args = ["get", prefix, "-w", "json"].map(String::from);
    let out = ctl.run(&args, None).await;
    if out.code != Some(0) {
        return Err(format!(
            "reading the current revision failed: {}{}",
            out.stdout, out.stderr
        ));
    }
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim())
        .map_err(|e| format!("reading the current revision: {e}: {}", out.stdout))?;
    v["header"]["revision"]
        .as_i64()
        .ok_or_else(|| format!("no header.revision in {}", out.stdout))
}

fn resolve_all(norm: &Normalizer, args: &[String]) -> Result<Vec<String>, String> {
    args.iter().map(|a| norm.resolve(a)).collect()
}

fn keep_lines(s: &str, n: usize) -> String {
    s.split_inclusive('\n').take(n).collect()
}

/// Runs `scenario` at `place`. An `Err` means the scenario could not be carried out (a sync point timed out,
/// a placeholder was unknown, etcd could not be read afterwards); differing output is not an error here but a
/// different transcript.
pub async fn run(scenario: &Scenario, place: &Place) -> Result<Played, String> {
    if let Some(version) = place.storage_version {
        settle_storage_version(&place.ctl, version).await?;
    }
    let base = current_revision(&place.ctl, &place.prefix).await?;
    let mut norm = Normalizer::new(place.prefix.clone(), place.dir.clone(), base);
    let mut bg: BTreeMap<String, Background> = BTreeMap::new();
    let mut records = Vec::new();
    for line in &scenario.lines {
        let at = |m: String| format!("{}:{}: {m}", scenario.path.display(), line.number);
        match &line.step {
            Step::Ctl { args, stdin } => {
                let args = resolve_all(&norm, args).map_err(at)?;
                let stdin = stdin
                    .as_deref()
                    .map(|s| norm.resolve(s))
                    .transpose()
                    .map_err(at)?;
                let out = place.ctl.run(&args, stdin.as_deref()).await;
                if out.hung {
                    return Err(at(format!(
                        "the command did not end; the harness killed it:\n{out}"
                    )));
                }
                records.push(record(&mut norm, &line.source, &out, None));
            }
            Step::Spawn { name, args } => {
                let args = resolve_all(&norm, args).map_err(at)?;
                let child = place.ctl.spawn(&args).map_err(at)?;
                bg.insert(name.clone(), child);
            }
            Step::WaitLines { name, lines } => {
                let child = bg
                    .get_mut(name)
                    .ok_or_else(|| at(format!("no background {name}")))?;
                child
                    .wait_lines(*lines, SYNC_TIMEOUT)
                    .await
                    .map_err(|e| at(format!("{name}: {e}")))?;
            }
            Step::WaitText { name, text } => {
                let text = norm.resolve(text).map_err(at)?;
                let child = bg
                    .get_mut(name)
                    .ok_or_else(|| at(format!("no background {name}")))?;
                child
                    .wait_contains(&text, SYNC_TIMEOUT)
                    .await
                    .map_err(|e| at(format!("{name}: {e}")))?;
            }
            Step::Send { name, line: text } => {
                let text = norm.resolve(text).map_err(at)?;
                let child = bg
                    .get_mut(name)
                    .ok_or_else(|| at(format!("no background {name}")))?;
                child.write_stdin(&format!("{text}\n")).await.map_err(at)?;
            }
            Step::Finish { name, how } => {
                let child = bg
                    .remove(name)
                    .ok_or_else(|| at(format!("no background {name}")))?;
                let (out, keep) = match how {
                    Finish::Terminate => (child.terminate().await, None),
                    Finish::Exit => (child.wait_exit().await, None),
                    Finish::KillKeepLines(n) => (child.kill().await, Some(*n)),
                };
                // A hang is not an answer to compare: two targets that both hang must not agree.
                if out.hung {
                    return Err(at(format!(
                        "{name} did not end; the harness killed it:\n{out}"
                    )));
                }
                records.push(record(&mut norm, &line.source, &out, keep));
            }
            Step::Until {
                text,
                present,
                args,
            } => {
                let args = resolve_all(&norm, args).map_err(at)?;
                let text = norm.resolve(text).map_err(at)?;
                until(&place.ctl, &args, &text, *present)
                    .await
                    .map_err(at)?;
            }
        }
    }
    if let Some(name) = bg.keys().next() {
        return Err(format!(
            "{}: background {name} was never stopped (end it with stop/exit/kill)",
            scenario.path.display()
        ));
    }
    let stored = match &place.stored {
        Some(at) => Some(stored(at, &place.dir, base).await?),
        None => None,
    };
    Ok(Played {
        transcript: Transcript {
            scenario: scenario.id.clone(),
            records,
        },
        start_revision: base,
        stored,
    })
}

/// The keys etcd holds under `at.root` (or all of them), one normalised JSON line each, revisions relative to
/// `base`. The response header is left out: it tells when the read happened, not what the run wrote.
async fn stored(at: &Stored, dir: &str, base: i64) -> Result<Vec<String>, String> {
    let key = if at.whole_keyspace { "" } else { &at.root };
    let args = ["get", key, "--prefix", "-w", "json"];
    let out = at.ctl.run(&args, None).await;
    let failed = || {
        format!(
            "reading etcd itself after the run (get {key:?} --prefix) failed: {}{}",
            out.stdout, out.stderr
        )
    };
    if out.code != Some(0) {
        return Err(failed());
    }
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).map_err(|_| failed())?;
    let mut norm = Normalizer::new(at.root.clone(), dir, base);
    let kvs = v["kvs"].as_array().map_or(&[][..], Vec::as_slice);
    Ok(kvs.iter().map(|kv| norm.stdout(&kv.to_string())).collect())
}

fn record(norm: &mut Normalizer, source: &str, out: &Output, keep: Option<usize>) -> Record {
    match keep {
        None => Record {
            step: lines(source),
            exit: out.code,
            stdout: lines(&norm.stdout(&out.stdout)),
            stderr: lines(&norm.stderr(&out.stderr)),
        },
        // A command killed on purpose: its exit code and stderr mean nothing, and it may have printed a
        // varying number of periodic lines.
        Some(n) => Record {
            step: lines(source),
            exit: None,
            stdout: lines(&norm.stdout(&keep_lines(&out.stdout, n))),
            stderr: Vec::new(),
        },
    }
}
