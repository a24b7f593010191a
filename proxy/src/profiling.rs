//! `--enable-pprof`: `/debug/pprof/` on the main port, answered the way Go's `net/http/pprof` answers for etcd's
//! proxy, with the profiles this process can really give:
//!
//! - `profile`: a CPU profile in pprof's protobuf format (`go tool pprof` reads it), sampled 100 times a second of
//!   CPU time by the `pprof` crate (SIGPROF); `?seconds=N` as Go takes it (absent, unparsable or not positive: 30),
//!   at most [`MAX_PROFILE_SECONDS`], one at a time in the process;
//! - `cmdline`: the command line, arguments separated by NUL bytes, as Go serves it;
//! - `tasks`: the async runtime's counts (workers, live tasks, queued tasks). Plain text: tokio keeps no stacks of
//!   its tasks in a release build, so there is nothing like Go's `goroutine` stacks to give.
//!
//! There is no heap profile: the proxy runs on the system allocator, which samples nothing. Any other name is
//! answered 404 "Unknown profile", as Go answers a name it does not know.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::Full;
use tonic::body::Body;

use crate::workers::Workers;

/// Where the routes live.
pub const PREFIX: &str = "/debug/pprof";

/// The longest CPU profile one request may ask for. Go bounds a profile only by the HTTP server's write timeout,
/// which etcd's proxy does not set; a bound keeps a forgotten request from holding the profiler for hours.
pub const MAX_PROFILE_SECONDS: u64 = 300;

/// Go's default when `seconds` is absent or not a positive number.
const DEFAULT_PROFILE_SECONDS: u64 = 30;

/// Samples a second, as Go's CPU profiler takes them.
const SAMPLES_PER_SECOND: i32 = 100;

/// Libraries the sampler does not unwind through: unwinding inside them from a signal handler can deadlock (the
/// `pprof` crate's advice).
const UNWIND_BLOCKLIST: &[&str] = &["libc", "libgcc", "pthread", "vdso"];

/// The profiles the index lists: name and description.
const PROFILES: &[(&str, &str)] = &[
    (
        "cmdline",
        "The command line invocation of the current program",
    ),
    (
        "profile",
        "CPU profile. You can specify the duration in the seconds GET parameter. After you get the profile file, \
         use the go tool pprof command to investigate the profile.",
    ),
    (
        "tasks",
        "Counts over the workers' async runtimes: workers, live tasks, tasks waiting in the global queues (no stacks).",
    ),
];

/// Answers a request whose path starts with [`PREFIX`] (any method, as Go's handlers take any).
pub async fn serve(path: &str, query: Option<&str>, workers: &Workers) -> Response<Body> {
    let Some(rest) = path.strip_prefix(PREFIX) else {
        return not_found();
    };
    match rest {
        // Go's ServeMux sends the path without its slash to the subtree's root.
        "" => {
            let mut response = text(
                StatusCode::MOVED_PERMANENTLY,
                "text/html; charset=utf-8",
                format!("<a href=\"{PREFIX}/\">Moved Permanently</a>.\n\n"),
            );
            response
                .headers_mut()
                .insert(header::LOCATION, HeaderValue::from_static("/debug/pprof/"));
            response
        }
        "/" => text(StatusCode::OK, "text/html; charset=utf-8", index()),
        "/profile" => cpu_profile(query).await,
        "/cmdline" => text(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            std::env::args().collect::<Vec<_>>().join("\0"),
        ),
        "/tasks" => text(StatusCode::OK, "text/plain; charset=utf-8", tasks(workers)),
        other if other.starts_with('/') => pprof_error(StatusCode::NOT_FOUND, "Unknown profile"),
        // `/debug/pprofx` is not under the subtree.
        _ => not_found(),
    }
}

