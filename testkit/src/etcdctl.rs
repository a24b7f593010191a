//! The real `etcdctl` (API v3) as a child process: one-shot commands with a deadline, and background commands
//! (`watch`, `lease keep-alive`, `lock`, `elect`) whose output is collected as it arrives.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;

/// A one-shot command still running after this is killed and reported as hung.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a background command may take to exit after SIGTERM before it is killed.
const TERM_GRACE: Duration = Duration::from_secs(10);

/// What one run printed and how it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code; `None` when it ended by a signal or hung.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// It did not end within the harness's deadline (or grace period after SIGTERM) and was killed: a hang, not
    /// an answer. A command killed on purpose ([`Background::kill`]) is not hung.
    pub hung: bool,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "exit code: {:?}{}",
            self.code,
            if self.hung {
                " (hung: killed by the harness)"
            } else {
                ""
            }
        )?;
        writeln!(f, "stdout:\n{}", indent(&self.stdout))?;
        write!(f, "stderr:\n{}", indent(&self.stderr))
    }
}

/// `s` indented by four spaces, `<empty>` when empty: for failure reports.
pub fn indent(s: &str) -> String {
    if s.is_empty() {
        return "    <empty>".to_string();
    }
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// One `etcdctl` binary talking to one endpoint (or several, comma-separated).
#[derive(Clone, Debug)]
pub struct Etcdctl {
    bin: PathBuf,
    endpoint: String,
    leading: Vec<String>,
}

impl Etcdctl {
    pub fn new(bin: &Path, endpoint: impl Into<String>) -> Self {
        Self {
            bin: bin.to_path_buf(),
            endpoint: endpoint.into(),
            leading: Vec::new(),
        }
    }

    /// The same, with `arg` before every command's own arguments (so a command's own flag still wins).
    pub fn with_arg(mut self, arg: impl Into<String>) -> Self {
        self.leading.push(arg.into());
        self
    }

    /// The same, talking TLS: trusting `tls.ca` (`--cacert`) and presenting `tls.cert` and `tls.key` (`--cert`,
    /// `--key`). Its endpoint must be an `https://` URL.
    pub fn with_tls(self, tls: &crate::pki::TlsPaths) -> Self {
        self.with_cacert(&tls.ca)
            .with_arg(format!("--cert={}", tls.cert.display()))
            .with_arg(format!("--key={}", tls.key.display()))
    }

    /// The same, talking TLS trusting `ca` (`--cacert`) without presenting a certificate of its own.
    pub fn with_cacert(self, ca: &Path) -> Self {
        self.with_arg(format!("--cacert={}", ca.display()))
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The arguments given before every command's own ([`Etcdctl::with_arg`], [`Etcdctl::with_tls`]).
    pub fn leading_args(&self) -> &[String] {
        &self.leading
    }

    pub fn bin(&self) -> &Path {
        &self.bin
    }

    fn command<S: AsRef<str>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            .args(&self.leading)
            .args(args.iter().map(AsRef::as_ref))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    fn label<S: AsRef<str>>(&self, args: &[S]) -> String {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        format!("etcdctl --endpoints={} {}", self.endpoint, args.join(" "))
    }

    /// Runs `etcdctl ARGS` with `stdin` (empty when `None`) and waits for it, at most [`CTL_TIMEOUT`]; a run
    /// that outlives that is killed and reported with `code: None` and a note on stderr.
    pub async fn run<S: AsRef<str>>(&self, args: &[S], stdin: Option<&str>) -> Output {
        let mut child = match self.command(args).spawn() {
            Ok(c) => c,
            Err(e) => {
                return Output {
                    code: None,
                    stdout: String::new(),
                    stderr: format!("<harness: cannot spawn {}: {e}>", self.bin.display()),
                    hung: false,
                };
            }
        };
        let mut input = child.stdin.take().expect("piped stdin");
        let data = stdin.unwrap_or("").as_bytes().to_vec();
        let writer = tokio::spawn(async move {
            // etcdctl may exit before reading everything; a broken pipe is not a failure of the command.
            let _ = input.write_all(&data).await;
            let _ = input.shutdown().await;
        });
        let result = tokio::time::timeout(CTL_TIMEOUT, child.wait_with_output()).await;
        let _ = writer.await;
        match result {
            Ok(Ok(out)) => Output {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                hung: false,
            },
            Ok(Err(e)) => Output {
                code: None,
                stdout: String::new(),
                stderr: format!("<harness: waiting for etcdctl failed: {e}>"),
                hung: false,
            },
            // The dropped future dropped the child, which kill_on_drop killed.
            Err(_) => Output {
                code: None,
                stdout: String::new(),
                stderr: format!(
                    "<harness: `{}` did not finish within {CTL_TIMEOUT:?}>",
                    self.label(args)
                ),
                hung: true,
            },
        }
    }

    /// Like [`Etcdctl::run`] without stdin, but panics unless the command succeeded; returns its stdout.
    pub async fn ok<S: AsRef<str>>(&self, args: &[S]) -> String {
        let out = self.run(args, None).await;
        assert!(out.success(), "`{}` failed:\n{out}", self.label(args));
        out.stdout
    }

    /// Starts `etcdctl ARGS` in the background with an open stdin.
    pub fn spawn<S: AsRef<str>>(&self, args: &[S]) -> Result<Background, String> {
        let mut child = self
            .command(args)
            .spawn()
            .map_err(|e| format!("cannot spawn {}: {e}", self.bin.display()))?;
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let collectors = vec![
            collect(child.stdout.take().expect("piped stdout"), stdout.clone()),
            collect(child.stderr.take().expect("piped stderr"), stderr.clone()),
        ];
        Ok(Background {
            label: self.label(args),
            stdin: child.stdin.take(),
            collectors,
            child,
            stdout,
            stderr,
        })
    }
}

fn collect(
    mut from: impl AsyncRead + Unpin + Send + 'static,
    into: Arc<Mutex<String>>,
) -> JoinHandle<()> {
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
    })
}

