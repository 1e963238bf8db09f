//! CPU time of the whole process (user + system, every thread, including
//! the kernel's io_uring workers of this process), for the CPU seconds per
//! GB that the reports print beside fio's `usr_cpu` + `sys_cpu`.

use std::time::Duration;

/// User + system CPU time this process has used so far
/// (`getrusage(RUSAGE_SELF)`); `None` where the call fails.
pub fn process_time() -> Option<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Some(d(u.user_time()) + d(u.system_time()))
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
}
