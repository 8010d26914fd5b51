//! Empty directory volumes made ahead of the creates that take them.
//!
//! An empty directory volume used to cost its CreateVolume a `mkdir`, a
//! rename into `volumes/` and an fsync of `volumes/` before the reply: more
//! than the record's own log sync, and on ext4 without a journal the
//! `mkdir` costs more the more inodes were freed in the last minute (it
//! skips each, reading its deletion time). A background thread now
//! keeps a few such directories in `pool/`, each named by the volume id it
//! will serve and made durable there, many per fsync. A create takes one:
//! the id becomes the new volume's, its record is committed durably, and
//! the directory is renamed into `volumes/` with no sync of its own.
//!
//! The filler runs at idle priority (`SCHED_IDLE`), so its work only
//! fills time the CPUs would idle (a 1-client lifecycle leaves most of it):
//! at normal priority its bursts of `mkdir`s delayed the calls running
//! beside them, and the slowest creates took 2-3 ms. It never holds a lock
//! a create takes: it hands its batches over through a channel. The pool
//! has two halves, `pool/a` and `pool/b`, and creates take from the one the
//! filler is not working in, since its `mkdir` and fsync hold their
//! directory's lock, which a rename out of it would wait for.
//!
//! A power cut can undo that rename but not the record. At start-up every
//! entry left in `pool/` is settled: one a record owns goes into place
//! again before any call; any other is discarded (in the background),
//! never handed out, since it may be the directory of a volume deleted
//! after its rename was undone, data and all.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use nix::libc;

use crate::unpoisoned::lock;

/// Directories kept ready in each half; the filler tops one up to this.
const HALF: usize = 32;
/// The filler wakes when a take leaves fewer than this ready in all.
const REFILL_BELOW: usize = 48;
const HALVES: [&str; 2] = ["a", "b"];
/// `Shared::filling` when the filler works in neither half.
const NEITHER: usize = 2;
/// Wait after a failed batch (a full disk, say) before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub struct DirPool {
    shared: Arc<Shared>,
    /// What creates take from. The filler never holds this lock: it runs
    /// at idle priority, and a create must never wait for it.
    takers: Mutex<Takers>,
    /// The filler's end of the hand-over, until the filler starts.
    sender: Mutex<Option<Sender<Batch>>>,
    filler: Mutex<Option<JoinHandle<()>>>,
    /// What an earlier run left, until start-up settles it.
    leftovers: Mutex<Vec<String>>,
}

/// Durable directories the filler hands over: their half and their ids.
type Batch = (usize, Vec<String>);

struct Takers {
    batches: Receiver<Batch>,
    ready: [Vec<String>; 2],
    /// Taken and not yet placed, with their half: `place` renames from
    /// there, and an id the pool never handed out costs it no rename.
    taken: HashMap<String, usize>,
}

struct Shared {
    dir: PathBuf,
    halves: [PathBuf; 2],
    /// Made and not yet taken, by half (handed over or about to be).
    ready: [AtomicUsize; 2],
    /// The half the filler works in now, or `NEITHER`.
    filling: AtomicUsize,
    closed: AtomicBool,
    /// The filler, to wake; set when it starts (with the first take: a
    /// node-only driver never creates, and keeps no pool).
    thread: OnceLock<Thread>,
}

impl Shared {
    fn total(&self) -> usize {
        self.ready.iter().map(|n| n.load(Ordering::Acquire)).sum()
    }
}

impl DirPool {
    /// Opens the pool at `dir` (made if missing), noting the entries an
    /// earlier run left there (`leftovers`). Nothing is handed out until
    /// the first `take`.
    pub fn open(dir: PathBuf) -> io::Result<DirPool> {
        let halves = HALVES.map(|h| dir.join(h));
        for half in &halves {
            make_durable_dir(half)?;
        }
        let mut leftovers = Vec::new();
        for half in &halves {
            for entry in fs::read_dir(half)? {
                let entry = entry?;
                match entry.file_name().into_string() {
                    Ok(name) if is_entry_name(&name) => leftovers.push(name),
                    _ => {
                        tracing::warn!(path = %entry.path().display(), "unexpected entry in the directory pool; left alone")
                    }
                }
            }
        }
        leftovers.sort();
        let (sender, batches) = channel();
        let pool = DirPool {
            shared: Arc::new(Shared {
                dir,
                halves,
                ready: [AtomicUsize::new(0), AtomicUsize::new(0)],
                filling: AtomicUsize::new(NEITHER),
                closed: AtomicBool::new(false),
                thread: OnceLock::new(),
            }),
            takers: Mutex::new(Takers {
                batches,
                ready: [Vec::new(), Vec::new()],
                taken: HashMap::new(),
            }),
            sender: Mutex::new(Some(sender)),
            filler: Mutex::new(None),
            leftovers: Mutex::new(leftovers),
        };
        Ok(pool)
    }

