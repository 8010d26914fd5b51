//! Guards for paths the CO asks us to mount on. A hostile or mistaken path
//! must never put a mount over a system directory.

use std::io;
use std::path::{Path, PathBuf};

/// Why a path the CO named is not used.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("{}, a system path this driver never mounts on", shown(.path, .resolved))]
    SystemPath { path: PathBuf, resolved: PathBuf },
    #[error("{}, which overlaps the driver's state directory {}", shown(.path, .resolved), .state_dir.display())]
    StateDir {
        path: PathBuf,
        resolved: PathBuf,
        state_dir: PathBuf,
    },
    /// The path could not be resolved (its source says why). Callers take
    /// a permission error on the way as a refused path.
    #[error(transparent)]
    Resolve(#[from] io::Error),
}

fn shown(path: &Path, resolved: &Path) -> String {
    format!("{} resolves to {}", path.display(), resolved.display())
}

/// System trees no CSI staging or target path may be in.
const FORBIDDEN_TREES: &[&str] = &[
    "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/boot",
];
/// Directories that may hold CSI paths but must never be mounted over themselves.
const FORBIDDEN_EXACT: &[&str] = &[
    "/", "/var", "/var/lib", "/tmp", "/root", "/home", "/run", "/mnt", "/opt", "/srv",
];

/// Resolves `path` as far as it exists (symlinks included); the rest is
/// appended as given.
pub fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    let mut resolved = canonical(&existing)?;
    for name in rest.into_iter().rev() {
        resolved.push(name);
    }
    Ok(resolved)
}

/// The path the kernel resolved `existing` to: three syscalls, where
/// `canonicalize` makes one per component (a kubelet target path has nine).
/// Falls back to `canonicalize` where /proc is not mounted or the answer is
/// not a reachable absolute path.
fn canonical(existing: &Path) -> io::Result<PathBuf> {
    use nix::fcntl::{open, readlink, OFlag};
    use std::os::fd::AsRawFd;
    let by_kernel = open(
        existing,
        OFlag::O_PATH | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .and_then(|fd| readlink(format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str()));
    match by_kernel {
        Ok(p) if reachable(&p) => Ok(PathBuf::from(p)),
        _ => std::fs::canonicalize(existing),
    }
}

/// Whether a /proc/self/fd link names a path this process can reach: the
/// kernel writes "(unreachable)/..." for one outside our root and appends
/// " (deleted)" to one removed meanwhile.
fn reachable(link: &std::ffi::OsStr) -> bool {
    let b = link.as_encoded_bytes();
    b.starts_with(b"/") && !b.ends_with(b" (deleted)")
}

/// Resolves `path` as far as it exists (symlinks included) and checks it.
pub fn check(path: &Path) -> Result<PathBuf, PathError> {
    let resolved = resolve(path)?;
    let forbidden = FORBIDDEN_TREES.iter().any(|t| resolved.starts_with(t))
        || FORBIDDEN_EXACT.iter().any(|t| resolved == Path::new(t));
    if forbidden {
        return Err(PathError::SystemPath {
            path: path.to_path_buf(),
            resolved,
        });
    }
    Ok(resolved)
}

/// Like `check`, and also refuses a path inside `protected` (the driver's
/// state dir: volumes' data and the state store) or above it, where a mount
/// would hide or redirect it. `protected` is taken as already resolved:
/// the state dir is resolved once, at start-up.
pub fn check_outside(path: &Path, protected: &Path) -> Result<PathBuf, PathError> {
    let resolved = check(path)?;
    if resolved.starts_with(protected) || protected.starts_with(&resolved) {
        return Err(PathError::StateDir {
            path: path.to_path_buf(),
            resolved,
            state_dir: protected.to_path_buf(),
        });
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts a refused path has always had, word for word.
    #[test]
    fn refusals_keep_their_text() {
        assert_eq!(
            check(Path::new("/etc/x")).unwrap_err().to_string(),
            "/etc/x resolves to /etc/x, a system path this driver never mounts on"
        );
        let tmp = tempfile::tempdir().unwrap();
        let state = std::fs::canonicalize(tmp.path()).unwrap();
        let inside = state.join("volumes/v");
        assert_eq!(
            check_outside(&inside, &state).unwrap_err().to_string(),
            format!(
                "{} resolves to {}, which overlaps the driver's state directory {}",
                inside.display(),
                inside.display(),
                state.display()
            )
        );
    }

    #[test]
    fn system_paths_and_links_into_them_are_refused() {
        assert!(check(Path::new("/etc/x")).is_err());
        assert!(check(Path::new("/tmp")).is_err());
        assert!(check(Path::new("/proc/self")).is_err());
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink("/etc", &link).unwrap();
        assert!(check(&link.join("target")).is_err());
        // The kernel's answer and canonicalize's agree, links included.
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("real"), tmp.path().join("to-real")).unwrap();
        for p in [
            tmp.path().join("to-real"),
            tmp.path().join("real/../to-real/."),
        ] {
            assert_eq!(canonical(&p).unwrap(), std::fs::canonicalize(&p).unwrap());
        }
        assert!(canonical(&tmp.path().join("none")).is_err());
        // What the kernel answers for a removed or out-of-root file sends
        // the resolution to canonicalize.
        for (link, ok) in [
            ("/var/lib/kubelet/pods/x", true),
            ("/var/lib/kubelet/pods/x (deleted)", false),
            ("(unreachable)/var/lib/x", false),
            ("", false),
        ] {
            assert_eq!(reachable(std::ffi::OsStr::new(link)), ok, "{link}");
        }
        let ok = tmp.path().join("not/yet/there");
        assert_eq!(
            check(&ok).unwrap(),
            std::fs::canonicalize(tmp.path())
                .unwrap()
                .join("not/yet/there")
        );
    }
}
