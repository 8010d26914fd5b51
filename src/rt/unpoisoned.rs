//! Locking a mutex whose data a panic cannot leave half-changed.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data even if a thread panicked while holding it:
/// for the callers' data (lists, counters changed in one step) a panic
/// elsewhere leaves it whole, and one failed call must not fail all others.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
