//! `--enable-pprof`: `/debug/pprof/` on the client port as etcd's Go proxy serves it. A CPU profile taken while
//! clients keep the proxy busy is one Go's own `go tool pprof` reads and that names the proxy's functions; one
//! profile runs at a time; the paths are 404 without the flag and on `--metrics-addr`; an unknown profile and a busy
//! profiler are answered in the words of etcd's Go proxy, run beside it.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use support::grpc::channel;
use testkit::http;

/// The Go command: `GO`, else `go` on the PATH, else Go's default install directory (where CI has it).
fn go() -> Option<PathBuf> {
    if let Ok(go) = std::env::var("GO") {
        return Some(go.into());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("go"))
        .chain([PathBuf::from("/usr/local/go/bin/go")])
        .find(|go| go.is_file())
}

/// Puts and reads through the proxy until `stop`, so that a profile has the proxy's own work to sample.
fn load(addr: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut kv = KvClient::new(channel(&addr).await);
        let mut calls = 0;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("load/{}", calls % 64).into_bytes();
            kv.put(PutRequest {
                key: key.clone(),
                value: vec![b'v'; 256],
                ..Default::default()
            })
            .await
            .expect("put through the proxy");
            kv.range(RangeRequest {
                key,
                serializable: calls % 2 == 0,
                ..Default::default()
            })
            .await
            .expect("range through the proxy");
            calls += 1;
        }
        calls
    })
}

/// `GET url` with curl: the status and the body as bytes.
async fn fetch(url: &str) -> (u16, Vec<u8>) {
    let file = tempfile::NamedTempFile::new().expect("temp file for the body");
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "60", "-o"])
        .arg(file.path())
        .args(["-w", "%{http_code}", url])
        .output()
        .await
        .expect("run curl");
    let status = String::from_utf8_lossy(&out.stdout);
    let status = status.trim().parse().unwrap_or_else(|_| {
        panic!(
            "curl {url}: {status:?} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (status, std::fs::read(file.path()).expect("read the body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cpu_profile_under_load_is_read_by_go_tool_pprof_and_names_the_proxy() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let go = go();
    if go.is_none() {
        assert!(
            !testkit::ci(),
            "no Go command under CI=true (set GO, or install Go at /usr/local/go)"
        );
        eprintln!(
            "SKIPPED the `go tool pprof` check: no Go command (set GO or put go on the PATH)"
        );
    }
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &["--enable-pprof"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let loads: Vec<_> = (0..4).map(|_| load(proxy.addr(), stop.clone())).collect();

    let (status, profile) = fetch(&format!(
        "http://{}/debug/pprof/profile?seconds=2",
        proxy.addr()
    ))
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut calls = 0;
    for load in loads {
        calls += load.await.expect("load task");
    }
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&profile));
    assert!(
        calls > 0,
        "no call went through the proxy while it was profiled"
    );
    assert!(!profile.is_empty());

    let Some(go) = go else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("cpu.pb");
    std::fs::write(&file, &profile).expect("write the profile");
    let out = tokio::process::Command::new(&go)
        .args(["tool", "pprof", "-top", "-nodecount=100000"])
        .arg(&file)
        .current_dir(dir.path())
        .env("GOTOOLCHAIN", "local")
        .output()
        .await
        .expect("run go tool pprof");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "go tool pprof failed:\n{report}");
    assert!(
        report.contains("Type: cpu"),
        "not read as a CPU profile:\n{report}"
    );
    assert!(
        report.contains("proxy::"),
        "no function of the proxy in the profile:\n{report}"
    );
    // The sampler's own frames (the unwinder in its signal handler) are not the profile's leaves.
    assert!(
        !report.contains("trace_unsynchronized"),
        "the sampler's frames are in the profile:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cpu_profile_at_a_time_and_the_index_lists_what_is_served() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let metrics_port = testkit::free_port();
    let proxy = support::proxy::start(
        &etcd.endpoints(),
        &[
            "--enable-pprof",
            &format!("--metrics-addr=http://127.0.0.1:{metrics_port}"),
            "--worker-threads=3",
        ],
    )
    .await;
    let addr = proxy.addr();

    let (status, index) = http::get(&addr, "/debug/pprof/").await.expect("index");
    assert_eq!(status, 200, "{index}");
    for name in ["profile", "cmdline", "tasks"] {
        assert!(index.contains(&format!("href='{name}'")), "{index}");
    }
    // The system allocator keeps no samples: no heap profile is offered, and asking for one is Go's 404.
    assert!(!index.contains("heap"), "{index}");
    assert_eq!(
        http::get(&addr, "/debug/pprof/heap").await,
        Ok((404, "Unknown profile\n".to_string()))
    );
    let (status, tasks) = http::get(&addr, "/debug/pprof/tasks").await.expect("tasks");
    assert_eq!(status, 200, "{tasks}");
    // Counted over the three workers' runtimes, each a single thread.
    assert!(tasks.starts_with("workers: 3\nalive_tasks: "), "{tasks}");
    let alive: usize = tasks
        .lines()
        .find_map(|line| line.strip_prefix("alive_tasks: "))
        .and_then(|count| count.parse().ok())
        .expect("a count of alive tasks");
    // At least the accept loop, this connection and its call, on whichever runtimes they run.
    assert!(alive >= 3, "{tasks}");
    let (status, cmdline) = http::get(&addr, "/debug/pprof/cmdline")
        .await
        .expect("cmdline");
    assert_eq!(status, 200);
    assert!(
        cmdline.split('\0').any(|arg| arg == "--enable-pprof"),
        "{cmdline:?}"
    );
    let (status, too_long) = http::get(&addr, "/debug/pprof/profile?seconds=100000")
        .await
        .expect("a too long profile");
    assert_eq!(status, 400, "{too_long}");
    assert!(too_long.contains("300 seconds"), "{too_long}");

    // The process has one profiler: of two profiles asked for at once, one is refused with Go's words.
    let first = http::get(&addr, "/debug/pprof/profile?seconds=2");
    let second = http::get(&addr, "/debug/pprof/profile?seconds=2");
    let (first, second) = tokio::join!(first, second);
    let mut answers = [
        first.expect("first profile"),
        second.expect("second profile"),
    ];
    answers.sort_by_key(|(status, _)| *status);
    let [(ok, _), refused] = answers;
    assert_eq!(ok, 200);
    assert_eq!(
        refused,
        (
            500,
            "Could not enable CPU profiling: cpu profiling already in use\n".to_string()
        )
    );
    // Once the profile is done, the profiler is free again.
    let (status, body) = http::get(&addr, "/debug/pprof/profile?seconds=1")
        .await
        .expect("a later profile");
    assert_eq!(status, 200, "{body}");

    // Not on --metrics-addr, as etcd's proxy serves pprof on its main listener only.
    assert_eq!(
        http::get(&format!("127.0.0.1:{metrics_port}"), "/debug/pprof/")
            .await
            .map(|(status, _)| status),
        Ok(404)
    );
}

#[tokio::test]
async fn without_the_flag_the_paths_are_not_found() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    for path in [
        "/debug/pprof/",
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/tasks",
    ] {
        assert_eq!(
            http::get(&proxy.addr(), path).await,
            Ok((404, "404 page not found\n".to_string())),
            "{path}"
        );
    }
}

