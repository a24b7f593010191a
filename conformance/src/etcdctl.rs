//! The real `etcdctl` (API v3) as a child process: one-shot commands with a deadline, and background commands
//! (`watch`, `lease keep-alive`, `lock`, `elect`) whose output is collected as it arrives.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;

/// A one-shot command still running after this is killed and reported as hung.
pub const CTL_TIMEOUT: Duration = Duration::from_secs(30);

/// What one run printed and how it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Exit code; `None` when it ended by a signal or hung.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// One `etcdctl` binary talking to one endpoint.
#[derive(Clone, Debug)]
pub struct Etcdctl {
    pub bin: PathBuf,
    pub endpoint: String,
}

impl Etcdctl {
    pub fn new(bin: &Path, endpoint: impl Into<String>) -> Self {
        Self {
            bin: bin.to_path_buf(),
            endpoint: endpoint.into(),
        }
    }

    fn command(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint))
            // etcdctl's default 5 s is short for bcrypt authentication on a loaded 2-core CI machine; a
            // scenario's own --command-timeout comes later and wins.
            .arg("--command-timeout=20s")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `etcdctl ARGS` with `stdin` (empty when `None`) and waits for it, at most [`CTL_TIMEOUT`].
    pub async fn run(&self, args: &[String], stdin: Option<&str>) -> Output {
        let mut child = match self.command(args).spawn() {
            Ok(c) => c,
            Err(e) => {
                return Output {
                    code: None,
                    stdout: String::new(),
                    stderr: format!("<harness: cannot spawn {}: {e}>", self.bin.display()),
                };
            }
        };
        let mut input = child.stdin.take().expect("piped stdin");
        let data = stdin.unwrap_or("").as_bytes().to_vec();
        let writer = tokio::spawn(async move {
            // etcdctl may exit before reading everything; a broken pipe is not a failure of the scenario.
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
            },
            Ok(Err(e)) => Output {
                code: None,
                stdout: String::new(),
                stderr: format!("<harness: waiting for etcdctl failed: {e}>"),
            },
            // The dropped future dropped the child, which kill_on_drop killed.
            Err(_) => Output {
                code: None,
                stdout: String::new(),
                stderr: format!("<harness: etcdctl did not finish within {CTL_TIMEOUT:?}>"),
            },
        }
    }

    /// Starts `etcdctl ARGS` in the background with an open stdin.
    pub fn spawn(&self, args: &[String]) -> Result<Background, String> {
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
    child: Child,
    stdin: Option<ChildStdin>,
    collectors: Vec<JoinHandle<()>>,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Background {
    pub fn stdout(&self) -> String {
        self.stdout
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
            .map_err(|e| format!("write to stdin: {e}"))?;
        stdin.flush().await.map_err(|e| format!("flush stdin: {e}"))
    }

    /// Ends it: SIGTERM (SIGKILL after 10 s), waits, and returns what it printed. Its output is drained for a
    /// moment after exit so that the last lines are not lost.
    pub async fn terminate(mut self) -> Output {
        if let Some(pid) = self.child.id() {
            // Signal exactly this child by its pid.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        let code = match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = self.child.kill().await;
                None
            }
        };
        self.finish(code).await
    }

    /// Waits (at most [`CTL_TIMEOUT`]) for it to exit by itself.
    pub async fn wait_exit(mut self) -> Output {
        self.stdin = None;
        let code = match tokio::time::timeout(CTL_TIMEOUT, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = self.child.kill().await;
                None
            }
        };
        self.finish(code).await
    }

    /// SIGKILL; returns what it printed (its exit code means nothing then).
    pub async fn kill(mut self) -> Output {
        let _ = self.child.kill().await;
        self.finish(None).await
    }

    async fn finish(mut self, code: Option<i32>) -> Output {
        // The process has exited, so its pipes reach EOF: wait (bounded) for the collectors to read the rest.
        for collector in std::mem::take(&mut self.collectors) {
            let _ = tokio::time::timeout(Duration::from_secs(5), collector).await;
        }
        Output {
            code,
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}
