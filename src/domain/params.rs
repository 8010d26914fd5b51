//! StorageClass `parameters` decoded into a typed struct: an unknown or
//! malformed key is one clear INVALID_ARGUMENT naming it.

use std::collections::HashMap;

use serde::Deserialize;

use crate::domain::error::{CsiError, CsiResult};

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackingChoice {
    /// Decide from the capabilities: raw block or an explicit fs_type gets a
    /// block file, plain mount access gets a directory.
    #[default]
    Auto,
    Directory,
    Block,
}

#[derive(Deserialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct VolumeParams {
    /// How the local backend stores the volume.
    #[serde(default)]
    pub backing: BackingChoice,
    /// Filled in by external-provisioner's --extra-create-metadata.
    #[serde(rename = "csi.storage.k8s.io/pvc/name")]
    pub pvc_name: Option<String>,
    #[serde(rename = "csi.storage.k8s.io/pvc/namespace")]
    pub pvc_namespace: Option<String>,
    #[serde(rename = "csi.storage.k8s.io/pv/name")]
    pub pv_name: Option<String>,
    /// Member backend: the member cluster (a `--member` name). Optional when
    /// the topology key `topology.relay.csi.dev/member` picks one.
    pub member: Option<String>,
    /// Member backend: the StorageClass of the member PVC (default: the
    /// member cluster's default StorageClass).
    #[serde(rename = "memberStorageClass")]
    pub member_storage_class: Option<String>,
    /// Member backend: the namespace of the member PVC. `${pvc.namespace}`
    /// in it stands for the host PVC's namespace (e.g. Liqo's
    /// `${pvc.namespace}-<cluster id>`). Default: the host PVC's namespace
    /// when external-provisioner passes it, else "default".
    #[serde(rename = "memberNamespace")]
    pub member_namespace: Option<String>,
    /// Member backend: the member namespaces claims of this class may land
    /// in, comma-separated; an entry may end in `*` (any namespace starting
    /// so) and use `${pvc.namespace}`. A claim whose member namespace is not
    /// listed is refused. Default: any.
    #[serde(rename = "allowedMemberNamespaces")]
    pub allowed_member_namespaces: Option<String>,
    /// Member backend: how the member PVC is named. `host` (default): as the
    /// host PVC, so a pod mirrored into the member (Kosmos, Liqo) with its
    /// claim name finds it; `generated`: `relay-<uuid>`. Without the host
    /// PVC's name (no --extra-create-metadata) it is always generated.
    #[serde(rename = "memberClaimName")]
    pub member_claim_name: Option<ClaimNaming>,
    /// Member backend: "true" creates a missing member namespace (never
    /// deleted by the relay). Default "false": a missing namespace is
    /// FAILED_PRECONDITION naming it.
    #[serde(rename = "createMemberNamespace")]
    pub create_member_namespace: Option<Flag>,
    /// Member backend, global storage: the members that reach the same
    /// storage, comma-separated (the one that makes the volume among them).
    /// The volume is provisioned once and imported into another of them
    /// where a pod of it runs (`domain::sharing`).
    #[serde(rename = "sharedWith")]
    pub shared_with: Option<String>,
    /// Member backend, with sharedWith: `member=/path` pairs, comma-separated,
    /// where each member's nodes mount the shared filesystem that hostPath
    /// and local member PVs live on. Default: the same path in every member.
    #[serde(rename = "sharedPaths")]
    pub shared_paths: Option<String>,
    /// Member backend, moves: `member=class` pairs, comma-separated: the
    /// members that share no storage between which a volume moves with
    /// its pod, and the member StorageClass its claim gets in each. The
    /// data is copied by the relay's movers (`backends::member::mobility`).
    #[serde(rename = "movableBetween")]
    pub movable_between: Option<String>,
    /// Member backend, with movableBetween: what becomes of the old
    /// member's claim once the volume served in its new member: `delete`
    /// (default) or `keep` (until DeleteVolume: a move back then sends
    /// only what changed).
    #[serde(rename = "movedDataRetention")]
    pub moved_data_retention: Option<Retention>,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Retention {
    #[default]
    Delete,
    Keep,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClaimNaming {
    Host,
    Generated,
}

/// A boolean StorageClass parameter (parameters are strings).
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Flag {
    True,
    False,
}

impl Flag {
    pub fn on(flag: Option<Flag>) -> bool {
        flag == Some(Flag::True)
    }
}

impl VolumeParams {
    /// The member-backend keys present, by their StorageClass names.
    pub fn member_keys(&self) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.member.is_some() {
            keys.push("member");
        }
        if self.member_storage_class.is_some() {
            keys.push("memberStorageClass");
        }
        if self.member_namespace.is_some() {
            keys.push("memberNamespace");
        }
        if self.allowed_member_namespaces.is_some() {
            keys.push("allowedMemberNamespaces");
        }
        if self.member_claim_name.is_some() {
            keys.push("memberClaimName");
        }
        if self.create_member_namespace.is_some() {
            keys.push("createMemberNamespace");
        }
        if self.shared_with.is_some() {
            keys.push("sharedWith");
        }
        if self.shared_paths.is_some() {
            keys.push("sharedPaths");
        }
        if self.movable_between.is_some() {
            keys.push("movableBetween");
        }
        if self.moved_data_retention.is_some() {
            keys.push("movedDataRetention");
        }
        keys
    }
}

