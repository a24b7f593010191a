//! Step-by-step comparison of `etcdctl` against a direct etcd and against the proxy.
//!
//! [`Compare::start`] starts two fresh single-member etcd clusters: one is used directly, the
//! other only through the proxy. Every step runs the same `etcdctl` command against both, in
//! order, normalises both outputs (see `testkit::Normalizer`) and fails at the first step whose
//! exit code, stdout or stderr differ, with a line diff and both raw outputs.
//!
//! Arguments and stdin may use `<IDn>` (a placeholder seen in earlier output, resolved to each
//! target's own ID), `<REV+n>` (revision n: both etcds are fresh) and `<DIR>` (a scratch
//! directory of each target's own).
//!
//! Setting `PROXY_TESTS_SELF_CHECK=1` replaces the proxy by a second direct etcd: every
//! scenario must then pass, which checks the harness and the normaliser themselves.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use testkit::diff::line_diff;
use testkit::etcdctl::indent;
use testkit::{Background, Binaries, Etcdctl, Normalizer, Output, ProxyProcess, try_wait_for};

use super::pair::Pair;

/// How long a background command may take to print what a step waits for.
pub const BG_WAIT: Duration = Duration::from_secs(30);

/// One side of the comparison.
pub struct Target {
    /// "direct" or "proxy" (or "direct-2" in self-check mode).
    pub name: &'static str,
    /// `etcdctl` talking to this target.
    pub ctl: Etcdctl,
    /// A scratch directory of this target's own, `<DIR>` in arguments.
    pub dir: PathBuf,
    pub norm: Normalizer,
}

impl Target {
    fn new(name: &'static str, binaries: &Binaries, endpoint: &str, dir: PathBuf) -> Self {
        // No key prefix (a fresh etcd of its own), the scratch directory as `<DIR>`, revisions from 0.
        let norm = Normalizer::new("", dir.display().to_string(), 0);
        Self {
            name,
            ctl: binaries.etcdctl(endpoint),
            dir,
            norm,
        }
    }

    /// An argument or stdin text with `<IDn>`, `<REV+n>` and `<DIR>` made this target's own.
    pub fn resolve(&self, text: &str) -> String {
        self.norm
            .resolve(text)
            .unwrap_or_else(|e| panic!("{}: cannot resolve {text:?}: {e}", self.name))
    }