/// A running background `etcdctl`. Dropping it kills the process.
pub struct Background {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    collectors: Vec<JoinHandle<()>>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Background {
    /// The command line, for reports.
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

    /// The command line and what it printed so far, for failure reports.
    pub fn describe(&self) -> String {
        format!(
            "`{}`\nstdout so far:\n{}\nstderr so far:\n{}",
            self.label,
            indent(&self.stdout()),
            indent(&self.stderr())
        )
    }

    /// Whether the process has exited already.
    pub fn has_exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    /// Writes to its stdin (for `watch -i`).
    pub async fn write_stdin(&mut self, text: &str) -> Result<(), String> {
        let stdin = self.stdin.as_mut().ok_or("stdin already closed")?;
        stdin
            .write_all(text.as_bytes())
            .await
            .map_err(|e| format!("write to stdin of `{}`: {e}", self.label))?;
        stdin.flush().await.map_err(|e| format!("flush stdin: {e}"))
    }

    /// Closes its stdin (end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits, up to `timeout`, until its stdout has at least `n` complete lines; returns them. Fails at the
    /// deadline, or as soon as the process exits short of them, with what it printed.
    pub async fn wait_lines(&mut self, n: usize, timeout: Duration) -> Result<Vec<String>, String> {
        self.wait_until(timeout, |out| {
            let lines = complete_lines(out);
            if lines.len() >= n {
                Ok(lines)
            } else {
                Err(format!("{} of {n} lines", lines.len()))
            }
        })
        .await
    }

    /// Waits, up to `timeout`, until its stdout contains `needle`.
    pub async fn wait_contains(&mut self, needle: &str, timeout: Duration) -> Result<(), String> {
        self.wait_until(timeout, |out| {
            if out.contains(needle) {
                Ok(())
            } else {
                Err(format!("no {needle:?} yet"))
            }
        })
        .await
    }

