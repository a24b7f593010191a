//! A child process a harness started: its output goes to a log file, it can be paused (SIGSTOP), resumed
//! (SIGCONT) and killed by its own PID, and it is killed when dropped, so a failing test leaves nothing running.
//!
//! etcd members, the proxy binary and etcd's Go proxy are all one of these; what differs is only the command line
//! and how readiness is judged ([`Process::wait_http`]).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::{dirs, http};

/// A running child process with its output in a log file.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    /// Spawns `command` with stdin closed and stdout and stderr appended to `log`. `name` labels it in errors.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Self, String> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{name}: open log {}: {e}", log.display()))?;
        let clone = file
            .try_clone()
            .map_err(|e| format!("{name}: log handle: {e}"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(clone)
            .stderr(file)
            .spawn()
            .map_err(|e| format!("{name}: spawn {:?}: {e}", command.get_program()))?;
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How it ended, if it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn is_running(&mut self) -> bool {
        self.exit_status().is_none()
    }

    /// The last `n` lines it printed.
    pub fn log_tail(&self, n: usize) -> String {
        dirs::tail(&self.log, n)
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Waits, up to `timeout`, until `GET path` on `addr` answers in a way `ready` accepts (given the status and
    /// the body). Fails early, with its log, if the process exits.
    pub async fn wait_http(
        &mut self,
        addr: &str,
        path: &str,
        timeout: Duration,
        ready: impl Fn(u16, &str) -> bool,
    ) -> Result<(), String> {
        self.wait_http_with(addr, path, None, timeout, ready).await
    }

    /// [`Process::wait_http`], over TLS with `tls`'s CA and client certificate when `tls` is given.
    pub async fn wait_http_with(
        &mut self,
        addr: &str,
        path: &str,
        tls: Option<&crate::pki::TlsPaths>,
        timeout: Duration,
        ready: impl Fn(u16, &str) -> bool,
    ) -> Result<(), String> {
        let name = self.name.clone();
        let log = self.log.clone();
        let target = Readiness {
            name: &name,
            addr,
            path,
            tls,
            timeout,
            log: &log,
        };
        target
            .wait(ready, || self.exit_status().map(|s| s.to_string()))
            .await
    }

    /// Pauses it with SIGSTOP: its sockets still accept connections, nothing answers (a hung member).
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes it after [`Process::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Asks it to stop with SIGTERM.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    fn signal(&self, name: &str) {
        // `kill` is given this child's own PID, never a name. A process that already exited is not an error.
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }

    /// SIGKILLs it and reaps it.
    pub fn kill(mut self) {
        self.kill_now();
    }

    fn kill_now(&mut self) {
        // A paused process dies of SIGKILL too; SIGCONT is not needed.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// Where and how long to wait for a server to answer `GET path`, with the log that explains a failure: the one
/// readiness loop of the kit, for processes and containers alike.
pub struct Readiness<'a> {
    /// Labels the server in errors.
    pub name: &'a str,
    pub addr: &'a str,
    pub path: &'a str,
    pub tls: Option<&'a crate::pki::TlsPaths>,
    pub timeout: Duration,
    /// Its log, whose tail an error carries.
    pub log: &'a Path,
}

impl Readiness<'_> {
    /// Waits, up to the timeout, until `GET path` answers in a way `ready` accepts (given the status and the
    /// body). Fails early, with the log, once `exited` says how the server ended.
    pub async fn wait(
        &self,
        ready: impl Fn(u16, &str) -> bool,
        mut exited: impl FnMut() -> Option<String>,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let (name, addr, path) = (self.name, self.addr, self.path);
        loop {
            if let Some(status) = exited() {
                return Err(format!(
                    "{name} ({addr}) exited with {status} while starting; its log:\n{}",
                    dirs::tail(self.log, 60)
                ));
            }
            let last = match http::get_with(addr, path, self.tls).await {
                Ok((code, body)) if ready(code, &body) => return Ok(()),
                Ok((code, body)) => format!("HTTP {code}: {body}"),
                Err(e) => e,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(format!(
                    "{name} ({addr}) not ready on GET {path} within {:?}; last seen: {last}; its log:\n{}",
                    self.timeout,
                    dirs::tail(self.log, 60)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(dir: &Path) -> Process {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo started; exec sleep 600"]);
        Process::spawn("sleeper", cmd, &dir.join("log")).expect("spawn sh")
    }

    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The state follows the command name, which is in parentheses.
        stat.rsplit_once(") ")?.1.chars().next()
    }

    #[tokio::test]
    async fn pause_resume_and_drop_act_on_the_process_itself() {
        let dir = dirs::temp_dir("testkit-process-").expect("temp dir");
        let mut p = sleeper(dir.path());
        let pid = p.pid();
        crate::wait_for("the sleeper to run", Duration::from_secs(10), || {
            let s = state(pid);
            async move {
                if matches!(s, Some('S' | 'R')) {
                    Ok(())
                } else {
                    Err(format!("{s:?}"))
                }
            }
        })
        .await;
        p.pause();
        crate::wait_for("SIGSTOP to take", Duration::from_secs(10), || {
            let s = state(pid);
            async move {
                if s == Some('T') {
                    Ok(())
                } else {
                    Err(format!("{s:?}"))
                }
            }
        })
        .await;
        p.resume();
        crate::wait_for("SIGCONT to take", Duration::from_secs(10), || {
            let s = state(pid);
            async move {
                if s != Some('T') {
                    Ok(())
                } else {
                    Err(format!("{s:?}"))
                }
            }
        })
        .await;
        assert!(p.is_running());
        crate::wait_for("its output in the log", Duration::from_secs(10), || {
            let tail = p.log_tail(5);
            async move { if tail == "started" { Ok(()) } else { Err(tail) } }
        })
        .await;
        drop(p);
        assert_eq!(state(pid), None, "pid {pid} still exists after drop");
    }

    #[tokio::test]
    async fn a_process_that_exits_while_starting_fails_the_wait_with_its_log() {
        let dir = dirs::temp_dir("testkit-process-").expect("temp dir");
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo bad flag >&2; exit 3"]);
        let mut p = Process::spawn("failing", cmd, &dir.path().join("log")).expect("spawn");
        let port = crate::free_port();
        let err = p
            .wait_http(
                &format!("127.0.0.1:{port}"),
                "/health",
                Duration::from_secs(20),
                |c, _| c == 200,
            )
            .await
            .expect_err("it exited");
        assert!(err.contains("exited with exit status: 3"), "{err}");
        assert!(err.contains("bad flag"), "{err}");
    }
}