/// The HTML page listing the profiles, in the shape of Go's.
fn index() -> String {
    let mut page = String::from(
        "<html>\n<head>\n<title>/debug/pprof/</title>\n</head>\n<body>\n/debug/pprof/\n<br>\n\
         Types of profiles available:\n<table>\n<thead><td>Profile</td></thead>\n",
    );
    for (name, _) in PROFILES {
        page.push_str(&format!("<tr><td><a href='{name}'>{name}</a></td></tr>\n"));
    }
    page.push_str("</table>\n<br>\n<p>\nProfile Descriptions:\n<ul>\n");
    for (name, description) in PROFILES {
        page.push_str(&format!(
            "<li><div class=profile-name>{name}: </div> {description}</li>\n"
        ));
    }
    page.push_str("</ul>\n</p>\n</body>\n</html>\n");
    page
}

/// The counts over every worker's runtime (each worker is a single-threaded runtime of its own in the binary).
fn tasks(workers: &Workers) -> String {
    let (mut alive, mut queued) = (0, 0);
    for runtime in workers.runtimes() {
        let metrics = runtime.metrics();
        alive += metrics.num_alive_tasks();
        queued += metrics.global_queue_depth();
    }
    format!(
        "workers: {}\nalive_tasks: {alive}\nglobal_queue_depth: {queued}\n",
        workers.len()
    )
}

/// How long a CPU profile runs, or why the request is refused.
fn profile_seconds(query: Option<&str>) -> Result<u64, String> {
    let given = query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("seconds="))
        .and_then(|raw| raw.parse::<i64>().ok())
        .filter(|seconds| *seconds > 0);
    match given {
        None => Ok(DEFAULT_PROFILE_SECONDS),
        Some(seconds) if seconds.unsigned_abs() > MAX_PROFILE_SECONDS => Err(format!(
            "profile duration exceeds the proxy's limit of {MAX_PROFILE_SECONDS} seconds"
        )),
        Some(seconds) => Ok(seconds.unsigned_abs()),
    }
}

async fn cpu_profile(query: Option<&str>) -> Response<Body> {
    let seconds = match profile_seconds(query) {
        Ok(seconds) => seconds,
        Err(why) => return pprof_error(StatusCode::BAD_REQUEST, &why),
    };
    // Go's words when its profiler is already taken.
    let Some(slot) = CpuProfilerSlot::take() else {
        return pprof_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Could not enable CPU profiling: cpu profiling already in use",
        );
    };
    let guard = match pprof::ProfilerGuardBuilder::default()
        .frequency(SAMPLES_PER_SECOND)
        .blocklist(UNWIND_BLOCKLIST)
        .build()
    {
        Ok(guard) => guard,
        Err(err) => {
            return pprof_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("Could not enable CPU profiling: {err}"),
            );
        }
    };
    // Should the server drop this future (its connection ended), the guard goes with it and the profiler stops.
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    // Symbolising the samples reads debug information for a while: off the runtime's threads.
    let encoded = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let report = guard
            .report()
            .frames_post_processor(drop_sampler_frames)
            .build();
        drop(guard);
        let profile = report?.pprof()?;
        Ok::<_, pprof::Error>(pprof::protos::Message::encode_to_vec(&profile))
    })
    .await;
    match encoded {
        Ok(Ok(bytes)) => {
            let mut response = Response::new(Body::new(Full::new(Bytes::from(bytes))));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            headers.insert(
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment; filename=\"profile\""),
            );
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            response
        }
        Ok(Err(err)) => pprof_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Could not build the CPU profile: {err}"),
        ),
        Err(err) => pprof_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("Could not build the CPU profile: {err}"),
        ),
    }
}

/// Each sample's stack starts (leaf first) with the sampler's own frames, the unwinder called from its signal
/// handler: without them a profile's leaves are the proxy's code, as Go's are its program's.
fn drop_sampler_frames(frames: &mut pprof::Frames) {
    let sampler = frames
        .frames
        .iter()
        .take_while(|symbols| symbols.iter().any(|symbol| is_sampler(&symbol.name())))
        .count();
    frames.frames.drain(..sampler);
}

fn is_sampler(function: &str) -> bool {
    function.starts_with("backtrace::") || function.contains("pprof::backtrace::")
}

