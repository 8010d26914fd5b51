//! Mount flags from a volume capability, split into the kernel's MS_* flags
//! and the filesystem-specific data string.

use nix::mount::MsFlags;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub flags: MsFlags,
    /// Filesystem-specific options (`data=ordered`, `discard`, ...).
    pub data: Vec<String>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            flags: MsFlags::empty(),
            data: Vec::new(),
        }
    }
}

impl MountOptions {
    pub fn parse(options: &[String], readonly: bool) -> Self {
        let mut flags = MsFlags::empty();
        let mut data = Vec::new();
        for o in options {
            match o.as_str() {
                "ro" => flags |= MsFlags::MS_RDONLY,
                "rw" | "defaults" | "bind" | "rbind" => {}
                "nosuid" => flags |= MsFlags::MS_NOSUID,
                "nodev" => flags |= MsFlags::MS_NODEV,
                "noexec" => flags |= MsFlags::MS_NOEXEC,
                "sync" => flags |= MsFlags::MS_SYNCHRONOUS,
                "dirsync" => flags |= MsFlags::MS_DIRSYNC,
                "noatime" => flags |= MsFlags::MS_NOATIME,
                "nodiratime" => flags |= MsFlags::MS_NODIRATIME,
                "relatime" => flags |= MsFlags::MS_RELATIME,
                "strictatime" => flags |= MsFlags::MS_STRICTATIME,
                "lazytime" => flags |= MsFlags::MS_LAZYTIME,
                other => data.push(other.to_string()),
            }
        }
        if readonly {
            flags |= MsFlags::MS_RDONLY;
        }
        MountOptions { flags, data }
    }

    pub fn data_string(&self) -> Option<String> {
        (!self.data.is_empty()).then(|| self.data.join(","))
    }

    /// Flags a bind mount needs a remount to apply (a bind ignores them).
    pub fn needs_remount(&self) -> bool {
        !self.flags.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_kernel_flags_from_fs_data() {
        let o = MountOptions::parse(
            &["noatime".into(), "data=ordered".into(), "nosuid".into()],
            true,
        );
        assert!(o
            .flags
            .contains(MsFlags::MS_NOATIME | MsFlags::MS_NOSUID | MsFlags::MS_RDONLY));
        assert_eq!(o.data_string().as_deref(), Some("data=ordered"));
        assert!(!MountOptions::parse(&[], false).needs_remount());
    }
}
