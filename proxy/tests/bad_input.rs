//! Bad command lines and startup failures: the proxy exits with a non-zero code and a clear
//! one-line message on stderr, and never panics. No etcd is needed: every case fails
//! before any endpoint is contacted.

mod support;

use support::net::BusyPort;
use support::proxy::{Exited, try_start};
use testkit::free_port;

/// Asserts a clean failure: a non-zero exit code (not a signal), no panic, and a stderr line
/// containing every one of `needles` (case-insensitive). Returns that line.
fn assert_fails_with(args: &[&str], out: &Exited, needles: &[&str]) -> String {
    let shown = format!(
        "`etcd-grpc-proxy {}` exited with {}\nstderr:\n{}\nstdout:\n{}",
        args.join(" "),
        out.status,
        out.stderr,
        out.stdout
    );
    match out.status.code() {
        Some(0) => panic!("expected a failure, got success: {shown}"),
        None => panic!("expected an exit code, got a signal: {shown}"),
        Some(_) => {}
    }
    assert!(
        !out.stderr.contains("panicked") && !out.stdout.contains("panicked"),
        "the proxy panicked: {shown}"
    );
    // Log lines may come first; the message itself is one line that says it all.
    out.stderr
        .lines()
        .find(|l| {
            let l = l.to_lowercase();
            !l.trim().is_empty() && needles.iter().all(|n| l.contains(&n.to_lowercase()))
        })
        .unwrap_or_else(|| panic!("no stderr line mentions all of {needles:?}: {shown}"))
        .to_string()
}

async fn check(args: &[&str], needles: &[&str]) -> String {
    let out = try_start(args).await;
    assert_fails_with(args, &out, needles)
}

fn dead_endpoint() -> String {
    format!("--endpoints=127.0.0.1:{}", free_port())
}

#[tokio::test]
async fn unknown_flag_is_rejected_naming_the_flag() {
    check(&["start", "--bogus-flag=1"], &["--bogus-flag"]).await;
    check(
        &["start", &dead_endpoint(), "--no-such-thing"],
        &["--no-such-thing"],
    )
    .await;
}

#[tokio::test]
async fn malformed_endpoints_are_rejected_with_the_endpoint_named() {
    for bad in ["http://", "foo:bar:baz", "127.0.0.1", "127.0.0.1:notaport"] {
        let flag = format!("--endpoints={bad}");
        check(&["start", &flag], &["endpoint", bad]).await;
    }
    check(&["start", "--endpoints="], &["endpoint"]).await;
}

#[tokio::test]
async fn unsupported_flags_are_rejected_as_not_supported() {
    let dead = dead_endpoint();
    for flag in [
        "--cert-file=x",
        "--key-file=x",
        "--trusted-ca-file=x",
        "--advertise-client-url=127.0.0.1:1",
        "--resolver-prefix=/p",
    ] {
        let name = flag.split('=').next().expect("flag name");
        check(&["start", &dead, flag], &["not supported", name]).await;
    }
}

#[tokio::test]
async fn tls_endpoint_is_rejected_as_not_supported() {
    check(
        &["start", "--endpoints=https://127.0.0.1:2379"],
        &["not supported", "https://127.0.0.1:2379"],
    )
    .await;
}

#[tokio::test]
async fn listen_address_in_use_fails_with_the_address() {
    let busy = BusyPort::bind();
    let listen = format!("--listen-addr={}", busy.addr());
    check(&["start", &dead_endpoint(), &listen], &[&busy.addr()]).await;
}

#[tokio::test]
async fn malformed_listen_address_and_values_are_rejected() {
    check(&["start", "--listen-addr=nonsense"], &["nonsense"]).await;
    check(&["start", "--dial-timeout=abc"], &["abc"]).await;
    check(&["start", "--max-recv-bytes=-5"], &["--max-recv-bytes"]).await;
}

#[tokio::test]
async fn missing_start_subcommand_is_a_usage_error() {
    let args = ["--endpoints=127.0.0.1:2379"];
    let out = try_start(&args).await;
    assert_fails_with(&args, &out, &[]);
    assert!(
        out.stderr.to_lowercase().contains("usage"),
        "expected a usage message: {out:?}"
    );
    let out = try_start(&[]).await;
    assert_fails_with(&[], &out, &[]);
    assert!(
        out.stderr.to_lowercase().contains("usage"),
        "expected a usage message: {out:?}"
    );
}
