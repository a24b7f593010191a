//! Bad command lines and startup failures: the proxy exits with a non-zero code and a clear
//! one-line message on stderr, and never panics. No etcd is needed: every case fails
//! before any endpoint is contacted.

mod support;

use support::net::BusyPort;
use support::proxy::{Exited, try_start};
use testkit::free_port;
use testkit::pki::{Ca, Leaf};

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
async fn a_boolean_flag_with_another_value_is_refused_with_it_named() {
    let dead = dead_endpoint();
    for flag in ["--enable-pprof", "--experimental-enable-grpc-logging"] {
        check(
            &["start", &dead, &format!("{flag}=maybe")],
            &[flag, "maybe"],
        )
        .await;
    }
}

#[tokio::test]
async fn discovery_flags_that_do_not_fit_together_are_refused_with_etcds_words() {
    let dead = dead_endpoint();
    check(
        &["start", &dead, "--resolver-prefix=/p"],
        &["invalid resolver-ttl 0"],
    )
    .await;
    check(
        &["start", &dead, "--resolver-ttl=5"],
        &["invalid resolver-prefix"],
    )
    .await;
    check(
        &["start", &dead, "--advertise-client-url=a%b:1"],
        &["--advertise-client-url", "a%b:1"],
    )
    .await;
    check(
        &["start", &dead, "--endpoints-auto-sync-interval=soon"],
        &["--endpoints-auto-sync-interval"],
    )
    .await;
}

/// TLS files that cannot serve stop the proxy at start, with the file and the reason named.
#[tokio::test]
async fn tls_files_that_cannot_serve_are_named_with_the_reason() {
    let dir = testkit::dirs::temp_dir("bad-tls-").expect("temp dir");
    let ca = Ca::new("bad-input-ca").expect("CA");
    let server = ca
        .server()
        .expect("server certificate")
        .write(dir.path(), "server")
        .expect("write");
    let expired = ca
        .issue(&Leaf::server().expired())
        .expect("issue")
        .write(dir.path(), "expired")
        .expect("write");
    let future = ca
        .issue(&Leaf::server().not_yet_valid())
        .expect("issue")
        .write(dir.path(), "future")
        .expect("write");
    let other = ca
        .server()
        .expect("server certificate")
        .write(dir.path(), "other")
        .expect("write");
    let with_cn = ca
        .client(Some("root"))
        .expect("client certificate")
        .write(dir.path(), "cn")
        .expect("write");
    let ca_file = ca.write(dir.path(), "ca").expect("write CA");
    let not_pem = dir.path().join("not.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    let missing = dir.path().join("missing.pem");
    let path = |p: &std::path::Path| p.display().to_string();
    let dead = dead_endpoint();
    let listen = |cert: &std::path::Path, key: &std::path::Path| {
        vec![
            format!("--cert-file={}", path(cert)),
            format!("--key-file={}", path(key)),
        ]
    };
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            listen(&missing, &server.1),
            vec![path(&missing), "cannot read".into()],
        ),
        (
            listen(&not_pem, &server.1),
            vec![path(&not_pem), "no certificate".into()],
        ),
        (
            listen(&server.0, &not_pem),
            vec![path(&not_pem), "no private key".into()],
        ),
        (
            listen(&expired.0, &expired.1),
            vec![path(&expired.0), "expired".into()],
        ),
        (
            listen(&future.0, &future.1),
            vec![path(&future.0), "not valid before".into()],
        ),
        (
            listen(&server.0, &other.1),
            vec![path(&server.0), path(&other.1), "does not match".into()],
        ),
        (
            [
                listen(&server.0, &server.1),
                vec![format!("--trusted-ca-file={}", path(&not_pem))],
            ]
            .concat(),
            vec![path(&not_pem), "no certificate".into()],
        ),
        (
            vec![
                format!("--cert={}", path(&with_cn.0)),
                format!("--key={}", path(&with_cn.1)),
                format!("--cacert={}", path(&ca_file)),
            ],
            vec![
                path(&with_cn.0),
                "Common Name \"root\"".into(),
                "--allow-cert-common-name".into(),
            ],
        ),
        (
            vec![format!("--cacert={}", path(&missing))],
            vec![path(&missing), "cannot read".into()],
        ),
    ];
    for (flags, needles) in cases {
        let args: Vec<&str> = ["start", dead.as_str()]
            .into_iter()
            .chain(flags.iter().map(String::as_str))
            .collect();
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        check(&args, &needles).await;
    }
}

#[tokio::test]
async fn tls_flags_that_would_change_nothing_or_that_rustls_lacks_are_refused() {
    for (flags, needles) in [
        (
            &["--endpoints=https://127.0.0.1:1,http://127.0.0.1:2"][..],
            &["mixes http:// and https://"][..],
        ),
        (
            &["--trusted-ca-file=ca.pem"],
            &["--trusted-ca-file", "TLS towards clients, which is off"],
        ),
        (
            &["--auto-tls", "--tls-min-version=TLS1.1"],
            &["TLS1.1", "not supported"],
        ),
        (
            &[
                "--auto-tls",
                "--listen-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA",
            ],
            &["TLS_RSA_WITH_AES_128_CBC_SHA is not supported"],
        ),
        (
            &["--metrics-addr=https://127.0.0.1:1"],
            &["--metrics-addr", "--cert-file"],
        ),
    ] {
        let args: Vec<&str> = ["start"].into_iter().chain(flags.iter().copied()).collect();
        check(&args, needles).await;
    }
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
