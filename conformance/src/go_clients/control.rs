//! The runner's control endpoint: a Go test asks the runner, over HTTP/1.1 on loopback, to act on the processes it
//! owns (the run's [`Fleet`]), so that every process is started, killed and cleaned up by the one test kit. One
//! request per connection, answered in plain text; anything but 200 carries the reason, which the Go harness turns
//! into the test's failure.
//!
//! | request | action | answer |
//! |---|---|---|
//! | `POST /member/stop?i=N` | SIGKILL etcd member N | `ok` |
//! | `POST /member/start?i=N` | start member N again if it is not running, wait until healthy | `ok` |
//! | `GET /member/active` | the member the proxy next to etcd serves from (0 directly) | `N` |
//! | `POST /proxy/start`, body: one flag per line | another proxy in front of etcd's members | `ID 127.0.0.1:PORT` |
//! | `POST /proxy/kill?id=ID` | SIGKILL that proxy (no-op when gone) | `ok` |
// The runner serves real processes, never simulated code: a socket of its own, as the test kit's are.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::fleet::Fleet;

/// The largest request the endpoint reads: a few flags.
const MAX_REQUEST: usize = 64 * 1024;
/// How long a client may take to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A control endpoint serving one run; dropping it stops serving.
pub struct Control {
    url: String,
    task: JoinHandle<()>,
}

impl Control {
    /// Serves `fleet` on a free loopback port.
    pub async fn serve(fleet: Arc<Mutex<Fleet>>) -> Result<Control, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("bind the control endpoint: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("control endpoint address: {e}"))?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, fleet.clone()));
            }
        });
        Ok(Control {
            url: format!("http://{addr}"),
            task,
        })
    }

    /// `http://127.0.0.1:PORT`: what the Go harness reads from `GOCLIENTS_CONTROL`.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request parsed: method, path, query pairs, body.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    body: String,
}

impl Request {
    fn param(&self, name: &str) -> Result<&str, String> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| format!("{} needs ?{name}=", self.path))
    }

    fn number(&self, name: &str) -> Result<usize, String> {
        let v = self.param(name)?;
        v.parse()
            .map_err(|_| format!("{}: {name}={v:?} is not a number", self.path))
    }
}

async fn answer(mut stream: TcpStream, fleet: Arc<Mutex<Fleet>>) {
    let (code, text) = match tokio::time::timeout(READ_TIMEOUT, read_request(&mut stream)).await {
        Err(_) => (408, "the request did not arrive in time".to_string()),
        Ok(Err(e)) => (400, e),
        Ok(Ok(req)) => match act(&req, &fleet).await {
            Ok(text) => (200, text),
            Err(e) => (500, e),
        },
    };
    let reason = if code == 200 { "OK" } else { "Error" };
    let reply = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn act(req: &Request, fleet: &Mutex<Fleet>) -> Result<String, String> {
    let mut fleet = fleet.lock().await;
    match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/member/stop") => fleet.stop_member(req.number("i")?).map(|()| "ok".into()),
        ("POST", "/member/start") => fleet
            .start_member(req.number("i")?)
            .await
            .map(|()| "ok".into()),
        ("GET", "/member/active") => fleet.active_member().await.map(|i| i.to_string()),
        ("POST", "/proxy/start") => {
            let flags: Vec<&str> = req.body.lines().filter(|l| !l.is_empty()).collect();
            let (id, endpoint) = fleet.start_proxy(&flags).await?;
            Ok(format!("{id} {endpoint}"))
        }
        ("POST", "/proxy/kill") => {
            fleet.kill_proxy(req.number("id")?);
            Ok("ok".into())
        }
        (m, p) => Err(format!("no action {m} {p}")),
    }
}

async fn read_request(stream: &mut TcpStream) -> Result<Request, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(req) = parse(&buf)? {
            return Ok(req);
        }
        if buf.len() > MAX_REQUEST {
            return Err("request too large".into());
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("the connection closed before the request was complete".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The request in `buf`, or `None` while it is incomplete (head or `content-length` bytes of body missing).
fn parse(buf: &[u8]) -> Result<Option<Request>, String> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end]).map_err(|_| "head is not UTF-8")?;
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let method = first.next().unwrap_or_default().to_string();
    let target = first.next().ok_or("no request target")?;
    let length: usize = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim().parse().map_err(|_| "bad content-length"))
        .transpose()?
        .unwrap_or(0);
    let body = &buf[head_end + 4..];
    if body.len() < length {
        return Ok(None);
    }
    let body = String::from_utf8(body[..length].to_vec()).map_err(|_| "body is not UTF-8")?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let query = query
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Ok(Some(Request {
        method,
        path: path.to_string(),
        query,
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_parsed_once_its_body_has_arrived() {
        let head = "POST /proxy/start?x=1&id=7 HTTP/1.1\r\nHost: h\r\nContent-Length: 6\r\n\r\n";
        assert_eq!(parse(head.as_bytes()).unwrap(), None, "body missing");
        let full = format!("{head}--a\n-b");
        let req = parse(full.as_bytes()).unwrap().expect("complete");
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/proxy/start");
        assert_eq!(req.number("id").unwrap(), 7);
        assert_eq!(req.body, "--a\n-b");
        assert!(req.number("i").unwrap_err().contains("?i="));
        assert_eq!(parse(b"GET /member/active HTTP/1.1\r\n").unwrap(), None);
        let get = parse(b"GET /member/active HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (get.path.as_str(), get.body.as_str()),
            ("/member/active", "")
        );
        assert!(parse(b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n").is_err());
    }
}
