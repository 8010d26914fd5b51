//! Copies a volume's directory tree for clones and snapshots: regular files,
//! directories and symlinks (never followed, so a link inside a volume cannot
//! pull in files from outside it), with permissions. Files are copied by
//! reflink or by data extents, so sparse files stay sparse.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

pub fn copy_tree(src: &Path, dst: &Path) -> io::Result<u64> {
    let mut copied = 0;
    let meta = fs::symlink_metadata(src)?;
    fs::create_dir_all(dst)?;
    fs::set_permissions(dst, fs::Permissions::from_mode(meta.permissions().mode()))?;
    // An explicit stack instead of recursion: a hostile deep tree cannot
    // overflow the driver's stack.
    let mut stack = vec![(src.to_path_buf(), dst.to_path_buf())];
    while let Some((from_dir, to_dir)) = stack.pop() {
        for entry in fs::read_dir(&from_dir)? {
            let entry = entry?;
            let from = entry.path();
            let to = to_dir.join(entry.file_name());
            let ft = entry.file_type()?;
            if ft.is_symlink() {
                symlink(fs::read_link(&from)?, &to)?;
            } else if ft.is_dir() {
                let mode = entry.metadata()?.permissions().mode();
                fs::create_dir(&to)?;
                fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
                stack.push((from, to));
            } else if ft.is_file() {
                crate::backends::local::sparse_copy::copy_file(&from, &to)?;
                copied += entry.metadata()?.len();
            }
            // Sockets, fifos and device nodes are not volume data; skip them.
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_files_dirs_and_links_without_following_them() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir_all(src.join("a/b")).unwrap();
        fs::write(src.join("a/b/f"), b"data").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("link")).unwrap();
        let dst = tmp.path().join("dst");
        let n = copy_tree(&src, &dst).unwrap();
        assert_eq!(n, 4);
        assert_eq!(fs::read(dst.join("a/b/f")).unwrap(), b"data");
        assert_eq!(
            fs::read_link(dst.join("link")).unwrap(),
            Path::new("/etc/passwd")
        );
    }
}