    /// Runs one `etcdctl` command against this target only (placeholders resolved).
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let args: Vec<String> = args.iter().map(|a| self.resolve(a)).collect();
        let stdin = stdin.map(|s| self.resolve(s));
        self.ctl.run(&args, stdin.as_deref()).await
    }

    /// Starts `etcdctl ARGS` (placeholders resolved) in the background against this target only.
    fn spawn(&self, args: &[&str]) -> Background {
        let args: Vec<String> = args.iter().map(|a| self.resolve(a)).collect();
        self.ctl
            .spawn(&args)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

/// What a step showed, normalised (identical on both targets, or the step failed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A background command running against both targets.
pub struct BgPair {
    label: String,
    pub direct: Background,
    pub other: Background,
}

impl BgPair {
    /// Waits (with a deadline) until both have printed at least `n` lines.
    pub async fn wait_lines(&mut self, n: usize) {
        for bg in [&mut self.direct, &mut self.other] {
            if let Err(e) = bg.wait_lines(n, BG_WAIT).await {
                panic!("waiting for {n} lines: {e}");
            }
        }
    }

    /// Waits (with a deadline) until the stdout of both contains `needle`.
    pub async fn wait_contains(&mut self, needle: &str) {
        for bg in [&mut self.direct, &mut self.other] {
            if let Err(e) = bg.wait_contains(needle, BG_WAIT).await {
                panic!("waiting for {needle:?}: {e}");
            }
        }
    }

    /// Writes `text` (placeholders resolved per target) to both stdins.
    pub async fn write_stdin(&mut self, cmp: &Compare, text: &str) {
        for (bg, t) in [
            (&mut self.direct, &cmp.direct),
            (&mut self.other, &cmp.other),
        ] {
            if let Err(e) = bg.write_stdin(&t.resolve(text)).await {
                panic!("{}: {e}; {}", t.name, bg.describe());
            }
        }
    }

    pub fn label(&self) -> &str {
        &self.label
    }
}

/// How to end a background pair before comparing what it printed.
#[derive(Clone, Copy, Debug)]
pub enum Finish {
    /// SIGTERM, wait for a clean exit, compare everything.
    Terminate,
    /// Wait for it to exit by itself, compare everything.
    Exit,
    /// SIGKILL, compare only the first `n` stdout lines (it prints periodically).
    KillKeepLines(usize),
}

pub struct Compare {
    pub direct: Target,
    pub other: Target,
    step: usize,
    pair: Pair,
}

impl Compare {
    /// Two fresh single-member etcd clusters of `binaries`' version, one direct and one behind
    /// a proxy started with `extra_proxy_args` (see [`Pair`]).
    pub async fn start(binaries: &Binaries, extra_proxy_args: &[&str]) -> Self {
        let pair = Pair::start(binaries, extra_proxy_args).await;
        Self {
            direct: Target::new(
                "direct",
                binaries,
                &pair.direct,
                pair.cluster(0).scratch_dir(),
            ),
            other: Target::new(
                pair.other_name,
                binaries,
                &pair.other,
                pair.cluster(1).scratch_dir(),
            ),
            step: 0,
            pair,
        }
    }

    /// The proxy (None in self-check mode).
    pub fn proxy(&self) -> Option<&ProxyProcess> {
        self.pair.proxy()
    }

    /// Runs `etcdctl ARGS` against both targets and compares; returns what both showed.
    pub async fn ctl(&mut self, args: &[&str]) -> Seen {
        self.run(args, None).await
    }

    /// Like [`Compare::ctl`], with `stdin` fed to the command.
    pub async fn ctl_stdin(&mut self, args: &[&str], stdin: &str) -> Seen {
        self.run(args, Some(stdin)).await
    }

    /// Like [`Compare::ctl`], and asserts that the command succeeded.
    pub async fn ok(&mut self, args: &[&str]) -> Seen {
        let seen = self.ctl(args).await;
        assert_eq!(
            seen.code,
            Some(0),
            "step {} `etcdctl {}` failed on both targets:\n{seen:#?}",
            self.step,
            args.join(" ")
        );
        seen
    }

    async fn run(&mut self, args: &[&str], stdin: Option<&str>) -> Seen {
        self.step += 1;
        let a = self.direct.run(args, stdin).await;
        let b = self.other.run(args, stdin).await;
        let label = format!("etcdctl {}", args.join(" "));
        self.compare(&label, &a, &b, None)
    }

    /// Starts `etcdctl ARGS` in the background against both targets.
    pub fn spawn(&mut self, args: &[&str]) -> BgPair {
        BgPair {
            label: format!("etcdctl {} (background)", args.join(" ")),
            direct: self.direct.spawn(args),
            other: self.other.spawn(args),
        }
    }

    /// Ends a background pair as `how` says and compares what both printed.
    pub async fn finish(&mut self, bg: BgPair, how: Finish) -> Seen {
        self.step += 1;
        let BgPair {
            label,
            direct,
            other,
        } = bg;
        let (a, b, keep) = match how {
            Finish::Terminate => (direct.terminate().await, other.terminate().await, None),
            Finish::Exit => (direct.wait_exit().await, other.wait_exit().await, None),
            Finish::KillKeepLines(n) => (direct.kill().await, other.kill().await, Some(n)),
        };
        // The kit kills a command that outlives its deadline; that both sides hung must not pass as both sides
        // agreeing.
        for (side, out) in [("direct", &a), (self.other.name, &b)] {
            assert!(
                !out.hung,
                "`{label}` on {side} did not end ({how:?}); the harness killed it:\n{out}"
            );
        }
        self.compare(&label, &a, &b, keep)
    }

    /// Polls `etcdctl ARGS` on each target (uncompared) until `pred` holds for its raw
    /// stdout, with a deadline.
    pub async fn wait_until(&mut self, args: &[&str], what: &str, pred: impl Fn(&str) -> bool) {
        for t in [&self.direct, &self.other] {
            let res = try_wait_for(Duration::from_secs(30), || async {
                let out = t.run(args, None).await;
                if out.success() && pred(&out.stdout) {
                    Ok(())
                } else {
                    Err(out.to_string())
                }
            })
            .await;
            if let Err(last) = res {
                panic!(
                    "timed out on {} waiting for {what} (polling `etcdctl {}`); last seen:\n{last}",
                    t.name,
                    args.join(" ")
                );
            }
        }
    }

    fn compare(&mut self, label: &str, a: &Output, b: &Output, keep: Option<usize>) -> Seen {
        let cut = |s: String| match keep {
            Some(n) => s.lines().take(n).map(|l| format!("{l}\n")).collect(),
            None => s,
        };
        let na = Seen {
            code: if keep.is_some() { None } else { a.code },
            stdout: cut(self.direct.norm.stdout(&a.stdout)),
            stderr: if keep.is_some() {
                String::new()
            } else {
                self.direct.norm.stderr(&a.stderr)
            },
        };
        let nb = Seen {
            code: if keep.is_some() { None } else { b.code },
            stdout: cut(self.other.norm.stdout(&b.stdout)),
            stderr: if keep.is_some() {
                String::new()
            } else {
                self.other.norm.stderr(&b.stderr)
            },
        };
        if na != nb {
            let (an, bn) = (self.direct.name, self.other.name);
            let mut msg = format!(
                "step {} `{label}`: output through {bn} differs from {an}\n",
                self.step
            );
            if na.code != nb.code {
                let _ = writeln!(msg, "exit code: {an} {:?}, {bn} {:?}", na.code, nb.code);
            }
            if na.stdout != nb.stdout {
                let _ = writeln!(
                    msg,
                    "stdout (normalised; - {an}, + {bn}):\n{}",
                    line_diff(&na.stdout, &nb.stdout)
                );
            }
            if na.stderr != nb.stderr {
                let _ = writeln!(
                    msg,
                    "stderr (normalised; - {an}, + {bn}):\n{}",
                    line_diff(&na.stderr, &nb.stderr)
                );
            }
            let _ = write!(
                msg,
                "raw {an}:\n{}\nraw {bn}:\n{}",
                indent(&a.to_string()),
                indent(&b.to_string())
            );
            panic!("{msg}");
        }
        na
    }
}
