//! std's monotonic clock as a simulation's thread reads it: the simulation's time while a [`Simulated`] is alive
//! on that thread, the kernel's everywhere else.
//!
//! Why it exists: turmoil owns tokio's clock, and the proxy reads time only through `tokio::time`. But h2, under
//! hyper's server and tonic's channel on both ends of every simulated connection, reads `std::time::Instant` to
//! forget a stream it reset: a frame for that stream arriving within 1 s is dropped silently, a later one is
//! answered with RST_STREAM. On the machine's clock that second was real time, so the machine's load decided
//! whether the extra frame was sent, and the frame moved turmoil's random generator: one seed could give two runs
//! (with 6 busy loops on 2 cores, 21 such expiries in the six scenarios' seed 0; forcing them all changed `cache`
//! seed 0's digest). Neither hyper's server nor tonic's channel lets that duration be set.
//!
//! How: this crate defines the C library's `clock_gettime`. The executable's own definition wins over the shared C
//! library's, so std's `Instant::now` calls this one. On a thread inside a [`Simulated`], `CLOCK_MONOTONIC` reads
//! the instant the simulation last set; every other call goes to the kernel (by system call, not the vDSO:
//! slower, and only in the simulation's test processes; the proxy's binary does not link this crate).

use std::cell::Cell;
use std::marker::PhantomData;
use std::time::Duration;

thread_local! {
    /// The monotonic clock's reading on this thread while a simulation runs here (`None`: ask the kernel).
    static SIMULATED_NOW: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// While alive, std's monotonic clock on this thread reads the kernel's reading at [`Simulated::start`] plus the
/// simulated time given to [`Simulated::at`]. Bound to the thread that started it.
pub struct Simulated {
    started_at: Duration,
    _one_thread: PhantomData<*const ()>,
}

impl Simulated {
    /// Freezes this thread's monotonic clock at the kernel's current reading (simulated time zero).
    pub fn start() -> Self {
        assert!(
            SIMULATED_NOW.get().is_none(),
            "a simulation already runs on this thread"
        );
        let started_at = kernel_monotonic();
        SIMULATED_NOW.set(Some(started_at));
        Self {
            started_at,
            _one_thread: PhantomData,
        }
    }

    /// Moves this thread's monotonic clock to `elapsed` of simulated time after [`Simulated::start`].
    pub fn at(&self, elapsed: Duration) {
        SIMULATED_NOW.set(Some(self.started_at + elapsed));
    }
}

impl Drop for Simulated {
    fn drop(&mut self) {
        SIMULATED_NOW.set(None);
    }
}

fn kernel_monotonic() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Calling our own definition (no simulation is set on this thread yet) also makes the linker keep it.
    #[allow(unsafe_code)]
    // SAFETY: `now` is a valid, writable timespec for the duration of the call.
    let status = unsafe { clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    assert_eq!(status, 0, "the kernel refused CLOCK_MONOTONIC");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The C library's `clock_gettime`, as the rest of the process sees it (see the crate's documentation).
///
/// # Safety
/// As for the C function: `out` points to a writable `timespec`.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_gettime(
    clock: libc::clockid_t,
    out: *mut libc::timespec,
) -> libc::c_int {
    if clock == libc::CLOCK_MONOTONIC
        && let Some(now) = SIMULATED_NOW.get()
    {
        let reading = libc::timespec {
            tv_sec: now.as_secs() as libc::time_t,
            tv_nsec: now.subsec_nanos() as libc::c_long,
        };
        // SAFETY: the caller's contract: `out` is writable.
        unsafe { out.write(reading) };
        return 0;
    }
    // SAFETY: the arguments are passed on unchanged under the same contract; the system call returns 0 or -1 with
    // errno set, as the C function does.
    unsafe { libc::syscall(libc::SYS_clock_gettime, clock, out) as libc::c_int }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "these tests read std's clock: it is what they are about"
)]
mod tests {
    use std::time::{Duration, Instant};

    use super::Simulated;

    #[test]
    fn std_instant_reads_simulated_time_inside_a_simulation_and_the_kernels_after() {
        let before = Instant::now();
        let simulation = Simulated::start();
        let at_zero = Instant::now();
        assert!(at_zero >= before);
        assert_eq!(Instant::now(), at_zero, "frozen between steps");
        simulation.at(Duration::from_secs(3600));
        let an_hour_on = Instant::now();
        assert_eq!(an_hour_on - at_zero, Duration::from_secs(3600));
        drop(simulation);
        // No hour passed on the kernel's clock.
        assert!(Instant::now() < an_hour_on);
    }

    #[test]
    fn another_thread_reads_the_kernels_clock_meanwhile() {
        let simulation = Simulated::start();
        simulation.at(Duration::from_secs(3600));
        let an_hour_on = Instant::now();
        let elsewhere = std::thread::spawn(Instant::now).join().unwrap();
        assert!(elsewhere < an_hour_on);
    }

    #[test]
    fn other_clocks_are_the_kernels() {
        let simulation = Simulated::start();
        simulation.at(Duration::from_secs(3600));
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: `now` is a valid, writable timespec.
        let status = unsafe { super::clock_gettime(libc::CLOCK_REALTIME, &mut now) };
        assert_eq!(status, 0);
        // The Unix epoch is more than an hour behind any real time this test runs at; the monotonic clock since
        // boot is not a wall-clock reading at all, so a realtime reading far past it shows the kernel answered.
        assert!(Duration::new(now.tv_sec as u64, 0) > Duration::from_secs(50 * 365 * 24 * 3600));
    }
}
