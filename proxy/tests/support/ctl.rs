//! Running the real `etcdctl` (API v3): one-shot commands with a timeout, and long-running
//! commands in the background (`watch`, `lease keep-alive`, `lock`, `elect`) whose output is
//! collected as it arrives.

use std::fmt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};

use super::{etcdctl_bin, try_wait_for};

/// A one-shot `etcdctl` that has not finished by then is killed and reported as hung.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a background command may take to produce what a test waits for.
pub const BG_WAIT: Duration = Duration::from_secs(30);

/// What one `etcdctl` run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtlOutput {
    /// The exit code; `None` when it was ended by a signal (or hung and was killed).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CtlOutput {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for CtlOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "exit code: {:?}", self.code)?;
        writeln!(f, "stdout:\n{}", indent(&self.stdout))?;
        write!(f, "stderr:\n{}", indent(&self.stderr))
    }
}

pub(crate) fn indent(s: &str) -> String {
    if s.is_empty() {
        return "    <empty>".to_string();
    }
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn command(endpoint: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(etcdctl_bin());
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `etcdctl --endpoints=ENDPOINT ARGS...` with `stdin` (or an empty stdin), and returns
/// its exit code and output. A run that outlives [`CTL_TIMEOUT`] is killed and reported with
/// `code: None` and a note on stderr.
pub async fn etcdctl(endpoint: &str, args: &[&str], stdin: Option<&str>) -> CtlOutput {
    let mut cmd = command(endpoint, args);
    cmd.stdin(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", etcdctl_bin()));
    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.unwrap_or("").as_bytes().to_vec();
    let writer = tokio::spawn(async move {
        // etcdctl may exit without reading everything; a broken pipe is not our failure.
        let _ = input.write_all(&data).await;
        let _ = input.shutdown().await;
    });
    let result = tokio::time::timeout(CTL_TIMEOUT, child.wait_with_output()).await;
    let _ = writer.await;
    match result {
        Ok(Ok(out)) => CtlOutput {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("waiting for etcdctl {args:?}: {e}"),
        // Dropping the timed-out future dropped the child, which kill_on_drop killed.
        Err(_) => CtlOutput {
            code: None,
            stdout: String::new(),
            stderr: format!("<harness: etcdctl {args:?} did not finish within {CTL_TIMEOUT:?}>"),
        },
    }
}

/// Like [`etcdctl`], but panics unless the command succeeded; returns its stdout.
pub async fn etcdctl_ok(endpoint: &str, args: &[&str]) -> String {
    let out = etcdctl(endpoint, args, None).await;
    assert!(
        out.success(),
        "etcdctl --endpoints={endpoint} {args:?} failed:\n{out}"
    );
    out.stdout
}

/// A long-running `etcdctl` whose stdout and stderr are collected in the background. Dropping
/// it kills the process.
pub struct Background {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn collect(mut from: impl AsyncRead + Unpin + Send + 'static, into: Arc<Mutex<String>>) {
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => into
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
    });
}

impl Background {
    /// Starts `etcdctl --endpoints=ENDPOINT ARGS...` with a pipe on stdin that stays open
    /// until [`Background::close_stdin`] or the end.
    pub fn spawn(endpoint: &str, args: &[&str]) -> Self {
        let mut cmd = command(endpoint, args);
        cmd.stdin(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", etcdctl_bin()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        collect(child.stdout.take().expect("piped stdout"), stdout.clone());
        collect(child.stderr.take().expect("piped stderr"), stderr.clone());
        Self {
            label: format!("etcdctl --endpoints={endpoint} {}", args.join(" ")),
            stdin: child.stdin.take(),
            child,
            stdout,
            stderr,
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    /// Everything it printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Everything it printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn describe(&self) -> String {
        format!(
            "`{}`\nstdout so far:\n{}\nstderr so far:\n{}",
            self.label,
            indent(&self.stdout()),
            indent(&self.stderr())
        )
    }

    /// Writes to its stdin (e.g. commands for `watch -i`).
    pub async fn write_stdin(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        stdin
            .write_all(text.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("write to stdin of `{}`: {e}", self.label));
        stdin.flush().await.expect("flush stdin");
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits (with a deadline) until its stdout has at least `n` complete lines; returns them.
    pub async fn wait_lines(&mut self, n: usize) -> Vec<String> {
        let res = try_wait_for(BG_WAIT, || {
            let out = self.stdout();
            let exited = self.child.try_wait().ok().flatten();
            async move {
                let lines: Vec<String> = complete_lines(&out);
                if lines.len() >= n {
                    Ok(lines)
                } else if let Some(status) = exited {
                    Err(format!(
                        "the process exited ({status}) with {} lines",
                        lines.len()
                    ))
                } else {
                    Err(format!("{} of {n} lines", lines.len()))
                }
            }
        })
        .await;
        res.unwrap_or_else(|last| {
            panic!(
                "timed out waiting for {n} lines from {}\nlast seen: {last}",
                self.describe()
            )
        })
    }

    /// Waits (with a deadline) until its stdout contains `needle`.
    pub async fn wait_contains(&mut self, needle: &str) {
        let res = try_wait_for(BG_WAIT, || {
            let out = self.stdout();
            let exited = self.child.try_wait().ok().flatten();
            async move {
                if out.contains(needle) {
                    Ok(())
                } else if let Some(status) = exited {
                    Err(format!("the process exited ({status})"))
                } else {
                    Err("not yet".to_string())
                }
            }
        })
        .await;
        if let Err(last) = res {
            panic!(
                "timed out waiting for {needle:?} from {}\nlast seen: {last}",
                self.describe()
            );
        }
    }

    /// Whether the process has exited already.
    pub fn has_exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    /// Waits (with a deadline) for the process to exit by itself, then returns what it did.
    pub async fn wait_exit(mut self) -> CtlOutput {
        match tokio::time::timeout(BG_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => self.finish(status.code()).await,
            Ok(Err(e)) => panic!("wait for `{}`: {e}", self.label),
            Err(_) => panic!(
                "`{}` did not exit within {BG_WAIT:?}; {}",
                self.label,
                self.describe()
            ),
        }
    }

    /// Asks it to stop with SIGTERM (etcdctl then releases locks, resigns elections and
    /// closes sessions) and waits (with a deadline) for it to exit; SIGKILLs it if it doesn't.
    pub async fn terminate(mut self) -> CtlOutput {
        if let Some(pid) = self.child.id() {
            // `kill -TERM` is given this child's own PID, never a name.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        match tokio::time::timeout(BG_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => self.finish(status.code()).await,
            _ => {
                let label = self.label.clone();
                let out = self.kill().await;
                panic!("`{label}` ignored SIGTERM for {BG_WAIT:?}; output:\n{out}")
            }
        }
    }

    /// SIGKILLs it and returns what it printed.
    pub async fn kill(mut self) -> CtlOutput {
        let _ = self.child.start_kill();
        let status = self.child.wait().await.ok();
        self.finish(status.and_then(|s| s.code())).await
    }

    async fn finish(&mut self, code: Option<i32>) -> CtlOutput {
        self.stdin = None;
        // The pipes close when the process is gone; let the collectors drain them.
        let (stdout, stderr) = (&self.stdout, &self.stderr);
        let _ = try_wait_for(Duration::from_secs(2), || {
            let done = Arc::strong_count(stdout) == 1 && Arc::strong_count(stderr) == 1;
            async move { if done { Ok(()) } else { Err(String::new()) } }
        })
        .await;
        CtlOutput {
            code,
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

/// The complete (newline-terminated) lines of `text`.
pub fn complete_lines(text: &str) -> Vec<String> {
    let end = text.rfind('\n').map_or(0, |i| i + 1);
    text[..end].lines().map(str::to_string).collect()
}
