//! Records → CSI wire messages.

use crate::csi;
use crate::domain::volume::{ContentSource, GroupSnapshot, Snapshot, Volume};

pub fn timestamp(secs: i64, nanos: i32) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: secs,
        nanos,
    }
}

pub fn content_source(source: &ContentSource) -> csi::VolumeContentSource {
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let t = match source {
        ContentSource::Snapshot(id) => Type::Snapshot(SnapshotSource {
            snapshot_id: id.clone(),
        }),
        ContentSource::Volume(id) => Type::Volume(VolumeSource {
            volume_id: id.clone(),
        }),
    };
    csi::VolumeContentSource { r#type: Some(t) }
}

pub fn volume(v: &Volume) -> csi::Volume {
    csi::Volume {
        capacity_bytes: v.capacity_bytes as i64,
        volume_id: v.id.clone(),
        volume_context: v.context.clone().into_iter().collect(),
        content_source: v.source.as_ref().map(content_source),
        accessible_topology: v
            .topology
            .iter()
            .map(|segments| csi::Topology {
                segments: segments.clone().into_iter().collect(),
            })
            .collect(),
    }
}

pub fn snapshot(s: &Snapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: s.size_bytes as i64,
        snapshot_id: s.id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(timestamp(s.created_unix, s.created_nanos)),
        ready_to_use: true,
        group_snapshot_id: s.group_snapshot_id.clone().unwrap_or_default(),
    }
}

pub fn group_snapshot(g: &GroupSnapshot, members: &[Snapshot]) -> csi::VolumeGroupSnapshot {
    csi::VolumeGroupSnapshot {
        group_snapshot_id: g.id.clone(),
        snapshots: members.iter().map(snapshot).collect(),
        creation_time: Some(timestamp(g.created_unix, g.created_nanos)),
        ready_to_use: true,
    }
}

pub fn condition(h: &crate::backends::Health) -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: h.abnormal,
        message: h.message.clone(),
    }
}
