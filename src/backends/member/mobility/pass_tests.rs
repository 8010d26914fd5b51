//! Whole passes between two real movers on loopback TCP, over real files:
//! what a copy keeps, what a second pass sends, what a digest catches.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use tokio::net::{TcpListener, TcpStream};

use super::channel::{new_key, Channel, End, KEY_LEN};
use super::mover::{Mover, Role};
use super::pass::{self, PassReport};
use super::tree::{self, Place, CHUNK};

async fn start(role: Role, key: [u8; KEY_LEN], place: Place) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mover = Mover {
        role,
        move_id: "move-1".into(),
        key,
        place,
    };
    let task = tokio::spawn(async move {
        let _ = mover.serve(listener).await;
    });
    (port, task)
}

async fn connect(port: u16, key: &[u8; KEY_LEN], role: Role) -> Channel<TcpStream> {
    let s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    Channel::open(s, End::Controller, key, "move-1", role.as_str())
        .await
        .expect("handshake")
}

async fn one_pass(src: Place, dst: Place) -> Result<PassReport, String> {
    let key = new_key();
    let (sp, st) = start(Role::Source, key, src).await;
    let (tp, tt) = start(Role::Target, key, dst).await;
    let mut s = connect(sp, &key, Role::Source).await;
    let mut t = connect(tp, &key, Role::Target).await;
    let mut seen = Vec::new();
    let mut progress = |done: u64, total: u64, _sent: u64| seen.push((done, total));
    let report = pass::run(&mut s, &mut t, &mut progress).await;
    st.abort();
    tt.abort();
    if let Ok(r) = &report {
        assert_eq!(
            seen.last().map(|p| p.1),
            Some(r.total),
            "progress ends at the total"
        );
    }
    report
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).expect("write");
}

/// A tree with every kind of entry the mover keeps.
fn fill(root: &Path) {
    let random: Vec<u8> = (0..(3 * CHUNK + 12345) as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 11) as u8)
        .collect();
    write(&root.join("big"), &random);
    std::fs::create_dir_all(root.join("d/e")).expect("dirs");
    write(&root.join("d/e/small"), b"hello");
    std::os::unix::fs::symlink("../big", root.join("d/link")).expect("symlink");
    std::fs::hard_link(root.join("d/e/small"), root.join("hard")).expect("hard link");
    nix::unistd::mkfifo(
        &root.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o640),
    )
    .expect("fifo");
    // Sparse: 8 MiB with 4 KiB of data in the middle.
    let f = std::fs::File::create(root.join("sparse")).expect("sparse");
    f.set_len(8 << 20).expect("len");
    std::os::unix::fs::FileExt::write_all_at(&f, b"middle", 4 << 20).expect("mid");
    std::fs::set_permissions(
        root.join("d/e/small"),
        std::fs::Permissions::from_mode(0o4751),
    )
    .expect("mode");
    std::os::unix::fs::lchown(root.join("d/e"), Some(1234), Some(5678)).expect("chown");
    let _ = xattr::set(root.join("big"), "user.relay", b"kept");
    let old = nix::sys::time::TimeSpec::new(1_000_000_000, 5);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &root.join("d/e"),
        &old,
        &old,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .expect("times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_copies_everything_a_filesystem_holds_and_the_next_sends_only_changes() {
    let src = tempfile::tempdir().expect("src");
    let dst = tempfile::tempdir().expect("dst");
    fill(src.path());
    write(&dst.path().join("stale"), b"not in the source");
    let first = one_pass(
        Place::Tree(src.path().into()),
        Place::Tree(dst.path().into()),
    )
    .await
    .expect("first pass");
    assert!(first.verified, "{first:?}");
    assert_eq!(
        tree::summarize(&Place::Tree(dst.path().into()))
            .expect("sum")
            .digest,
        first.source_digest
    );
    assert!(
        !dst.path().join("stale").exists(),
        "what the source lacks is removed"
    );

    let d = dst.path();
    assert_eq!(
        std::fs::read(d.join("big")).expect("big"),
        std::fs::read(src.path().join("big")).expect("big")
    );
    assert_eq!(
        std::fs::read_link(d.join("d/link")).expect("link").to_str(),
        Some("../big")
    );
    let (a, b) = (
        std::fs::metadata(d.join("hard")).expect("h"),
        std::fs::metadata(d.join("d/e/small")).expect("s"),
    );
    assert_eq!(
        (a.ino(), a.nlink()),
        (b.ino(), 2),
        "the hard link is one inode"
    );
    assert_eq!(b.mode() & 0o7777, 0o4751, "set-id bits survive the chown");
    let e = std::fs::metadata(d.join("d/e")).expect("e");
    assert_eq!(
        (e.uid(), e.gid(), e.mtime(), e.mtime_nsec()),
        (1234, 5678, 1_000_000_000, 5)
    );
    assert!(std::fs::symlink_metadata(d.join("fifo"))
        .expect("fifo")
        .file_type()
        .is_fifo_like());
    let sparse = std::fs::metadata(d.join("sparse")).expect("sparse");
    assert_eq!(sparse.len(), 8 << 20);
    assert!(
        sparse.blocks() * 512 < 2 << 20,
        "holes stay holes: {} blocks",
        sparse.blocks()
    );
    if xattr::get(src.path().join("big"), "user.relay")
        .ok()
        .flatten()
        .is_some()
    {
        assert_eq!(
            xattr::get(d.join("big"), "user.relay")
                .expect("xattr")
                .as_deref(),
            Some(&b"kept"[..])
        );
    }
    // Sparse chunks go as Zero messages: what was sent is the data, not 8 MiB of zeros.
    assert!(
        first.sent < (3 * CHUNK + 12345 + 2 * CHUNK) as u64,
        "{first:?}"
    );

    // Rewrite 100 KiB inside the big file's second chunk: one chunk goes.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(src.path().join("big"))
        .expect("open");
    std::os::unix::fs::FileExt::write_all_at(&f, &[9u8; 100 << 10], CHUNK as u64 + 10)
        .expect("rewrite");
    drop(f);
    std::fs::remove_file(src.path().join("hard")).expect("unlink");
    let second = one_pass(
        Place::Tree(src.path().into()),
        Place::Tree(dst.path().into()),
    )
    .await
    .expect("second pass");
    assert!(second.verified, "{second:?}");
    assert_eq!(
        second.sent, CHUNK as u64,
        "only the changed chunk: {second:?}"
    );
    assert!(!d.join("hard").exists());
    assert_eq!(
        std::fs::metadata(d.join("d/e/small")).expect("s").nlink(),
        1
    );

    let third = one_pass(
        Place::Tree(src.path().into()),
        Place::Tree(dst.path().into()),
    )
    .await
    .expect("third pass");
    assert!(third.verified && third.sent == 0, "{third:?}");
}