    /// The ids of the entries an earlier run left, once: start-up settles
    /// them before any create, and the pool never hands them out.
    pub fn leftovers(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.leftovers))
    }

    /// The id of a durable empty directory, now the caller's to `place`;
    /// `None` when none is ready (the caller makes its own).
    pub fn take(&self) -> Option<String> {
        if self.shared.closed.load(Ordering::Acquire) {
            return None;
        }
        if self.shared.thread.get().is_none() {
            self.start_filler();
        }
        let mut takers = lock(&self.takers);
        while let Ok((half, ids)) = takers.batches.try_recv() {
            takers.ready[half].extend(ids);
        }
        // From the fuller half the filler is not working in: a rename out
        // of the other would wait on its directory's lock, held by a thread
        // of idle priority.
        let filling = self.shared.filling.load(Ordering::Acquire);
        let mut order = [0, 1];
        order.sort_by_key(|&h| (filling == h, std::cmp::Reverse(takers.ready[h].len())));
        let taken = order
            .iter()
            .find_map(|&h| takers.ready[h].pop().map(|id| (h, id)));
        if let Some((half, id)) = &taken {
            takers.taken.insert(id.clone(), *half);
        }
        drop(takers);
        if let Some((half, _)) = &taken {
            self.shared.ready[*half].fetch_sub(1, Ordering::AcqRel);
        }
        if self.shared.total() < REFILL_BELOW {
            if let Some(filler) = self.shared.thread.get() {
                filler.unpark();
            }
        }
        taken.map(|(_, id)| id)
    }

    /// Moves the entry `take` handed out as `id` to `dst`, on the same
    /// filesystem, without a sync (the caller's durable record stands for
    /// it; start-up redoes a rename a power cut undid). `false`, with no
    /// filesystem work, when `id` is not one taken and still unplaced, and
    /// when the entry is gone from under the pool (the caller then makes
    /// its own, as for any create).
    pub fn place(&self, id: &str, dst: &Path) -> io::Result<bool> {
        let Some(half) = lock(&self.takers).taken.get(id).copied() else {
            return Ok(false);
        };
        let placed = match fs::rename(self.shared.halves[half].join(id), dst) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        lock(&self.takers).taken.remove(id);
        Ok(placed)
    }

    /// Where entry `id` is, if it is in the pool.
    pub fn entry(&self, id: &str) -> Option<PathBuf> {
        if !is_entry_name(id) {
            return None;
        }
        self.shared
            .halves
            .iter()
            .map(|half| half.join(id))
            .find(|p| fs::symlink_metadata(p).is_ok())
    }

    /// Entries made and not yet taken.
    #[cfg(test)]
    fn ready(&self) -> usize {
        self.shared.total()
    }

    /// Starts the filler, once (the first caller takes its sender).
    fn start_filler(&self) {
        let Some(sender) = lock(&self.sender).take() else {
            return;
        };
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("dir-pool".into())
            .spawn(move || fill(&shared, &sender));
        match spawned {
            Ok(handle) => {
                let _ = self.shared.thread.set(handle.thread().clone());
                *lock(&self.filler) = Some(handle);
            }
            Err(e) => {
                tracing::warn!(error = %e, "no directory pool thread; every create makes its own directory")
            }
        }
    }
}

impl Drop for DirPool {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        let handle = lock(&self.filler).take();
        if let Some(handle) = handle {
            handle.thread().unpark();
            // Joined, so no directory is made after its owner is gone (a
            // test's temporary state dir being removed, say): at most one
            // batch.
            let _ = handle.join();
        }
    }
}