    async fn wait_until<T>(
        &mut self,
        timeout: Duration,
        check: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Read the exit state first: output printed before an exit is then already collected or on its way.
            let exited = self.has_exited();
            let last = match check(&self.stdout()) {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if exited {
                self.drain().await;
                if let Ok(v) = check(&self.stdout()) {
                    return Ok(v);
                }
                return Err(format!("{last}; the process exited; {}", self.describe()));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("{last} after {timeout:?}; {}", self.describe()));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Ends it: SIGTERM (etcdctl then releases locks, resigns elections and closes sessions), SIGKILL if it is
    /// still running after a grace period (then it is `hung`); returns what it printed. A command that dies of
    /// the SIGTERM itself has no exit `code`.
    pub async fn terminate(self) -> Output {
        if let Some(pid) = self.child.id() {
            // `kill -TERM` is given this child's own PID, never a name.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        self.end_within(TERM_GRACE).await
    }

    /// Closes its stdin and waits (at most [`CTL_TIMEOUT`]) for it to exit by itself; kills it after that (it is
    /// then `hung`).
    pub async fn wait_exit(mut self) -> Output {
        self.stdin = None;
        self.end_within(CTL_TIMEOUT).await
    }

    /// Waits up to `limit` for it to exit; SIGKILLs it after that and reports it `hung`.
    async fn end_within(mut self, limit: Duration) -> Output {
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => self.finish(status.code(), false).await,
            _ => {
                let _ = self.child.kill().await;
                self.finish(None, true).await
            }
        }
    }

    /// SIGKILL; returns what it printed (its exit code means nothing then, so it is `None`).
    pub async fn kill(mut self) -> Output {
        let _ = self.child.kill().await;
        self.finish(None, false).await
    }

    /// The process has exited, so its pipes reach EOF: wait (bounded) for the collectors to read the rest.
    async fn drain(&mut self) {
        for collector in std::mem::take(&mut self.collectors) {
            let _ = tokio::time::timeout(Duration::from_secs(5), collector).await;
        }
    }

    async fn finish(mut self, code: Option<i32>, hung: bool) -> Output {
        self.stdin = None;
        self.drain().await;
        Output {
            code,
            stdout: self.stdout(),
            stderr: self.stderr(),
            hung,
        }
    }
}

/// The complete (newline-terminated) lines of `text`.
pub fn complete_lines(text: &str) -> Vec<String> {
    let end = text.rfind('\n').map_or(0, |i| i + 1);
    text[..end].lines().map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_complete_lines_count() {
        assert_eq!(complete_lines("a\nb\npart"), vec!["a", "b"]);
        assert!(complete_lines("part").is_empty());
    }

    #[test]
    fn tls_files_become_etcdctls_flags_before_the_commands_own() {
        let tls = crate::pki::TlsPaths {
            ca: "/pki/ca.pem".into(),
            cert: "/pki/client.pem".into(),
            key: "/pki/client-key.pem".into(),
        };
        let ctl = Etcdctl::new(Path::new("etcdctl"), "https://127.0.0.1:2379").with_tls(&tls);
        assert_eq!(
            ctl.leading_args(),
            [
                "--cacert=/pki/ca.pem",
                "--cert=/pki/client.pem",
                "--key=/pki/client-key.pem"
            ]
        );
        let ca_only = Etcdctl::new(Path::new("etcdctl"), "https://127.0.0.1:2379")
            .with_cacert(Path::new("/pki/ca.pem"));
        assert_eq!(ca_only.leading_args(), ["--cacert=/pki/ca.pem"]);
    }

    #[test]
    fn indent_marks_empty_output() {
        assert_eq!(indent(""), "    <empty>");
        assert_eq!(indent("a\nb"), "    a\n    b");
    }
}