trait FifoLike {
    fn is_fifo_like(&self) -> bool;
}
impl FifoLike for std::fs::FileType {
    fn is_fifo_like(&self) -> bool {
        std::os::unix::fs::FileTypeExt::is_fifo(self)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_volume_is_copied_by_chunk_and_resynced_by_changed_chunks() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    let f = std::fs::File::create(&src).expect("src");
    f.set_len(16 << 20).expect("len");
    std::os::unix::fs::FileExt::write_all_at(&f, &[5u8; 3 << 20], 2 << 20).expect("data");
    drop(f);
    // The target's device is larger, as a member class may round up.
    std::fs::File::create(&dst)
        .expect("dst")
        .set_len(20 << 20)
        .expect("len");
    let first = one_pass(
        Place::Device(src.clone(), None),
        Place::Device(dst.clone(), None),
    )
    .await
    .expect("first");
    assert!(first.verified, "{first:?}");
    assert_eq!(first.sent, 3 << 20, "zero chunks are not sent: {first:?}");
    assert!(
        first.wire < 100_000,
        "repetitive data compresses: {first:?}"
    );
    let got = std::fs::read(&dst).expect("dst");
    assert_eq!(&got[..16 << 20], &std::fs::read(&src).expect("src")[..]);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&src)
        .expect("src");
    std::os::unix::fs::FileExt::write_all_at(&f, b"changed", 10 << 20).expect("change");
    drop(f);
    let second = one_pass(Place::Device(src, None), Place::Device(dst, None))
        .await
        .expect("second");
    assert!(second.verified && second.sent == CHUNK as u64, "{second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_too_small_fails_the_pass_saying_so() {
    let dir = tempfile::tempdir().expect("tmp");
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    std::fs::File::create(&src)
        .expect("src")
        .set_len(4 << 20)
        .expect("len");
    std::fs::File::create(&dst)
        .expect("dst")
        .set_len(2 << 20)
        .expect("len");
    let why = one_pass(Place::Device(src, None), Place::Device(dst, None))
        .await
        .expect_err("too small");
    assert!(why.contains("target device has 2097152 bytes"), "{why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mover_without_the_key_gets_no_session() {
    let dir = tempfile::tempdir().expect("tmp");
    let key = new_key();
    let (port, task) = start(Role::Source, key, Place::Tree(dir.path().into())).await;
    let s = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let wrong = Channel::open(s, End::Controller, &new_key(), "move-1", "source").await;
    assert!(wrong.is_err(), "a wrong key opened a session");
    // The mover serves the next, rightful session.
    let mut ch = connect(port, &key, Role::Source).await;
    ch.send(&super::wire::Msg::Index).await.expect("send");
    let answer: super::wire::Msg = ch.recv().await.expect("answer");
    assert!(
        matches!(answer, super::wire::Msg::Failed { ref why } if why.contains("not for the source")),
        "{answer:?}"
    );
    task.abort();
}

/// A pass the target mover runs itself with the source mover as its peer
/// (`Pull`, the pod network's way): the same copy, the digests compared,
/// the progress heard by the controller; a second pull sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_copies_mover_to_mover_and_the_controller_hears_the_progress() {
    let src = tempfile::tempdir().expect("src");
    let dst = tempfile::tempdir().expect("dst");
    fill(src.path());
    let key = new_key();
    let (sp, st) = start(Role::Source, key, Place::Tree(src.path().into())).await;
    let (tp, tt) = start(Role::Target, key, Place::Tree(dst.path().into())).await;
    // The controller's session with the source stays open, idle, as the
    // controller keeps it: it holds nothing the target's session needs.
    let _idle = connect(sp, &key, Role::Source).await;
    let mut t = connect(tp, &key, Role::Target).await;
    let peer = format!("127.0.0.1:{sp}");
    let mut seen = Vec::new();
    let mut progress = |done: u64, total: u64, _sent: u64| seen.push((done, total));
    let first = pass::pull(&mut t, &peer, &mut progress)
        .await
        .expect("first pull");
    assert!(first.verified, "{first:?}");
    assert!(first.sent >= 3 * CHUNK as u64, "{first:?}");
    assert_eq!(seen.last().map(|p| p.1), Some(first.total), "{seen:?}");
    assert_eq!(
        tree::summarize(&Place::Tree(dst.path().into()))
            .expect("sum")
            .digest,
        first.source_digest
    );
    assert_eq!(
        std::fs::read(dst.path().join("big")).expect("big"),
        std::fs::read(src.path().join("big")).expect("big")
    );
    let second = pass::pull(&mut t, &peer, &mut |_, _, _| {})
        .await
        .expect("second pull");
    assert!(second.verified && second.sent == 0, "{second:?}");
    st.abort();
    tt.abort();
}

/// A peer nobody answers at: `Unreachable`, named, within the reach
/// budget, and nothing written; the session goes on (the controller's
/// pass then goes its own way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_from_a_peer_not_there_says_unreachable_and_writes_nothing() {
    let dst = tempfile::tempdir().expect("dst");
    let key = new_key();
    let (tp, tt) = start(Role::Target, key, Place::Tree(dst.path().into())).await;
    let mut t = connect(tp, &key, Role::Target).await;
    // A port just freed: connection refused.
    let free = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = free.local_addr().expect("addr").port();
    drop(free);
    let err = pass::pull(&mut t, &format!("127.0.0.1:{port}"), &mut |_, _, _| {})
        .await
        .expect_err("unreachable");
    assert!(
        matches!(&err, pass::PullError::Unreachable(why) if why.contains(&format!("127.0.0.1:{port}"))),
        "{err:?}"
    );
    // A peer that holds the move's key for another role is no source.
    let (other, ot) = start(Role::Target, key, Place::Tree(dst.path().into())).await;
    let err = pass::pull(&mut t, &format!("127.0.0.1:{other}"), &mut |_, _, _| {})
        .await
        .expect_err("not a source");
    assert!(
        matches!(&err, pass::PullError::Unreachable(why) if why.contains("handshake")),
        "{err:?}"
    );
    assert_eq!(std::fs::read_dir(dst.path()).expect("dir").count(), 0);
    // The session still serves.
    t.send(&super::wire::Msg::Index).await.expect("send");
    let answer: super::wire::Msg = t.recv().await.expect("answer");
    assert!(matches!(answer, super::wire::Msg::HaveEnd), "{answer:?}");
    tt.abort();
    ot.abort();
}

