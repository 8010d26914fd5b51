//! `/proc/self/mountinfo`, the kernel's own account of what is mounted where.

use std::io;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    /// Path inside the mounted filesystem that is mounted here (bind mounts).
    pub root: PathBuf,
    pub fs_type: String,
    pub source: String,
    pub options: Vec<String>,
}

impl MountEntry {
    pub fn read_only(&self) -> bool {
        self.options.iter().any(|o| o == "ro")
    }
}

/// Undoes the kernel's octal escaping of space, tab, newline and backslash.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Some(v) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|oct| u8::from_str_radix(oct, 8).ok())
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount_point options [optional...] - fstype source super_options
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            if l.len() < 6 || r.len() < 2 {
                return None;
            }
            let mut options: Vec<String> = l[5].split(',').map(str::to_string).collect();
            if let Some(sup) = r.get(2) {
                options.extend(sup.split(',').map(str::to_string));
            }
            Some(MountEntry {
                root: PathBuf::from(unescape(l[3])),
                mount_point: PathBuf::from(unescape(l[4])),
                fs_type: r[0].to_string(),
                source: unescape(r[1]),
                options,
            })
        })
        .collect()
}

pub fn read() -> io::Result<Vec<MountEntry>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The topmost mount at exactly `path`, if any.
pub fn find(entries: &[MountEntry], path: &Path) -> Option<MountEntry> {
    entries
        .iter()
        .rev()
        .find(|e| e.mount_point == path)
        .cloned()
}

/// Whether `path` (resolved through symlinks when it exists) is a mount point.
pub fn mounted_at(path: &Path) -> io::Result<Option<MountEntry>> {
    let resolved = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(find(&read()?, &resolved))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
97 27 254:0 /var/lib/x/vol-1 /tmp/csi\\040mount/target rw,relatime shared:1 - ext4 /dev/vda rw
98 27 7:0 / /tmp/staging ro,nosuid - ext4 /dev/loop0 ro,errors=remount-ro
";

    #[test]
    fn parses_escaped_paths_and_options() {
        let e = parse(SAMPLE);
        assert_eq!(e.len(), 3);
        assert_eq!(e[1].mount_point, Path::new("/tmp/csi mount/target"));
        assert_eq!(e[1].root, Path::new("/var/lib/x/vol-1"));
        assert_eq!(e[2].source, "/dev/loop0");
        assert!(e[2].read_only());
        assert!(e[2].options.contains(&"errors=remount-ro".to_string()));
        assert!(find(&e, Path::new("/tmp/staging")).is_some());
        assert!(find(&e, Path::new("/tmp")).is_none());
    }

    #[test]
    fn garbage_lines_are_skipped() {
        assert!(parse("nonsense\n1 2 3\n").is_empty());
    }
}
