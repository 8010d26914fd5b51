//! NFS mounts. The kernel's NFS client wants its options pre-parsed (server
//! address resolution, version negotiation, lock daemons), which is what
//! mount.nfs from nfs-common does: NFS is mounted with `mount -t nfs`, the
//! way kubelet does it, and unmounted with umount2(2) like everything else.

use std::io;
use std::path::Path;
use std::time::Duration;

use super::helper;

/// The helper `mount -t nfs` runs; without it the kernel refuses NFS mounts.
pub const HELPER: &str = "mount.nfs";

/// Upper bound of one NFS mount: an unreachable server makes mount.nfs
/// retry for minutes, and a stage must fail (and be retried) instead.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(90);

pub fn helper_installed() -> bool {
    ["/sbin", "/usr/sbin", "/bin", "/usr/bin"]
        .iter()
        .any(|d| Path::new(d).join(HELPER).exists())
}

/// Why an NFS export description cannot be mounted, if it cannot.
fn check(server: &str, path: &str, options: &[String]) -> Result<(), String> {
    let bad = |s: &str| s.chars().any(|c| c.is_whitespace() || c.is_control());
    if server.is_empty() || server.starts_with('-') || bad(server) || server.contains(',') {
        return Err(format!(
            "NFS server {server:?} is not a host name or address"
        ));
    }
    if !path.starts_with('/') || bad(path) {
        return Err(format!("NFS export path {path:?} is not an absolute path"));
    }
    if let Some(o) = options.iter().find(|o| o.is_empty() || bad(o)) {
        return Err(format!("NFS mount option {o:?} is not valid"));
    }
    Ok(())
}

/// `server:path` as mount.nfs and /proc/self/mountinfo spell it: an IPv6
/// address is bracketed.
pub fn device(server: &str, path: &str) -> String {
    if server.contains(':') && !server.starts_with('[') {
        format!("[{server}]:{path}")
    } else {
        format!("{server}:{path}")
    }
}

/// The `mount` arguments that mount `server:path` at `target` with
/// `options` (the member PV's mountOptions, then the capability's mount
/// flags), read-only when `readonly`. Duplicates are dropped.
pub fn mount_args(
    server: &str,
    path: &str,
    options: &[String],
    readonly: bool,
    target: &Path,
) -> Result<Vec<String>, String> {
    check(server, path, options)?;
    let mut opts: Vec<String> = Vec::new();
    for o in options {
        if !opts.contains(o) {
            opts.push(o.clone());
        }
    }
    if readonly {
        opts.retain(|o| o != "rw");
        if !opts.iter().any(|o| o == "ro") {
            opts.push("ro".into());
        }
    }
    let mut args = vec!["-t".to_string(), "nfs".to_string()];
    if !opts.is_empty() {
        args.push("-o".into());
        args.push(opts.join(","));
    }
    args.push(device(server, path));
    args.push(target.to_string_lossy().into_owned());
    Ok(args)
}

/// Whether a mountinfo entry is the NFS export `server:path`.
pub fn is_export(fs_type: &str, source: &str, server: &str, path: &str) -> bool {
    let trim = |s: &str| s.trim_end_matches('/').to_string();
    fs_type.starts_with("nfs") && trim(source) == trim(&device(server, path))
}

/// Runs `mount` with `args` (from [`mount_args`]), bounded by [`MOUNT_TIMEOUT`].
pub async fn mount(args: &[String]) -> io::Result<()> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helper::run_ok("mount", &args, MOUNT_TIMEOUT)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(server: &str, path: &str, opts: &[&str], ro: bool) -> Result<Vec<String>, String> {
        let opts: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
        mount_args(
            server,
            path,
            &opts,
            ro,
            Path::new("/var/lib/kubelet/x/globalmount"),
        )
    }

    #[test]
    fn command_line_carries_options_and_export() {
        assert_eq!(
            args("10.0.0.5", "/exports/a", &["nfsvers=4.1", "hard"], false).unwrap(),
            [
                "-t",
                "nfs",
                "-o",
                "nfsvers=4.1,hard",
                "10.0.0.5:/exports/a",
                "/var/lib/kubelet/x/globalmount"
            ]
        );
        assert_eq!(
            args("nfs.example.com", "/", &[], false).unwrap(),
            [
                "-t",
                "nfs",
                "nfs.example.com:/",
                "/var/lib/kubelet/x/globalmount"
            ]
        );
    }

    #[test]
    fn read_only_replaces_rw_and_duplicates_go() {
        let a = args("s", "/e", &["rw", "noatime", "noatime"], true).unwrap();
        assert_eq!(a[3], "noatime,ro");
        let a = args("s", "/e", &["ro"], true).unwrap();
        assert_eq!(a[3], "ro");
    }

    #[test]
    fn ipv6_servers_are_bracketed() {
        assert_eq!(device("fd00::5", "/e"), "[fd00::5]:/e");
        assert_eq!(device("[fd00::5]", "/e"), "[fd00::5]:/e");
        assert!(is_export("nfs4", "[fd00::5]:/e/", "fd00::5", "/e"));
        assert!(is_export("nfs", "s:/e", "s", "/e"));
        assert!(!is_export("ext4", "s:/e", "s", "/e"));
        assert!(!is_export("nfs", "s:/other", "s", "/e"));
    }

    #[test]
    fn hostile_descriptions_are_refused() {
        assert!(args("-oremount", "/e", &[], false).is_err());
        assert!(args("", "/e", &[], false).is_err());
        assert!(args("s x", "/e", &[], false).is_err());
        assert!(args("s", "e", &[], false).is_err());
        assert!(args("s", "/e", &["a b"], false).is_err());
        assert!(args("s", "/e", &[""], false).is_err());
    }
}