#[derive(Deserialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotParams {
    #[serde(rename = "csi.storage.k8s.io/volumesnapshot/name")]
    pub snapshot_name: Option<String>,
    #[serde(rename = "csi.storage.k8s.io/volumesnapshot/namespace")]
    pub snapshot_namespace: Option<String>,
    #[serde(rename = "csi.storage.k8s.io/volumesnapshotcontent/name")]
    pub content_name: Option<String>,
    /// Member backend: the VolumeSnapshotClass of the member VolumeSnapshot.
    #[serde(rename = "memberSnapshotClass")]
    pub member_snapshot_class: Option<String>,
}

/// VolumeGroupSnapshotClass parameters.
#[derive(Deserialize, Debug, Default, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GroupSnapshotParams {
    #[serde(rename = "csi.storage.k8s.io/volumegroupsnapshot/name")]
    pub group_name: Option<String>,
    #[serde(rename = "csi.storage.k8s.io/volumegroupsnapshot/namespace")]
    pub group_namespace: Option<String>,
    #[serde(rename = "csi.storage.k8s.io/volumegroupsnapshotcontent/name")]
    pub content_name: Option<String>,
    /// Member backend: the VolumeGroupSnapshotClass of the member
    /// VolumeGroupSnapshot (default: the member's default class of the
    /// claims' driver).
    #[serde(rename = "memberGroupSnapshotClass")]
    pub member_group_snapshot_class: Option<String>,
    /// Member backend: "true" cuts one member VolumeSnapshot per volume, one
    /// after another, where the member's driver cannot cut a group: NOT
    /// crash-consistent (a write between two cuts is in one and not the
    /// other).
    #[serde(rename = "perVolumeSnapshots")]
    pub per_volume_snapshots: Option<Flag>,
    /// Member backend, with perVolumeSnapshots: the VolumeSnapshotClass of
    /// those member VolumeSnapshots.
    #[serde(rename = "memberSnapshotClass")]
    pub member_snapshot_class: Option<String>,
}

impl GroupSnapshotParams {
    /// The parameters of each snapshot cut one by one for the group.
    pub fn per_volume(&self) -> std::collections::BTreeMap<String, String> {
        self.member_snapshot_class
            .iter()
            .map(|c| ("memberSnapshotClass".to_string(), c.clone()))
            .collect()
    }
}

pub fn decode<T: for<'de> Deserialize<'de>>(
    map: &HashMap<String, String>,
    field: &'static str,
) -> CsiResult<T> {
    // Going through a JSON object gives serde's precise messages ("unknown
    // field `x`, expected one of ...") and proper Option handling.
    let object = |pairs: &mut dyn Iterator<Item = (&String, &String)>| {
        serde_json::Value::Object(
            pairs
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect(),
        )
    };
    serde_json::from_value(object(&mut map.iter())).map_err(|e| {
        // serde names an unknown key but not the key of a bad value: find
        // it by decoding the keys one at a time (all are optional).
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort();
        let culprit = keys.into_iter().find(|k| {
            let one = object(&mut map.get_key_value(k.as_str()).into_iter());
            serde_json::from_value::<T>(one).is_err()
        });
        match culprit {
            Some(k) if !e.to_string().contains(k.as_str()) => {
                CsiError::invalid(field, format!("{k}: {e}"))
            }
            _ => CsiError::invalid(field, e.to_string()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn decodes_known_keys() {
        let p: VolumeParams = decode(
            &m(&[
                ("backing", "block"),
                ("csi.storage.k8s.io/pvc/name", "data"),
            ]),
            "parameters",
        )
        .unwrap();
        assert_eq!(p.backing, BackingChoice::Block);
        assert_eq!(p.pvc_name.as_deref(), Some("data"));
        assert_eq!(
            decode::<VolumeParams>(&HashMap::new(), "parameters").unwrap(),
            VolumeParams::default()
        );
    }

    #[test]
    fn decodes_member_keys() {
        let p: VolumeParams = decode(
            &m(&[
                ("member", "east"),
                ("memberStorageClass", "fast"),
                ("memberNamespace", "relay"),
            ]),
            "parameters",
        )
        .unwrap();
        assert_eq!(p.member.as_deref(), Some("east"));
        assert_eq!(p.member_storage_class.as_deref(), Some("fast"));
        assert_eq!(p.member_namespace.as_deref(), Some("relay"));
        assert_eq!(
            p.member_keys(),
            ["member", "memberStorageClass", "memberNamespace"]
        );
        assert!(VolumeParams::default().member_keys().is_empty());
        let s: SnapshotParams =
            decode(&m(&[("memberSnapshotClass", "csi-snap")]), "parameters").unwrap();
        assert_eq!(s.member_snapshot_class.as_deref(), Some("csi-snap"));
    }

    #[test]
    fn unknown_or_bad_values_name_the_problem() {
        let err = decode::<VolumeParams>(&m(&[("bogus", "1")]), "parameters").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let err = decode::<VolumeParams>(&m(&[("backing", "tape")]), "parameters").unwrap_err();
        assert!(err.to_string().contains("tape"), "{err}");
    }
}
