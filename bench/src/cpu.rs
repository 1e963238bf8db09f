//! CPU time of the whole process (user + system, every thread, including
//! the kernel's io_uring workers of this process), for the CPU seconds per
//! GB that the reports print beside fio's `usr_cpu` + `sys_cpu`.

use std::time::Duration;

/// User + system CPU time this process has used so far
/// (`getrusage(RUSAGE_SELF)`); `None` where the call fails.
pub fn process_time() -> Option<Duration> {
    process_times().map(|t| t.user + t.system)
}

/// CPU time this process has used so far, split as the kernel accounts it
/// (`getrusage(RUSAGE_SELF)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// In user space (the process's own code and libraries).
    pub user: Duration,
    /// In the kernel on the process's behalf (system calls, page faults,
    /// and the I/O paths they run).
    pub system: Duration,
}

/// This process's [`CpuTimes`] so far; `None` where the call fails.
pub fn process_times() -> Option<CpuTimes> {
    times_of(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

/// The [`CpuTimes`] `getrusage` gives for `who`.
fn times_of(who: nix::sys::resource::UsageWho) -> Option<CpuTimes> {
    let u = nix::sys::resource::getrusage(who).ok()?;
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Some(CpuTimes {
        user: d(u.user_time()),
        system: d(u.system_time()),
    })
}

/// User and system CPU seconds spent since `start` (from
/// [`process_times`]); both 0 where either reading failed.
pub fn split_since(start: Option<CpuTimes>) -> (f64, f64) {
    split_between(start, process_times())
}

/// User and system CPU seconds from `a` to `b`; both 0 without both.
fn split_between(a: Option<CpuTimes>, b: Option<CpuTimes>) -> (f64, f64) {
    match (a, b) {
        (Some(a), Some(b)) => (
            b.user.saturating_sub(a.user).as_secs_f64(),
            b.system.saturating_sub(a.system).as_secs_f64(),
        ),
        _ => (0.0, 0.0),
    }
}

/// CPU seconds spent since `start` (from [`process_time`]); 0 where
/// either reading failed.
pub fn seconds_since(start: Option<Duration>) -> f64 {
    match (start, process_time()) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64(),
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_busy_loop_costs_cpu_time() {
        let start = super::process_time();
        assert!(start.is_some());
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let spent = super::seconds_since(start);
        assert!(spent > 0.0, "50 ms of spinning cost {spent} s");
    }

    /// The user and system seconds this thread spends running `step`
    /// over and over until together they reach `enough` (the kernel
    /// splits the two by sampling at its ticks, so it takes a few ticks
    /// to tell; the thread's own, as other tests run in this process
    /// meanwhile).
    #[cfg(target_os = "linux")]
    fn thread_split_of(enough: f64, mut step: impl FnMut()) -> (f64, f64) {
        use nix::sys::resource::UsageWho::RUSAGE_THREAD;
        let start = super::times_of(RUSAGE_THREAD);
        assert!(start.is_some());
        loop {
            step();
            let (u, s) = super::split_between(start, super::times_of(RUSAGE_THREAD));
            if u + s >= enough {
                return (u, s);
            }
        }
    }

    /// 100 ms of a busy loop is mostly user time, of reads from
    /// `/dev/zero` mostly system time (the kernel clears the buffer).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_busy_loop_is_user_time_and_a_system_call_loop_is_system_time() {
        let mut x = 0u64;
        let (user, system) = thread_split_of(0.1, || {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        });
        assert!(user > system, "spinning: {user} s user, {system} s system");
        let f = std::fs::File::open("/dev/zero").unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let (user, system) = thread_split_of(0.1, || {
            for _ in 0..100 {
                std::io::Read::read_exact(&mut &f, &mut buf).unwrap();
            }
        });
        assert!(system > user, "reads: {user} s user, {system} s system");
    }
}
