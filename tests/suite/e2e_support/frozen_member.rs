//! A member stopped as a switched-off cluster is, and able to come back: its
//! API server and a kubelet stopped (SIGSTOP), every container of that
//! kubelet's containerd paused (cgroup freezer, through `ctr`), so nothing
//! there answers or writes. Resumed as it was, also when dropped after a
//! failed assertion, so the environment's down scripts find it running.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct FrozenMember {
    pids: Vec<i32>,
    containerd: PathBuf,
    tasks: Vec<String>,
    resumed: bool,
}

fn pid_in(file: &Path) -> i32 {
    std::fs::read_to_string(file)
        .unwrap_or_else(|e| panic!("read {}: {e}", file.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: not a pid: {e}", file.display()))
}

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig) {
        eprintln!("{sig} to pid {pid}: {e}");
    }
}

fn ctr(containerd: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(containerd)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .map_err(|e| format!("run ctr: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl FrozenMember {
    /// Stops the API server (`apiserver_pid`) and kubelet (`kubelet_pid`)
    /// files name, and pauses every running task of the containerd at
    /// `containerd` (its socket).
    pub fn freeze(apiserver_pid: &Path, kubelet_pid: &Path, containerd: &Path) -> FrozenMember {
        let pids = [pid_in(apiserver_pid), pid_in(kubelet_pid)];
        let mut frozen = FrozenMember {
            pids: Vec::new(),
            containerd: containerd.to_path_buf(),
            tasks: Vec::new(),
            resumed: false,
        };
        // The kubelet first: it would restart what it finds paused.
        for pid in pids.iter().rev() {
            signal(*pid, nix::sys::signal::Signal::SIGSTOP);
            frozen.pids.push(*pid);
        }
        let listing = ctr(containerd, &["task", "ls"]).expect("list the node's tasks");
        for line in listing.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if let [id, _pid, "RUNNING"] = cols.as_slice() {
                ctr(containerd, &["task", "pause", id]).expect("pause a task");
                frozen.tasks.push(id.to_string());
            }
        }
        frozen
    }

    /// Everything back as it was: tasks resumed, then the API server and
    /// the kubelet.
    pub fn resume(&mut self) {
        if self.resumed {
            return;
        }
        self.resumed = true;
        for id in &self.tasks {
            if let Err(e) = ctr(&self.containerd, &["task", "resume", id]) {
                eprintln!("resume task {id}: {e}");
            }
        }
        for pid in &self.pids {
            signal(*pid, nix::sys::signal::Signal::SIGCONT);
        }
    }
}

impl Drop for FrozenMember {
    fn drop(&mut self) {
        self.resume();
    }
}
