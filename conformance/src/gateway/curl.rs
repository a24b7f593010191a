//! HTTP through the real `curl` binary, as a user of etcd's gateway sends it: one request and its whole answer
//! ([`call`]), or a request whose answer stays open and is read line by line ([`Stream`]). In the clear, or over
//! TLS presenting a client certificate.

use std::process::Stdio;
use std::time::Duration;

use testkit::TlsPaths;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

/// How long one call, or one wait for stream lines, may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Server {
    /// `http://127.0.0.1:PORT` or `https://127.0.0.1:PORT`.
    pub url: String,
    pub tls: Option<TlsPaths>,
}

/// A request, placeholders resolved.
#[derive(Clone, Debug)]
pub struct Http {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// Empty when the server sent none.
    pub content_type: String,
    pub body: String,
}

fn command(server: &Server, req: &Http, extra: &[&str]) -> Command {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-sS",
        "--max-time",
        &TIMEOUT.as_secs().to_string(),
        "-X",
        &req.method,
    ]);
    cmd.args(extra);
    if let Some(tls) = &server.tls {
        cmd.arg("--cacert").arg(&tls.ca);
        cmd.arg("--cert").arg(&tls.cert);
        cmd.arg("--key").arg(&tls.key);
    }
    for (name, value) in &req.headers {
        cmd.arg("-H").arg(format!("{name}: {value}"));
    }
    if req.body.is_some() {
        cmd.args(["--data-binary", "@-"]);
    }
    cmd.arg(format!("{}{}", server.url, req.path));
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn feed(child: &mut Child, body: Option<&str>) -> Result<(), String> {
    let mut stdin = child.stdin.take().ok_or("curl has no stdin")?;
    if let Some(b) = body {
        stdin
            .write_all(b.as_bytes())
            .await
            .map_err(|e| format!("writing the body to curl: {e}"))?;
    }
    drop(stdin);
    Ok(())
}

/// Sends `req` and reads its whole answer. An `Err` is a request curl could not carry out (no connection, time
/// out), with curl's message.
pub async fn call(server: &Server, req: &Http) -> Result<Answer, String> {
    let mut cmd = command(
        server,
        req,
        &["-o", "-", "-w", "\n%{http_code} %{content_type}"],
    );
    let mut child = cmd.spawn().map_err(|e| format!("running curl: {e}"))?;
    feed(&mut child, req.body.as_deref()).await?;
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("waiting for curl: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "curl {} {}: {} {}{}",
            req.method,
            req.path,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            stdout.trim()
        ));
    }
    let (body, trailer) = stdout
        .rsplit_once('\n')
        .ok_or_else(|| format!("curl wrote no status line: {stdout:?}"))?;
    let (code, content_type) = trailer.split_once(' ').unwrap_or((trailer, ""));
    Ok(Answer {
        status: code
            .parse()
            .map_err(|_| format!("curl's status {code:?} is no number"))?,
        content_type: content_type.trim().to_string(),
        body: body.to_string(),
    })
}

/// A request whose answer stays open: its status and content type, then its body line by line.
pub struct Stream {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    pub status: u16,
    pub content_type: String,
}

impl Stream {
    /// Sends `req` and waits (within [`TIMEOUT`]) for the answer's head.
    pub async fn open(server: &Server, req: &Http) -> Result<Stream, String> {
        // -i: the head on stdout before the body; -N: every chunk as it comes.
        let mut cmd = command(server, req, &["-i", "-N"]);
        let mut child = cmd.spawn().map_err(|e| format!("running curl: {e}"))?;
        feed(&mut child, req.body.as_deref()).await?;
        let stdout = child.stdout.take().ok_or("curl has no stdout")?;
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let head = tokio::time::timeout(TIMEOUT, async {
            let mut head = Vec::new();
            while let Some(line) = rx.recv().await {
                let line = line.trim_end_matches('\r').to_string();
                if line.is_empty() {
                    return Ok(head);
                }
                head.push(line);
            }
            Err(format!("the answer ended within its head: {head:?}"))
        })
        .await
        .map_err(|_| format!("no answer head within {TIMEOUT:?}"))??;
        let status = head
            .first()
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("no HTTP status line in {head:?}"))?;
        let content_type = head
            .iter()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-type")
                    .then(|| value.trim().to_string())
            })
            .unwrap_or_default();
        Ok(Stream {
            child,
            lines: rx,
            status,
            content_type,
        })
    }

    /// The next `count` non-empty lines, waiting up to [`TIMEOUT`] for them; fewer if the answer ends or the time
    /// is up first.
    pub async fn read(&mut self, count: usize) -> Vec<String> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        while got.len() < count {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) if line.trim().is_empty() => {}
                Ok(Some(line)) => got.push(line),
                Ok(None) | Err(_) => break,
            }
        }
        got
    }

    /// The client goes away: curl is killed (by its own PID) and reaped.
    pub async fn close(mut self) {
        let _ = self.child.kill().await;
    }
}
