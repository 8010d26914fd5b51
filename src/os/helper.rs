//! The system tools we run (losetup, mkfs, blkid, resize2fs, mount.nfs).
//!
//! A tool must not outlive the driver: a `losetup --find` still running
//! when the driver is SIGKILLed attaches its device *after* the restarted
//! driver swept stale devices, and nothing would ever detach it. So each
//! child gets PR_SET_PDEATHSIG, is killed when its future is dropped, and
//! is bounded in time: a tool stuck on a dead device must not hold an RPC.

use std::io;
use std::process::Output;
use std::time::Duration;

use tokio::process::Command;

/// The child killed when this process dies, dropped, or `limit` passes.
pub async fn run(program: &str, args: &[&str], limit: Duration) -> io::Result<Output> {
    let mut cmd = Command::new(program);
    cmd.args(args).kill_on_drop(true);
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe syscalls (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(io::Error::from)?;
            // The parent may have died before prctl took effect.
            if nix::unistd::getppid() != parent {
                nix::libc::_exit(1);
            }
            Ok(())
        });
    }
    let shown = || format!("{program} {}", args.join(" "));
    match tokio::time::timeout(limit, cmd.output()).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(io::Error::new(e.kind(), format!("{}: {e}", shown()))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{} did not finish within {limit:?}; it was killed", shown()),
        )),
    }
}

/// Like [`run`], and a non-zero exit is an error carrying the tool's stderr.
pub async fn run_ok(program: &str, args: &[&str], limit: Duration) -> io::Result<Output> {
    let out = run(program, args, limit).await?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(failed(program, args, &out))
    }
}

pub fn failed(program: &str, args: &[&str], out: &Output) -> io::Error {
    io::Error::other(format!(
        "{program} {} exited with {}: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tool_past_its_limit_is_killed_and_named() {
        let started = std::time::Instant::now();
        let e = run("sleep", &["30"], Duration::from_millis(200))
            .await
            .err()
            .map(|e| (e.kind(), e.to_string()));
        assert!(started.elapsed() < Duration::from_secs(5));
        let (kind, msg) = e.unwrap_or((io::ErrorKind::Other, String::new()));
        assert_eq!(kind, io::ErrorKind::TimedOut);
        assert!(msg.contains("sleep 30"), "{msg}");
    }

    #[tokio::test]
    async fn a_failing_tool_reports_its_stderr() {
        let e = run_ok(
            "sh",
            &["-c", "echo nope >&2; exit 3"],
            Duration::from_secs(5),
        )
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("nope") && e.contains('3'), "{e}");
    }

    #[tokio::test]
    async fn a_missing_tool_is_named() {
        let e = run("no-such-tool-xyz", &[], Duration::from_secs(5))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no-such-tool-xyz"), "{e}");
    }
}
