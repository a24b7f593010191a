//! The serving workers (`--worker-threads`): each client connection is served by one worker, and so are the calls on
//! it. In the binary a worker is a single-threaded runtime on a thread of its own (`main.rs` starts them); in the
//! simulation and in tests several workers may share one runtime. Either way a call knows its worker
//! ([`current`]), and the upstream sends it on that worker's own connection to etcd: a call then never wakes
//! another thread, which is what one thread per call costs and a work-stealing runtime does not (issue 13 measured
//! tokio's at about 1.5 times the CPU per call).
//!
//! What clients share stays shared across workers: failover, the watch hubs, the keep-alive coalescers, the range
//! cache and the revision floor, so that N clients on N workers are still one watcher and one keep-alive stream on
//! etcd. The proxy's own tasks call etcd on worker 0's connections; the heartbeat and the probes run on the runtime
//! that started the proxy (worker 0's), the hubs and coalescers on the runtime of the worker whose client started
//! them.
//!
//! The heartbeat and the probes ask a member on every worker's connection: the network can break one connection
//! and not another, and a worker's calls must not hang on a connection nobody asks on (simulation seeds failover
//! 45719, 47296 and 47403 with two workers, when only one connection was asked).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::task::{AbortHandle, JoinSet};

tokio::task_local! {
    /// The worker whose connection the running task serves.
    static WORKER: usize;
}

/// The worker the running task serves a connection for; 0 outside any (the proxy's own tasks: probes, hubs,
/// coalescers).
pub fn current() -> usize {
    WORKER.try_with(|worker| *worker).unwrap_or(0)
}

/// The runtimes the workers run on, one handle per worker.
#[derive(Clone)]
pub struct Workers {
    handles: Arc<[Handle]>,
    /// Each runtime once (several workers may share one).
    runtimes: Arc<[Handle]>,
    /// The worker the next connection goes to.
    next: Arc<AtomicUsize>,
}

impl Workers {
    /// One worker per handle, each a runtime of its own (the binary: one single-threaded runtime per thread).
    ///
    /// # Panics
    /// With no handle: a proxy needs at least one worker.
    pub fn on(handles: Vec<Handle>) -> Self {
        assert!(!handles.is_empty(), "a proxy has at least one worker");
        let handles: Arc<[Handle]> = handles.into();
        Self {
            runtimes: handles.clone(),
            handles,
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// `count` workers (at least one), all on the runtime the caller runs on: the simulation and tests.
    pub fn on_current(count: usize) -> Self {
        let current = Handle::current();
        Self {
            handles: vec![current.clone(); count.max(1)].into(),
            runtimes: [current].into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The runtimes the workers run on, each once.
    pub fn runtimes(&self) -> &[Handle] {
        &self.runtimes
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Always false: there is at least one worker.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The worker the next connection is served by: each in turn.
    pub fn next(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len()
    }

    /// Spawns `task` into `set` on `worker`'s runtime, as that worker's.
    pub fn spawn_into<F>(&self, set: &mut JoinSet<F::Output>, worker: usize, task: F) -> AbortHandle
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        set.spawn_on(WORKER.scope(worker, task), &self.handles[worker])
    }

    /// What spawns the tasks of `worker`: hyper's per-call tasks and the tasks of its upstream connections.
    pub fn executor(&self, worker: usize) -> WorkerExecutor {
        WorkerExecutor {
            worker,
            handle: self.handles[worker].clone(),
        }
    }
}

/// Spawns every task it is given on one worker's runtime, as that worker's.
#[derive(Clone)]
pub struct WorkerExecutor {
    worker: usize,
    handle: Handle,
}

impl<F> hyper::rt::Executor<F> for WorkerExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, task: F) {
        self.handle.spawn(WORKER.scope(self.worker, task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor;

    /// A second single-threaded runtime on a thread of its own, as `main.rs` starts one per worker.
    fn second_runtime() -> (
        Handle,
        std::thread::ThreadId,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            runtime.block_on(async {
                let _ = stopped.await;
            })
        });
        (handle, thread.thread().id(), stop)
    }

    #[tokio::test]
    async fn a_workers_tasks_run_on_its_runtime() {
        let (other, other_thread, stop) = second_runtime();
        let workers = Workers::on(vec![Handle::current(), other]);
        assert_eq!(workers.runtimes().len(), 2);
        let mut set = JoinSet::new();
        workers.spawn_into(&mut set, 1, async { std::thread::current().id() });
        workers.spawn_into(&mut set, 0, async { std::thread::current().id() });
        let mut ran_on = Vec::new();
        while let Some(thread) = set.join_next().await {
            ran_on.push(thread.expect("ran"));
        }
        assert!(ran_on.contains(&other_thread), "{ran_on:?}");
        assert!(ran_on.contains(&std::thread::current().id()), "{ran_on:?}");
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.executor(1).execute(async move {
            let _ = tx.send(std::thread::current().id());
        });
        assert_eq!(rx.await.expect("ran"), other_thread);
        let _ = stop.send(());
    }

    #[tokio::test]
    async fn tasks_spawned_for_a_worker_know_it_and_others_are_worker_0() {
        let workers = Workers::on_current(3);
        assert_eq!(current(), 0);
        let mut set = JoinSet::new();
        workers.spawn_into(&mut set, 2, async { current() });
        assert_eq!(set.join_next().await.expect("one task").expect("ran"), 2);
        let (tx, rx) = tokio::sync::oneshot::channel();
        workers.executor(1).execute(async move {
            let _ = tx.send(current());
        });
        assert_eq!(rx.await.expect("ran"), 1);
        // A task spawned plainly from a worker's task is the proxy's own, not the worker's.
        let mut set = JoinSet::new();
        workers.spawn_into(&mut set, 2, async {
            tokio::spawn(async { current() }).await.expect("ran")
        });
        assert_eq!(set.join_next().await.expect("one task").expect("ran"), 0);
    }

    #[tokio::test]
    async fn connections_go_to_each_worker_in_turn() {
        let workers = Workers::on_current(3);
        let order: Vec<usize> = (0..7).map(|_| workers.next()).collect();
        assert_eq!(order, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(workers.runtimes().len(), 1, "three workers on one runtime");
        assert_eq!(Workers::on_current(0).len(), 1);
    }
}