/// A connection that never sends its handshake (anyone on the pod network
/// may open one) holds only itself: the rightful session is served now,
/// not after the handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_does_not_hold_the_mover() {
    let dir = tempfile::tempdir().expect("tmp");
    let key = new_key();
    let (port, task) = start(Role::Target, key, Place::Tree(dir.path().into())).await;
    let _silent = TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let served = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let mut ch = connect(port, &key, Role::Target).await;
        ch.send(&super::wire::Msg::Index).await.expect("send");
        ch.recv::<super::wire::Msg>().await.expect("answer")
    })
    .await
    .expect("served while the silent connection is open");
    assert!(matches!(served, super::wire::Msg::HaveEnd), "{served:?}");
    task.abort();
}

/// A pull whose source fails mid-pass (its volume unreadable) is a failed
/// pass, named as the source's, not an unreachable peer: the controller
/// retries the attempt instead of turning to the API servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_whose_source_fails_is_a_failed_pass() {
    let dst = tempfile::tempdir().expect("dst");
    let gone = dst.path().join("no-such-volume");
    let key = new_key();
    let (sp, st) = start(Role::Source, key, Place::Tree(gone)).await;
    let (tp, tt) = start(Role::Target, key, Place::Tree(dst.path().into())).await;
    let mut t = connect(tp, &key, Role::Target).await;
    let err = pass::pull(&mut t, &format!("127.0.0.1:{sp}"), &mut |_, _, _| {})
        .await
        .expect_err("the source cannot read");
    assert!(
        matches!(&err, pass::PullError::Failed(why) if why.contains("source mover")),
        "{err:?}"
    );
    st.abort();
    tt.abort();
}