/// The process has one CPU profiler (one SIGPROF timer): whoever holds this slot may run it.
struct CpuProfilerSlot;

static CPU_PROFILER_TAKEN: AtomicBool = AtomicBool::new(false);

impl CpuProfilerSlot {
    fn take() -> Option<Self> {
        CPU_PROFILER_TAKEN
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then_some(Self)
    }
}

impl Drop for CpuProfilerSlot {
    fn drop(&mut self) {
        CPU_PROFILER_TAKEN.store(false, Ordering::Release);
    }
}

/// An error the way Go's pprof handlers write one.
fn pprof_error(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = text(status, "text/plain; charset=utf-8", format!("{message}\n"));
    response
        .headers_mut()
        .insert("x-go-pprof", HeaderValue::from_static("1"));
    response
}

fn not_found() -> Response<Body> {
    text(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        "404 page not found\n".into(),
    )
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(Bytes::from(body))));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_read_as_go_reads_them_and_bounded() {
        for (query, seconds) in [
            (None, Ok(30)),
            (Some("seconds=2"), Ok(2)),
            (Some("debug=1&seconds=+7"), Ok(7)),
            (Some("seconds=0"), Ok(30)),
            (Some("seconds=-5"), Ok(30)),
            (Some("seconds=two"), Ok(30)),
            (Some("seconds=300"), Ok(300)),
        ] {
            assert_eq!(profile_seconds(query), seconds, "{query:?}");
        }
        let refused = profile_seconds(Some("seconds=301")).unwrap_err();
        assert!(refused.contains("300 seconds"), "{refused}");
    }

    #[test]
    fn the_samplers_own_frames_are_dropped() {
        let symbol = |name: &str| pprof::Symbol {
            name: Some(name.as_bytes().to_vec()),
            addr: None,
            lineno: None,
            filename: None,
        };
        let mut frames = pprof::Frames {
            frames: vec![
                vec![symbol("backtrace::backtrace::trace_unsynchronized")],
                vec![symbol(
                    "<pprof::backtrace::backtrace_rs::Trace as pprof::backtrace::Trace>::trace",
                )],
                vec![symbol("proxy::server::handle")],
                vec![symbol("backtrace::not_a_leaf")],
            ],
            thread_name: "main".into(),
            thread_id: 1,
            sample_timestamp: std::time::UNIX_EPOCH,
        };
        drop_sampler_frames(&mut frames);
        let names: Vec<_> = frames.frames.iter().map(|f| f[0].name()).collect();
        assert_eq!(names, ["proxy::server::handle", "backtrace::not_a_leaf"]);
    }

    #[test]
    fn only_one_holder_of_the_cpu_profiler_at_a_time() {
        let first = CpuProfilerSlot::take().expect("free at first");
        assert!(CpuProfilerSlot::take().is_none());
        drop(first);
        assert!(CpuProfilerSlot::take().is_some());
    }

    #[tokio::test]
    async fn unknown_profiles_are_404_as_go_answers_them() {
        let one = Workers::on_current(1);
        let response = serve("/debug/pprof/heap", None, &one).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()["x-go-pprof"], "1");
        assert_eq!(body(response).await, "Unknown profile\n");
        let response = serve("/debug/pprof", None, &one).await;
        assert_eq!(response.status(), StatusCode::MOVED_PERMANENTLY);
        assert_eq!(response.headers()[header::LOCATION], "/debug/pprof/");
    }

    #[tokio::test]
    async fn the_index_lists_what_is_served() {
        let two = Workers::on_current(2);
        let page = body(serve("/debug/pprof/", None, &two).await).await;
        for (name, _) in PROFILES {
            assert!(page.contains(&format!("href='{name}'")), "{page}");
        }
        assert!(!page.contains("heap"), "{page}");
        let tasks = body(serve("/debug/pprof/tasks", None, &two).await).await;
        assert!(tasks.starts_with("workers: 2\nalive_tasks: "), "{tasks}");
    }

    async fn body(response: Response<Body>) -> String {
        use http_body_util::BodyExt;
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
}
