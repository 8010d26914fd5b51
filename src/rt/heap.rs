//! Gives back to the system the memory a burst freed. glibc returns only
//! the free memory at the top of its heap; what a burst frees below a
//! chunk still in use (a new controller's listings, 10,000 member PVs read
//! at once, a bulk of CreateVolume calls) stays resident for the life of
//! the process. Measured at 10,000 member volumes: a new controller held
//! 66 MiB after its start-up, of which one `malloc_trim` gave back 9.6 MiB
//! (`bench/member-scale.sh`, the trim called from a debugger).
//!
//! A thread of its own looks every few seconds at how much the heap holds
//! free, and trims once that has grown by `TRIM_PAST` since its last trim:
//! no trim while nothing was freed, none that walks the heap for the same
//! fragments again. The walk takes milliseconds and locks the allocator,
//! so it runs off the async thread.

use std::time::Duration;

/// How often the free memory is looked at.
pub const LOOK_EVERY: Duration = Duration::from_secs(5);
/// Growth of the free memory since the last trim that makes one worth it.
pub const TRIM_PAST: usize = 4 << 20;

/// Bytes the allocator holds free (`None` off glibc).
pub fn free_bytes() -> Option<usize> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let info = unsafe { nix::libc::mallinfo2() };
        Some(info.fordblks)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Returns the free pages of every arena to the system.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases pages the allocator holds free.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// Whether to trim now, the heap holding `free` bytes free, `after_last`
/// right after the last trim.
pub fn worth_trimming(free: usize, after_last: usize) -> bool {
    free >= after_last.saturating_add(TRIM_PAST)
}

/// Starts the trimming thread (glibc only; elsewhere nothing to do).
pub fn spawn_trimmer() {
    if free_bytes().is_none() {
        return;
    }
    let started = std::thread::Builder::new()
        .name("heap-trim".into())
        .spawn(|| {
            let mut after_last = 0;
            loop {
                std::thread::sleep(LOOK_EVERY);
                let Some(free) = free_bytes() else { return };
                if worth_trimming(free, after_last) {
                    trim();
                    after_last = free_bytes().unwrap_or(0);
                } else if free < after_last {
                    // Reused since: a later burst counts from here.
                    after_last = free;
                }
            }
        });
    if let Err(e) = started {
        tracing::warn!(error = %e, "no heap-trim thread: memory a burst frees stays resident");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_past_a_growth_since_the_last_trim() {
        assert!(!worth_trimming(3 << 20, 0));
        assert!(worth_trimming(4 << 20, 0));
        assert!(!worth_trimming(10 << 20, 7 << 20));
        assert!(worth_trimming(11 << 20, 7 << 20));
        assert!(!worth_trimming(0, usize::MAX));
    }

    fn anonymous_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("RssAnon:"))
                    .and_then(|v| v.split_whitespace().next()?.parse().ok())
            })
            .unwrap_or(0)
    }

    // Memory freed below a chunk still in use stays resident until a trim
    // gives it back: the case the thread is for, on the real allocator.
    #[test]
    fn a_trim_gives_back_what_a_burst_freed_below_the_top() {
        if free_bytes().is_none() {
            eprintln!("skipped: not glibc, nothing to trim");
            return;
        }
        // 48 MiB in small pieces (as parsed objects are), then one kept
        // above them so that the top of the heap cannot shrink.
        let burst: Vec<Box<[u8; 96]>> = (0..(48 << 20) / 96).map(|_| Box::new([7u8; 96])).collect();
        let pin = Box::new([1u8; 96]);
        std::hint::black_box((&burst, &pin));
        drop(burst);
        let held = anonymous_kib();
        let free = free_bytes().unwrap_or(0);
        assert!(
            free >= 32 << 20,
            "the burst's memory is held free: {free} bytes"
        );
        trim();
        let after = anonymous_kib();
        assert!(
            after + 24 * 1024 < held,
            "trim gave back less than 24 MiB: {held} KiB -> {after} KiB"
        );
        drop(pin);
    }
}
