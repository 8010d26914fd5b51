//! A volume capability (access mode + access type) as the driver stores and
//! compares it, decoded and checked from the wire form once.

use serde::{Deserialize, Serialize};

use crate::csi::volume_capability::{access_mode::Mode, AccessType as WireAccessType};
use crate::csi::{self, VolumeCapability};
use crate::domain::error::{CsiError, CsiResult};

const MAX_MOUNT_FLAGS: usize = 32;
const MAX_FLAG_LEN: usize = 128;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// Modes that allow the volume on at most one node at a time.
    pub fn single_node(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeWriter
                | AccessMode::SingleNodeReaderOnly
                | AccessMode::SingleNodeSingleWriter
                | AccessMode::SingleNodeMultiWriter
        )
    }

    pub fn read_only(self) -> bool {
        matches!(
            self,
            AccessMode::SingleNodeReaderOnly | AccessMode::MultiNodeReaderOnly
        )
    }

    fn to_wire(self) -> Mode {
        match self {
            AccessMode::SingleNodeWriter => Mode::SingleNodeWriter,
            AccessMode::SingleNodeReaderOnly => Mode::SingleNodeReaderOnly,
            AccessMode::MultiNodeReaderOnly => Mode::MultiNodeReaderOnly,
            AccessMode::MultiNodeSingleWriter => Mode::MultiNodeSingleWriter,
            AccessMode::MultiNodeMultiWriter => Mode::MultiNodeMultiWriter,
            AccessMode::SingleNodeSingleWriter => Mode::SingleNodeSingleWriter,
            AccessMode::SingleNodeMultiWriter => Mode::SingleNodeMultiWriter,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum AccessType {
    Block,
    Mount {
        fs_type: String,
        mount_flags: Vec<String>,
        volume_mount_group: String,
    },
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Capability {
    pub mode: AccessMode,
    pub access: AccessType,
}

/// Filesystems the node can create and mount on block-file volumes.
pub const SUPPORTED_FS_TYPES: &[&str] = &["ext4", "ext3", "xfs"];

impl Capability {
    /// A single-node writer mount with no fs_type or flags: the plainest
    /// capability, for tests.
    #[cfg(test)]
    pub fn plain_mount() -> Capability {
        Capability::mount(AccessMode::SingleNodeWriter)
    }

    /// A mount of `mode` with no fs_type or flags, for tests.
    #[cfg(test)]
    pub fn mount(mode: AccessMode) -> Capability {
        Capability {
            mode,
            access: AccessType::Mount {
                fs_type: String::new(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            },
        }
    }

    /// Raw block access of `mode`, for tests.
    #[cfg(test)]
    pub fn block(mode: AccessMode) -> Capability {
        Capability {
            mode,
            access: AccessType::Block,
        }
    }

    /// Decodes one capability; `field` names it in error messages.
    pub fn from_wire(cap: &VolumeCapability, field: &'static str) -> CsiResult<Self> {
        let mode = match cap.access_mode.as_ref().map(|m| m.mode()) {
            None => return Err(CsiError::invalid(field, "access_mode is missing")),
            Some(Mode::Unknown) => {
                return Err(CsiError::invalid(field, "access_mode is UNKNOWN"));
            }
            Some(Mode::SingleNodeWriter) => AccessMode::SingleNodeWriter,
            Some(Mode::SingleNodeReaderOnly) => AccessMode::SingleNodeReaderOnly,
            Some(Mode::MultiNodeReaderOnly) => AccessMode::MultiNodeReaderOnly,
            Some(Mode::MultiNodeSingleWriter) => AccessMode::MultiNodeSingleWriter,
            Some(Mode::MultiNodeMultiWriter) => AccessMode::MultiNodeMultiWriter,
            Some(Mode::SingleNodeSingleWriter) => AccessMode::SingleNodeSingleWriter,
            Some(Mode::SingleNodeMultiWriter) => AccessMode::SingleNodeMultiWriter,
        };
        let access = Self::access_from_wire(cap, field)?;
        Ok(Capability { mode, access })
    }

    /// Checks a capability whose access mode does not matter (GetCapacity:
    /// external-provisioner's capacity tracking sends UNKNOWN on purpose,
    /// as the spec wants some capability and capacity depends on none).
    pub fn check_access_type(cap: &VolumeCapability, field: &'static str) -> CsiResult<()> {
        Self::access_from_wire(cap, field).map(|_| ())
    }

    fn access_from_wire(cap: &VolumeCapability, field: &'static str) -> CsiResult<AccessType> {
        Ok(match &cap.access_type {
            None => {
                return Err(CsiError::invalid(
                    field,
                    "access_type is missing: set either block or mount",
                ))
            }
            Some(WireAccessType::Block(_)) => AccessType::Block,
            Some(WireAccessType::Mount(m)) => {
                let fs_type = m.fs_type.trim().to_ascii_lowercase();
                if !fs_type.is_empty() && !SUPPORTED_FS_TYPES.contains(&fs_type.as_str()) {
                    return Err(CsiError::invalid(
                        field,
                        format!(
                            "fs_type {:?} is not supported (supported: {})",
                            m.fs_type,
                            SUPPORTED_FS_TYPES.join(", ")
                        ),
                    ));
                }
                check_mount_flags(&m.mount_flags, field)?;
                if m.volume_mount_group.len() > MAX_FLAG_LEN {
                    return Err(CsiError::invalid(field, "volume_mount_group is too long"));
                }
                AccessType::Mount {
                    fs_type,
                    mount_flags: m.mount_flags.clone(),
                    volume_mount_group: m.volume_mount_group.clone(),
                }
            }
        })
    }

    /// Decodes a non-empty list of capabilities.
    pub fn list_from_wire(caps: &[VolumeCapability], field: &'static str) -> CsiResult<Vec<Self>> {
        if caps.is_empty() {
            return Err(CsiError::Missing(field));
        }
        if caps.len() > 16 {
            return Err(CsiError::invalid(field, "more than 16 capabilities"));
        }
        caps.iter()
            .map(|c| Capability::from_wire(c, field))
            .collect()
    }

    pub fn required(cap: Option<&VolumeCapability>, field: &'static str) -> CsiResult<Self> {
        Capability::from_wire(cap.ok_or(CsiError::Missing(field))?, field)
    }

    pub fn is_block(&self) -> bool {
        matches!(self.access, AccessType::Block)
    }

    pub fn mount_flags(&self) -> &[String] {
        match &self.access {
            AccessType::Mount { mount_flags, .. } => mount_flags,
            AccessType::Block => &[],
        }
    }

    pub fn fs_type(&self) -> Option<&str> {
        match &self.access {
            AccessType::Mount { fs_type, .. } if !fs_type.is_empty() => Some(fs_type),
            _ => None,
        }
    }

    /// Same access type and filesystem: what must match for a volume created
    /// with `self` to be used as `other`. Mount flags are per-publish options.
    pub fn same_access(&self, other: &Capability) -> bool {
        match (&self.access, &other.access) {
            (AccessType::Block, AccessType::Block) => true,
            (AccessType::Mount { fs_type: a, .. }, AccessType::Mount { fs_type: b, .. }) => {
                a.is_empty() || b.is_empty() || a == b
            }
            _ => false,
        }
    }

    pub fn to_wire(&self) -> VolumeCapability {
        let access_type = match &self.access {
            AccessType::Block => WireAccessType::Block(csi::volume_capability::BlockVolume {}),
            AccessType::Mount {
                fs_type,
                mount_flags,
                volume_mount_group,
            } => WireAccessType::Mount(csi::volume_capability::MountVolume {
                fs_type: fs_type.clone(),
                mount_flags: mount_flags.clone(),
                volume_mount_group: volume_mount_group.clone(),
            }),
        };
        VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: self.mode.to_wire() as i32,
            }),
        }
    }
}

/// Mount flags come from StorageClass `mountOptions`, i.e. from users: each
/// must be one option (no comma smuggling several), printable and bounded.
fn check_mount_flags(flags: &[String], field: &'static str) -> CsiResult<()> {
    if flags.len() > MAX_MOUNT_FLAGS {
        return Err(CsiError::invalid(
            field,
            format!(
                "{} mount_flags given, at most {MAX_MOUNT_FLAGS} allowed",
                flags.len()
            ),
        ));
    }
    for flag in flags {
        let ok = !flag.is_empty()
            && flag.len() <= MAX_FLAG_LEN
            && flag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_=.:/-+".contains(&b));
        if !ok {
            return Err(CsiError::invalid(
                field,
                format!("mount flag {flag:?} must be one option of [A-Za-z0-9_=.:/+-], at most {MAX_FLAG_LEN} bytes"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{AccessMode as WireMode, MountVolume};

    fn wire(mode: Mode, access: Option<WireAccessType>) -> VolumeCapability {
        VolumeCapability {
            access_type: access,
            access_mode: Some(WireMode { mode: mode as i32 }),
        }
    }

    fn mount(fs: &str, flags: &[&str]) -> Option<WireAccessType> {
        Some(WireAccessType::Mount(MountVolume {
            fs_type: fs.into(),
            mount_flags: flags.iter().map(|s| s.to_string()).collect(),
            volume_mount_group: String::new(),
        }))
    }

    #[test]
    fn round_trips_through_the_wire_form() {
        let cap = Capability::from_wire(
            &wire(Mode::MultiNodeMultiWriter, mount("ext4", &["noatime"])),
            "c",
        )
        .unwrap();
        assert_eq!(Capability::from_wire(&cap.to_wire(), "c").unwrap(), cap);
    }

    #[test]
    fn rejects_missing_parts_naming_the_field() {
        let err = Capability::from_wire(&wire(Mode::SingleNodeWriter, None), "volume_capability")
            .unwrap_err();
        assert!(err.to_string().contains("volume_capability"));
        let err = Capability::from_wire(&wire(Mode::Unknown, mount("", &[])), "c").unwrap_err();
        assert!(err.to_string().contains("UNKNOWN"));
        assert!(matches!(
            Capability::list_from_wire(&[], "volume_capabilities"),
            Err(CsiError::Missing("volume_capabilities"))
        ));
    }

    #[test]
    fn rejects_hostile_mount_flags_and_unknown_filesystems() {
        assert!(
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("", &["ro,exec"])), "c")
                .is_err()
        );
        assert!(
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("", &["a b"])), "c").is_err()
        );
        assert!(
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("zfs-nope", &[])), "c")
                .is_err()
        );
        let long = "x".repeat(MAX_FLAG_LEN + 1);
        assert!(
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("", &[&long])), "c").is_err()
        );
    }

    #[test]
    fn access_compatibility() {
        let block = Capability::from_wire(
            &wire(
                Mode::SingleNodeWriter,
                Some(WireAccessType::Block(Default::default())),
            ),
            "c",
        )
        .unwrap();
        let ext4 =
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("ext4", &[])), "c").unwrap();
        let any =
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("", &[])), "c").unwrap();
        let xfs =
            Capability::from_wire(&wire(Mode::SingleNodeWriter, mount("xfs", &[])), "c").unwrap();
        assert!(!block.same_access(&ext4));
        assert!(ext4.same_access(&any));
        assert!(!ext4.same_access(&xfs));
        assert!(AccessMode::SingleNodeMultiWriter.single_node());
        assert!(!AccessMode::MultiNodeReaderOnly.single_node());
    }
}