/// etcd's Go proxy of `binaries`' version with `--enable-pprof` in front of `upstream`, ready; its data and log in
/// `dir`.
async fn go_proxy(
    binaries: &testkit::Binaries,
    upstream: &str,
    dir: &std::path::Path,
) -> (testkit::process::Process, String) {
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut cmd = std::process::Command::new(&binaries.etcd);
    // Its own address as the advertise URL: etcd 3.5.30's proxy dials that at start.
    cmd.args(["grpc-proxy", "start", "--enable-pprof"])
        .arg(format!("--endpoints={upstream}"))
        .arg(format!("--listen-addr={addr}"))
        .arg(format!("--advertise-client-url={addr}"))
        .arg(format!("--data-dir={}", dir.join("go-proxy").display()));
    let mut process =
        testkit::process::Process::spawn("etcd's Go grpc-proxy", cmd, &dir.join("go-proxy.log"))
            .unwrap_or_else(|e| panic!("{e}"));
    process
        .wait_http(&addr, "/health", Duration::from_secs(60), |code, _| {
            code == 200
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    (process, addr)
}

/// What a proxy at `addr` answers to an unknown profile, and to two CPU profiles asked for at once (sorted by
/// status, profile bytes left out).
async fn refusals(addr: &str) -> Vec<Result<(u16, String), String>> {
    let unknown = http::get(addr, "/debug/pprof/no-such-profile").await;
    let first = http::get(addr, "/debug/pprof/profile?seconds=2");
    let second = http::get(addr, "/debug/pprof/profile?seconds=2");
    let (first, second) = tokio::join!(first, second);
    let mut both = [first, second].map(|answer| {
        answer.map(|(status, body)| (status, if status == 200 { String::new() } else { body }))
    });
    both.sort();
    [vec![unknown], both.to_vec()].concat()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_profiles_and_a_busy_profiler_are_answered_as_etcds_go_proxy_answers() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let (_go, go_addr) = go_proxy(&binaries, &etcd.endpoint(0), dir.path()).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &["--enable-pprof"]).await;
    let go = refusals(&go_addr).await;
    assert_eq!(
        go[1..],
        [
            Ok((200, String::new())),
            Ok((
                500,
                "Could not enable CPU profiling: cpu profiling already in use\n".to_string()
            ))
        ],
        "etcd's Go proxy"
    );
    assert_eq!(refusals(&proxy.addr()).await, go);
}
