//! The one place that decides what a volume record is mounted from on this
//! node: a member PV's source when this node's attachment (or the member
//! backend) describes one, else the backend's own data.

use std::collections::BTreeMap;

use super::csi_proxy::CsiProxy;
use super::directory::Directory;
use super::host_path::HostPath;
use super::member_pv::MemberPv;
use super::{block_file::BlockFile, nfs::Nfs, Source};
use crate::backends::NodeSource;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::member_source::{self as source, MemberSource, SourceKind};
use crate::domain::state::is_node_local;
use crate::domain::volume::{Backing, Volume};
use crate::ops::driver::Driver;

/// The source types this node can mount.
const SOURCE_TYPES: &[&str] = &["nfs", "hostPath", "local", "csi"];

/// Decodes a member publish_context: FAILED_PRECONDITION naming a source
/// type this node cannot mount, INVALID_ARGUMENT naming a missing or
/// malformed key.
pub fn decode(context: &BTreeMap<String, String>) -> CsiResult<MemberSource> {
    if let Some(t) = context.get(source::SOURCE_TYPE) {
        if !SOURCE_TYPES.contains(&t.as_str()) {
            return Err(CsiError::FailedPrecondition(format!(
                "member volume source type {t:?} cannot be mounted by csi-relay on this node (supported: {})",
                SOURCE_TYPES.join(", ")
            )));
        }
    }
    MemberSource::from_context(context)
}

/// The source `vol` is staged and published from on `node_id`.
pub fn of(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<Box<dyn Source>> {
    let node_local = is_node_local(vol);
    if let Some(m) = attached_member_source(vol, node_id)? {
        return Ok(member(d, m, node_local));
    }
    Ok(match d.backend.node_source(vol)? {
        NodeSource::Directory(dir) => Box::new(Directory::new(dir)),
        NodeSource::BlockFile(file) => {
            let fs_type = match &vol.backing {
                Backing::BlockFile { fs_type } => fs_type.clone(),
                _ => String::new(),
            };
            Box::new(BlockFile::new(file, fs_type))
        }
        NodeSource::Member(m) => member(d, *m, node_local),
    })
}

/// The source to unpublish and unstage with. A member volume whose source
/// description is gone (a controller sharing the store force-detached it
/// first) is torn down by unmounting what is mounted at our paths.
pub fn for_teardown(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<Box<dyn Source>> {
    match of(d, vol, node_id) {
        Ok(s) => Ok(s),
        Err(e) if matches!(vol.backing, Backing::Member { .. }) && !is_node_local(vol) => {
            tracing::warn!(volume_id = %vol.id, error = %e, "member source unknown; unmounting locally");
            Ok(Box::new(Directory::teardown_only()))
        }
        Err(e) => Err(e),
    }
}

/// The source to restore `vol`'s mounts from after a restart; `None` for a
/// member volume whose description is gone (its interrupted work can still
/// be undone with [`for_teardown`]).
pub fn for_restore(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<Option<Box<dyn Source>>> {
    match of(d, vol, node_id) {
        Ok(s) => Ok(Some(s)),
        Err(e) if matches!(vol.backing, Backing::Member { .. }) => {
            tracing::error!(volume_id = %vol.id, error = %e, "member volume source unknown; its mounts cannot be restored");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The member source this node's attachment's publish_context describes,
/// if it describes one (otherwise the backend says what the record is
/// mounted from). A node-local record has nothing else to go by.
fn attached_member_source(vol: &Volume, node_id: &str) -> CsiResult<Option<MemberSource>> {
    let context = vol
        .node(node_id)
        .and_then(|n| n.attachment.as_ref())
        .map(|a| &a.publish_context)
        .filter(|c| c.contains_key(source::SOURCE_TYPE));
    if let Some(c) = context {
        return decode(c).map(Some);
    }
    if is_node_local(vol) {
        return Err(CsiError::Internal(format!(
            "node-local record of volume {:?} has lost its member publish_context",
            vol.id
        )));
    }
    Ok(None)
}

fn member(d: &Driver, source: MemberSource, node_local: bool) -> Box<dyn Source> {
    let kind = source.kind.clone();
    let member = MemberPv { source, node_local };
    match kind {
        SourceKind::Nfs { server, path } => Box::new(Nfs {
            member,
            server,
            export: path,
        }),
        SourceKind::HostPath { path, .. } | SourceKind::Local { path, .. } => Box::new(HostPath {
            member,
            path,
            state_dir: d.config.state_dir.clone(),
            plugins_dir: d.plugins_dir.clone(),
        }),
        SourceKind::Csi { .. } => Box::new(CsiProxy {
            member,
            driver: d.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

    fn context(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unknown_source_types_are_a_failed_precondition_naming_them() {
        let c = context(&[
            (source::SOURCE_TYPE, "iscsi"),
            (source::MEMBER, "east"),
            (source::MEMBER_PV, "pv-1"),
        ]);
        let err = decode(&c).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.to_string().contains("\"iscsi\""), "{err}");
    }

    #[test]
    fn known_source_types_decode() {
        let c = context(&[
            (source::SOURCE_TYPE, "hostPath"),
            (source::MEMBER, "east"),
            (source::MEMBER_PV, "pv-1"),
            (source::HOST_PATH, "/data/x"),
        ]);
        let m = decode(&c).unwrap();
        assert_eq!(
            m.kind,
            SourceKind::HostPath {
                path: "/data/x".into(),
                type_: None
            }
        );
        let mut broken = c.clone();
        broken.remove(source::HOST_PATH);
        assert_eq!(
            decode(&broken).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
