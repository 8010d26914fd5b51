//! What the sources of a member cluster's PersistentVolume share: errors
//! that name the member PV, the mount-access-only rule of the sources this
//! node mounts itself, and the health a node-local record reports.

use crate::backends::Health;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::member_source::MemberSource;

/// A member PV's source as this node holds it.
#[derive(Debug, Clone)]
pub struct MemberPv {
    pub source: MemberSource,
    /// Described by a node-local record (a node plugin with its own
    /// store): the member cluster is the controller's to watch, so this
    /// node reports only what it knows.
    pub node_local: bool,
}

impl MemberPv {
    pub fn refused(&self, why: impl std::fmt::Display) -> CsiError {
        CsiError::FailedPrecondition(format!(
            "member cluster {}: PersistentVolume {}: {why}",
            self.source.member, self.source.pv
        ))
    }

    /// NFS exports and host directories are file trees: raw block access
    /// to them does not exist.
    pub fn mount_access_only(&self, cap: &Capability) -> CsiResult<()> {
        if cap.is_block() {
            return Err(CsiError::invalid(
                "volume_capability",
                format!(
                    "member PersistentVolume {} is a {} volume: it can be staged for mount access only",
                    self.source.pv,
                    self.source.kind.name()
                ),
            ));
        }
        Ok(())
    }

    pub fn own_health(&self) -> Option<Health> {
        let m = &self.source;
        self.node_local.then(|| Health {
            abnormal: false,
            message: format!(
                "member cluster {}: PersistentVolume {} ({} source)",
                m.member,
                m.pv,
                m.kind.name()
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::member_source::SourceKind;
    use crate::grpc::status::CsiCode;

    #[test]
    fn block_access_is_refused_for_mounted_sources() {
        let m = MemberPv {
            source: MemberSource {
                member: "east".into(),
                pv: "pv-1".into(),
                member_node: None,
                read_only: false,
                mount_options: vec![],
                kind: SourceKind::Nfs {
                    server: "s".into(),
                    path: "/e".into(),
                },
            },
            node_local: false,
        };
        let block = Capability {
            mode: crate::domain::capability::AccessMode::SingleNodeWriter,
            access: crate::domain::capability::AccessType::Block,
        };
        let err = m.mount_access_only(&block).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("nfs"), "{err}");
    }
}