/// Names the filler gives: what `place` and `open` accept.
fn is_entry_name(name: &str) -> bool {
    name.strip_prefix("vol-")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A fresh volume id, for the pool or for a volume made on the spot.
pub fn new_volume_id() -> String {
    format!("vol-{}", uuid::Uuid::new_v4().simple())
}

/// The filler runs only on a CPU that nothing else wants (`SCHED_IDLE`):
/// its `mkdir`s, which cost more the more inodes were freed lately, are
/// work a call would otherwise do, and must not delay the calls that
/// remain. Under full load it may not run at all; creates then make their
/// own directories, as without a pool.
fn idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` outlives the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "the directory pool runs at normal priority");
    }
}

/// The filler: tops the emptier half up whenever takes leave the pool
/// low, one fsync of that half per batch, until the pool is dropped.
fn fill(shared: &Shared, sender: &Sender<Batch>) {
    idle_priority();
    while !shared.closed.load(Ordering::Acquire) {
        if shared.total() >= REFILL_BELOW {
            // A take unparks it; an unpark before this park is not lost.
            std::thread::park();
            continue;
        }
        let counts = shared.ready.each_ref().map(|n| n.load(Ordering::Acquire));
        let half = usize::from(counts[1] < counts[0]);
        shared.filling.store(half, Ordering::Release);
        let made = make_batch(
            &shared.halves[half],
            HALF.saturating_sub(counts[half]).max(1),
        );
        shared.filling.store(NEITHER, Ordering::Release);
        match made {
            Ok(ids) => {
                shared.ready[half].fetch_add(ids.len(), Ordering::AcqRel);
                if sender.send((half, ids)).is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(dir = %shared.dir.display(), error = %e, "cannot make pooled volume directories; creates make their own meanwhile");
                std::thread::park_timeout(RETRY_AFTER);
            }
        }
    }
}

/// Makes `dir` if it is missing, durably (its parent synced): entries
/// made in it later must not be lost with it.
fn make_durable_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir)?;
    let mut at = dir;
    // The pool and its half are new; the state dir's entry for the pool too.
    for _ in 0..2 {
        let Some(parent) = at.parent() else { break };
        fs::File::open(parent)?.sync_all()?;
        at = parent;
    }
    Ok(())
}

/// Makes `n` empty volume directories in `dir` and makes them durable.
/// On an error the ones made so far stay on disk, not in the pool: the
/// next start discards them.
fn make_batch(dir: &Path, n: usize) -> io::Result<Vec<String>> {
    let mut made = Vec::with_capacity(n);
    for _ in 0..n {
        let id = new_volume_id();
        super::local::world_writable_dir(&dir.join(&id))?;
        made.push(id);
    }
    fs::File::open(dir)?.sync_all()?;
    Ok(made)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn on_disk(dir: &Path) -> usize {
        HALVES
            .iter()
            .map(|h| fs::read_dir(dir.join(h)).map_or(0, |d| d.count()))
            .sum()
    }

    fn wait_ready(pool: &DirPool, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.ready() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{} ready after 10 s",
                pool.ready()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn takes_hand_out_distinct_durable_world_writable_directories_and_place_moves_them() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = DirPool::open(tmp.path().join("pool")).unwrap();
        assert!(pool.leftovers().is_empty());
        // Nothing is made before the first take.
        assert_eq!(on_disk(&tmp.path().join("pool")), 0);
        // The first take starts the filler (and may find nothing yet).
        let first = pool.take();
        wait_ready(&pool, 2 * HALF);
        let mut seen: std::collections::HashSet<String> = first.into_iter().collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while seen.len() <= 2 * HALF && std::time::Instant::now() < deadline {
            if let Some(id) = pool.take() {
                assert!(is_entry_name(&id), "{id}");
                let meta = fs::metadata(pool.entry(&id).unwrap()).unwrap();
                assert!(meta.is_dir());
                assert_eq!(meta.permissions().mode() & 0o7777, 0o1777);
                assert!(seen.insert(id), "an id was handed out twice");
            } else {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        assert!(
            seen.len() > 2 * HALF,
            "the pool was topped up: {}",
            seen.len()
        );

        let id = seen.iter().next().unwrap().clone();
        let dst = tmp.path().join("placed");
        assert!(pool.place(&id, &dst).unwrap());
        assert!(dst.is_dir());
        assert!(!pool.place(&id, &dst).unwrap(), "a placed entry is gone");
        assert!(!pool.place("../escape", &dst).unwrap());
        // A taken entry removed from under the pool is not placed, and
        // not tried again; another fails as its rename does.
        let mut more = seen.iter().skip(1).take(2).cloned();
        let (gone, blocked) = (more.next().unwrap(), more.next().unwrap());
        fs::remove_dir(pool.entry(&gone).unwrap()).unwrap();
        assert!(!pool.place(&gone, &tmp.path().join("gone")).unwrap());
        assert!(!pool.place(&gone, &tmp.path().join("gone")).unwrap());
        let occupied = tmp.path().join("occupied");
        fs::create_dir(&occupied).unwrap();
        fs::write(occupied.join("f"), b"x").unwrap();
        assert!(pool.place(&blocked, &occupied).is_err());
        // An entry that is there but was not handed out is not placed.
        let untaken = new_volume_id();
        fs::create_dir(pool.shared.halves[0].join(&untaken)).unwrap();
        assert!(!pool.place(&untaken, &tmp.path().join("other")).unwrap());
        assert!(pool.entry(&untaken).is_some());
    }

    #[test]
    fn a_reopened_pool_reports_what_was_left_and_drop_stops_the_filler() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pool");
        let pool = DirPool::open(dir.clone()).unwrap();
        pool.take();
        wait_ready(&pool, 2 * HALF);
        drop(pool);
        assert_eq!(
            on_disk(&dir),
            2 * HALF,
            "dropping the pool stopped its filler"
        );
        fs::create_dir(dir.join("a").join("not-ours")).unwrap();
        let pool = DirPool::open(dir.clone()).unwrap();
        let leftovers = pool.leftovers();
        assert_eq!(leftovers.len(), 2 * HALF);
        assert!(leftovers.iter().all(|id| is_entry_name(id)));
        assert!(pool.leftovers().is_empty(), "reported once");
        assert_eq!(pool.ready(), 0, "leftovers are never handed out");
    }

    #[test]
    fn a_failing_batch_leaves_the_pool_empty_and_creates_fall_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pool");
        let pool = DirPool::open(dir.clone()).unwrap();
        // The directory is gone: every batch fails.
        fs::remove_dir_all(&dir).unwrap();
        for _ in 0..5 {
            assert_eq!(pool.take(), None);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pool.ready(), 0);
    }
}
