//! `etcd-grpc-proxy start ...`: parses etcd's flags, sets up logging, looks the endpoints up in DNS for
//! `--discovery-srv`, and runs the proxy until SIGTERM or SIGINT, telling systemd when it serves and when it stops.

mod srv_sockets;
mod systemd;

use std::process::ExitCode;
use std::sync::Arc;

use proxy::net::TokioNet;

fn main() -> ExitCode {
    let cli = match proxy::cli::parse(std::env::args_os(), os_seed) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let outputs = match proxy::logging::LogOutputs::open(&cli.log_outputs) {
        Ok(outputs) => outputs,
        Err(err) => {
            eprintln!("etcd-grpc-proxy: {err}");
            return ExitCode::FAILURE;
        }
    };
    proxy::logging::init(cli.log_level, outputs);
    for warning in &cli.warnings {
        tracing::warn!("{warning}");
    }
    tracing::info!(
        seed = cli.config.seed,
        from_flag = cli.seed_given,
        "random seed"
    );
    let mut config = cli.config;
    let open_files = raise_open_file_limit();
    config.max_client_connections = cli
        .max_client_connections
        .unwrap_or_else(|| connections_for(open_files));
    tracing::info!(
        open_files,
        max_client_connections = config.max_client_connections,
        max_client_calls = config.max_client_calls,
        "limits"
    );
    config.workers = workers_for(cli.worker_threads);
    let runtime = match single_threaded_runtime() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("etcd-grpc-proxy: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    // Worker 0 is the main thread's runtime; the others get a thread and a runtime each.
    let started: std::io::Result<Vec<WorkerThread>> =
        (1..config.workers).map(WorkerThread::start).collect();
    let extra_workers = match started {
        Ok(threads) => threads,
        Err(err) => {
            eprintln!("etcd-grpc-proxy: cannot start a worker thread: {err}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(workers = config.workers, "serving workers");
    if let Some(request) = &cli.srv {
        let found = runtime.block_on(srv_sockets::discover(request));
        if let Err(err) =
            found.and_then(|endpoints| proxy::cli::srv::use_endpoints(&mut config, endpoints))
        {
            eprintln!("etcd-grpc-proxy: {err}");
            return ExitCode::FAILURE;
        }
    }
    let served = runtime.block_on(async {
        // Signals are caught from here on: a SIGTERM right after READY=1 is a graceful shutdown too.
        let signal = shutdown_signal();
        let shutdown = async {
            signal.await;
            systemd::notify(systemd::STOPPING);
        };
        let handles = std::iter::once(tokio::runtime::Handle::current())
            .chain(extra_workers.iter().map(|worker| worker.handle.clone()))
            .collect();
        proxy::BoundProxy::bind(config, Arc::new(TokioNet))
            .await?
            .serve_on(proxy::workers::Workers::on(handles), shutdown, || {
                systemd::notify(systemd::READY)
            })
            .await
    });
    for worker in extra_workers {
        worker.stop();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("etcd-grpc-proxy: {err}");
            ExitCode::FAILURE
        }
    }
}

/// How many workers `--worker-threads` asks for: that many, or with 0 (the default) as many as the process may use:
/// the host's cores, or fewer under a CPU quota or affinity mask (a container's), which the standard library reads.
fn workers_for(worker_threads: usize) -> usize {
    if worker_threads > 0 {
        return worker_threads;
    }
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Each worker is one single-threaded runtime: on the benchmark machine one thread spent about 0.6 of the CPU per
/// call that tokio's work-stealing scheduler spent (no stealing, no wake-ups across threads, more frames written per
/// system call), with higher throughput and lower p99 (README.md, Performance).
fn single_threaded_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// A worker after the first: a thread running its own runtime until told to stop.
struct WorkerThread {
    handle: tokio::runtime::Handle,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl WorkerThread {
    fn start(index: usize) -> std::io::Result<Self> {
        let runtime = single_threaded_runtime()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("worker-{index}"))
            .spawn(move || {
                // The runtime runs its tasks only while it is blocked on: until the proxy has stopped serving.
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(Self {
            handle,
            stop,
            thread,
        })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// File descriptors kept for what is not a client connection: etcd connections, TLS and other files, listeners.
const RESERVED_FILES: u64 = 256;

/// Raises the soft limit on open files to the hard limit, as Go's runtime does for etcd's proxy; returns the limit
/// now in force (`None`: unlimited or unknown).
fn raise_open_file_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(err) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(%err, "cannot raise the open-file limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The default `--max-client-connections`: every descriptor the limit allows but the reserved ones.
fn connections_for(open_files: Option<u64>) -> usize {
    match open_files {
        Some(limit) => {
            usize::try_from(limit.saturating_sub(RESERVED_FILES).max(16)).unwrap_or(usize::MAX)
        }
        None => proxy::config::DEFAULT_MAX_CLIENT_CONNECTIONS,
    }
}

/// The seed when `--seed` is absent: drawn once from the OS.
fn os_seed() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random source is available");
    u64::from_le_bytes(bytes)
}

/// Catches SIGTERM and SIGINT from the call on (inside the runtime); completes when one arrives.
fn shutdown_signal() -> impl Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            tracing::error!("cannot install signal handlers; stop the proxy with SIGKILL");
            return std::future::pending().await;
        };
        tokio::select! {
            biased;
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    }
}
