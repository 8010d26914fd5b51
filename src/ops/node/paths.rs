//! Checks of the staging and target paths a request names, made before
//! anything is recorded or mounted for them: the paths come from the CO,
//! and a mount on a system tree or on the driver's own state would be
//! worse than a refused call.

use std::path::{Path, PathBuf};

use crate::domain::error::{CsiError, CsiResult};
use crate::os::target_path::{self, PathError};

/// Resolves a staging or target path and refuses system paths.
pub fn guard(path: &Path, field: &'static str) -> CsiResult<PathBuf> {
    target_path::check(path).map_err(|e| refused(e, path, field))
}

/// A refused path, or one this process may not resolve, is the request's
/// fault (INVALID_ARGUMENT naming the field); any other failure to resolve
/// it is the machine's.
fn refused(e: PathError, path: &Path, field: &'static str) -> CsiError {
    match e {
        PathError::Resolve(io) if io.kind() != std::io::ErrorKind::PermissionDenied => {
            CsiError::io("resolve", path, io)
        }
        refused => CsiError::invalid(field, refused.to_string()),
    }
}

/// Checks a staging or target path from a request before anything is
/// recorded or created for it: no system path, nothing in or above the
/// driver's state dir (volume data, the state store). Returns the path
/// resolved through symlinks.
pub fn check_path(path: &str, state_dir: &Path, field: &'static str) -> CsiResult<PathBuf> {
    target_path::check_outside(Path::new(path), state_dir)
        .map_err(|e| refused(e, Path::new(path), field))
}

/// A target inside the staging path (or the other way round, or the same
/// path) would bind the staged volume onto itself and wedge unstaging; the
/// check also sees through symlinks (`resolved_target` is what
/// `check_path` returned for the target).
pub fn check_apart(target: &str, resolved_target: &Path, staging: &str) -> CsiResult<()> {
    let overlap = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    let (t, s) = (Path::new(target), Path::new(staging));
    let overlaps =
        overlap(t, s) || target_path::resolve(s).is_ok_and(|rs| overlap(resolved_target, &rs));
    if overlaps {
        return Err(CsiError::invalid(
            "target_path",
            format!(
                "target_path {target:?} and staging_target_path {staging:?} overlap; \
                 a volume is published to a path apart from where it is staged"
            ),
        ));
    }
    Ok(())
}
