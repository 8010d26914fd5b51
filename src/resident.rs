//! Gives back the mapped pages of the driver's own binary that start-up and
//! past bursts touched, once the driver is idle.
//!
//! Most of an idle driver's resident set is its binary: 7 of 9.8 MB
//! measured, against under 1 MB of heap. The kernel maps code in 64 KiB
//! windows around every page that runs, so start-up (argument parsing, the
//! store's open, the gRPC server's set-up) leaves megabytes mapped that an
//! idle driver never runs again. Unmapping the read-only, never-written
//! mappings of the binary drops them from the process; their pages stay in
//! the page cache, so the next call that needs one maps it back with a
//! minor fault and no disk read. Writable mappings, and read-only ones the
//! loader wrote relocations into, hold private copies and are left alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Seconds (since the process's start) of the last RPC, for idleness.
static LAST_CALL: AtomicU64 = AtomicU64::new(0);

/// A driver with no call for this long counts as idle.
pub const IDLE_AFTER: Duration = Duration::from_secs(30);

fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// Called for every RPC.
pub fn touched() {
    LAST_CALL.store(started().elapsed().as_secs(), Ordering::Relaxed);
}

/// One mapping of the binary that holds nothing but the file's contents.
struct Clean {
    start: usize,
    len: usize,
    /// KiB of it mapped in now.
    resident_kib: u64,
}

/// The read-only mappings of our own executable with no private pages.
fn clean_mappings() -> std::io::Result<Vec<Clean>> {
    use std::os::unix::fs::MetadataExt;
    let exe = std::fs::metadata("/proc/self/exe")?;
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut found = Vec::new();
    let mut current: Option<Clean> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((lo, hi)) = first.split_once('-') {
            // A mapping's header: range, perms, offset, dev, inode, path.
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            else {
                current = None;
                continue;
            };
            let perms = fields.next().unwrap_or("");
            let _offset = fields.next();
            let _dev = fields.next();
            let inode: u64 = fields.next().and_then(|i| i.parse().ok()).unwrap_or(0);
            let ours = inode == exe.ino() && inode != 0;
            current = (ours && perms.starts_with('r') && !perms.contains('w')).then_some(Clean {
                start: lo,
                len: hi.saturating_sub(lo),
                resident_kib: 0,
            });
            continue;
        }
        if first == "Rss:" {
            if let Some(m) = current.as_mut() {
                m.resident_kib = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            }
        }
        // A relocated read-only mapping holds private (anonymous) copies:
        // those must stay.
        if first == "Anonymous:" {
            let anon: u64 = fields.next().and_then(|v| v.parse().ok()).unwrap_or(1);
            if let Some(m) = current.take() {
                if anon == 0 {
                    found.push(m);
                }
            }
        }
    }
    Ok(found)
}

/// Unmaps the binary's clean pages; returns the bytes of address space
/// covered. They come back from the page cache as code runs.
pub fn release() -> usize {
    let mappings = match clean_mappings() {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read this process's mappings; nothing released");
            return 0;
        }
    };
    let mut released = 0;
    for m in mappings {
        let Some(addr) = std::ptr::NonNull::new(m.start as *mut std::ffi::c_void) else {
            continue;
        };
        // SAFETY: the range is a whole mapping of our executable that is
        // read-only and holds no private page: MADV_DONTNEED only drops its
        // page-table entries, and every later access reads the same bytes
        // back from the file's pages.
        let done = unsafe {
            nix::sys::mman::madvise(addr, m.len, nix::sys::mman::MmapAdvise::MADV_DONTNEED)
        };
        if done.is_ok() {
            released += m.len;
        }
    }
    released
}

/// Releases once now (start-up is over) and again whenever the driver has
/// been idle for `IDLE_AFTER` since the last release.
pub async fn trim_when_idle() {
    started();
    // Reading smaps takes milliseconds: not on the thread that answers the
    // first Probe.
    let _ = crate::offload::blocking(release).await;
    let mut released_at = started().elapsed().as_secs();
    loop {
        tokio::time::sleep(IDLE_AFTER).await;
        let now = started().elapsed().as_secs();
        let last = LAST_CALL.load(Ordering::Relaxed);
        let idle = now.saturating_sub(last) >= IDLE_AFTER.as_secs();
        if idle && last >= released_at {
            let _ = crate::offload::blocking(release).await;
            released_at = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// KiB of the binary's clean mappings that are mapped in: measured on
    /// them alone, since other tests allocate in this process meanwhile.
    fn resident_kib() -> u64 {
        clean_mappings()
            .unwrap()
            .iter()
            .map(|m| m.resident_kib)
            .sum()
    }

    #[test]
    fn released_code_pages_leave_the_resident_set_and_still_run() {
        let before = resident_kib();
        assert!(
            before > 0,
            "the test binary has clean read-only mappings in use"
        );
        assert!(release() > 0);
        let after = resident_kib();
        assert!(after < before, "{before} KiB -> {after} KiB");
        // Code and constants from the released ranges still work.
        let text = format!("{:?}", std::collections::BTreeMap::from([(1, "one")]));
        assert_eq!(text, "{1: \"one\"}");
        assert!(!clean_mappings().unwrap().is_empty());
    }
}
