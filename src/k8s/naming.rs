//! Deterministic names: everything the member backend creates is named from
//! the host volume's id (or snapshot id), so a retry after a crash finds the
//! object it created before instead of making a second one. Labels and
//! annotations link member objects back to the host volume.

use std::collections::BTreeMap;

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params::{ClaimNaming, VolumeParams};
use crate::domain::volume::{Backing, Volume};

/// Longest member cluster name: keeps `m-<member>-<uuid>` well under 128 bytes.
pub const MAX_MEMBER_NAME: usize = 40;

pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "csi-relay";
/// Label: the 32 hex digits of the host volume's id.
pub const VOLUME_UUID_LABEL: &str = "relay.csi.dev/volume-uuid";
/// Annotation: the host volume id.
pub const VOLUME_ID_ANNOTATION: &str = "relay.csi.dev/volume-id";
/// Annotation: the CSI volume name (the host PV's name).
pub const VOLUME_NAME_ANNOTATION: &str = "relay.csi.dev/volume-name";
/// Annotation: the snapshot id a member VolumeSnapshot belongs to.
pub const SNAPSHOT_ID_ANNOTATION: &str = "relay.csi.dev/snapshot-id";
/// Annotation on a member VolumeSnapshot: the snapshot's record (JSON), from
/// which a controller that lost its store recovers it.
pub const SNAPSHOT_RECORD_ANNOTATION: &str = "relay.csi.dev/snapshot-record";
/// Annotation: the csi-relay driver name that created the object.
pub const DRIVER_ANNOTATION: &str = "relay.csi.dev/driver";
/// Label and annotation: the host PVC (from --extra-create-metadata).
pub const HOST_PVC_NAME: &str = "relay.csi.dev/host-pvc-name";
pub const HOST_PVC_NAMESPACE: &str = "relay.csi.dev/host-pvc-namespace";
/// Annotation: the host PV (from --extra-create-metadata).
pub const HOST_PV_NAME: &str = "relay.csi.dev/host-pv-name";
/// Annotation on a member VolumeAttachment: the host node it was made
/// for, so that unpublishing finds it without the node's member mapping.
pub const HOST_NODE_ANNOTATION: &str = "relay.csi.dev/host-node";
/// Label on a RelayVolume kept as the record of a volume deleted while its
/// member was declared lost: the member its storage was left in.
pub const RELEASED_FROM_LABEL: &str = "relay.csi.dev/released-from";
/// Kubernetes' annotation telling a WaitForFirstConsumer provisioner the node.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

pub use crate::domain::validate::{is_dns_label, is_dns_subdomain};

/// A label value: at most 63 characters of [A-Za-z0-9-_.], alphanumeric at
/// both ends.
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 63
        && (b.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))))
}

pub fn check_member_name(name: &str) -> Result<(), String> {
    if !is_dns_label(name) || name.len() > MAX_MEMBER_NAME {
        return Err(format!(
            "member name {name:?} must be a DNS-1123 label (lowercase letters, digits, '-') of at most {MAX_MEMBER_NAME} characters"
        ));
    }
    Ok(())
}

/// [`check_member_name`] as a command-line value parser: the flags that
/// name a member (`--lost-member`) take it.
pub fn parse_member_name(name: &str) -> Result<String, String> {
    check_member_name(name)?;
    Ok(name.to_string())
}

/// 64-bit FNV-1a: a stable (across builds and releases) short digest.
pub fn fnv64(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `m-<member>-<uuid>`: at most 2 + 40 + 1 + 32 = 75 bytes.
pub fn volume_id(member: &str, uuid: &uuid::Uuid) -> String {
    format!("m-{member}-{}", uuid.simple())
}

/// The member and uuid of a member volume id.
pub fn parse_volume_id(id: &str) -> Option<(&str, &str)> {
    let rest = id.strip_prefix("m-")?;
    let (member, uuid) = rest.rsplit_once('-')?;
    let hex = uuid.len() == 32
        && uuid
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c));
    (hex && check_member_name(member).is_ok()).then_some((member, uuid))
}

/// The generated name of the member PVC of the volume with this uuid.
pub fn pvc_name(uuid: &str) -> String {
    format!("relay-{uuid}")
}

/// In `memberNamespace`: the host PVC's namespace.
pub const HOST_NAMESPACE_VAR: &str = "${pvc.namespace}";
/// The member namespace when nothing else names one.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The uuid of a volume id, from the CSI name: a CreateVolume retried after
/// a crash lost its record (or on a rescheduled controller with an empty
/// state dir) lands on the same id, and so on the member PVC the first
/// attempt created, instead of leaking it and making a second.
pub fn volume_uuid(driver_name: &str, name: &str) -> uuid::Uuid {
    let per_driver = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_DNS, driver_name.as_bytes());
    uuid::Uuid::new_v5(&per_driver, name.as_bytes())
}

/// Whether `memberNamespace` is acceptable before any host namespace is
/// known (its `${pvc.namespace}` stood for by a one-letter name).
pub fn check_namespace_template(template: &str) -> Result<(), String> {
    if is_dns_label(&template.replace(HOST_NAMESPACE_VAR, "a")) {
        Ok(())
    } else {
        Err(format!(
            "memberNamespace {template:?} is not a valid namespace name (a DNS-1123 label, optionally using {HOST_NAMESPACE_VAR})"
        ))
    }
}

/// Whether `allowedMemberNamespaces` is acceptable: comma-separated
/// entries, each a namespace name (with `${pvc.namespace}` standing for a
/// one-letter name) or such a name's start followed by `*`.
pub fn check_allowed_namespaces(list: &str) -> Result<(), String> {
    let entries: Vec<&str> = list.split(',').map(str::trim).collect();
    for entry in &entries {
        let probe = entry.replace(HOST_NAMESPACE_VAR, "a");
        let ok = match probe.strip_suffix('*') {
            Some("") => true,
            Some(start) => !start.contains('*') && is_dns_label(&format!("{start}a")),
            None => is_dns_label(&probe),
        };
        if !ok {
            return Err(format!(
                "allowedMemberNamespaces {list:?}: entry {entry:?} is neither a namespace name nor a name's start followed by '*' (entries are comma-separated; {HOST_NAMESPACE_VAR} stands for the host claim's namespace)"
            ));
        }
    }
    Ok(())
}

/// Whether `namespace` is one `allowedMemberNamespaces` lets in, for a
/// claim of host namespace `host_ns`.
pub fn namespace_allowed(list: &str, namespace: &str, host_ns: Option<&str>) -> bool {
    list.split(',').map(str::trim).any(|entry| {
        if entry.contains(HOST_NAMESPACE_VAR) && host_ns.is_none() {
            return false;
        }
        let entry = entry.replace(HOST_NAMESPACE_VAR, host_ns.unwrap_or_default());
        match entry.strip_suffix('*') {
            Some(start) => namespace.starts_with(start),
            None => namespace == entry,
        }
    })
}

/// The namespace and name of a new volume's member PVC (see
/// `VolumeParams::member_namespace` and `member_claim_name`).
pub fn member_claim(params: &VolumeParams, uuid: &str) -> CsiResult<(String, String)> {
    let bad = |what: String| CsiError::invalid("parameters", what);
    if let Some(ns) = params.pvc_namespace.as_deref() {
        if !is_dns_label(ns) {
            return Err(bad(format!(
                "csi.storage.k8s.io/pvc/namespace {ns:?} is not a valid namespace name"
            )));
        }
    }
    if let Some(name) = params.pvc_name.as_deref() {
        if !is_dns_subdomain(name) {
            return Err(bad(format!(
                "csi.storage.k8s.io/pvc/name {name:?} is not a valid PersistentVolumeClaim name"
            )));
        }
    }
    let host_ns = params.pvc_namespace.as_deref();
    let namespace = match (params.member_namespace.as_deref(), host_ns) {
        (Some(t), _) if !t.contains(HOST_NAMESPACE_VAR) => t.to_string(),
        (Some(t), Some(ns)) => t.replace(HOST_NAMESPACE_VAR, ns),
        (Some(t), None) => {
            return Err(bad(format!(
                "memberNamespace {t:?} uses {HOST_NAMESPACE_VAR}, but the request carries no csi.storage.k8s.io/pvc/namespace (run external-provisioner with --extra-create-metadata)"
            )))
        }
        (None, Some(ns)) => ns.to_string(),
        (None, None) => DEFAULT_NAMESPACE.to_string(),
    };
    if !is_dns_label(&namespace) {
        return Err(bad(format!(
            "memberNamespace {:?} gives {namespace:?} for this claim, which is not a valid namespace name (at most 63 characters)",
            params.member_namespace.as_deref().unwrap_or_default()
        )));
    }
    if let Some(list) = params.allowed_member_namespaces.as_deref() {
        if !namespace_allowed(list, &namespace, host_ns) {
            let from = match (params.member_namespace.as_deref(), host_ns) {
                (Some(t), Some(ns)) => format!("memberNamespace {t:?} for host namespace {ns:?}"),
                (Some(t), None) => format!("memberNamespace {t:?}"),
                (None, Some(ns)) => format!("the host claim's namespace {ns:?}"),
                (None, None) => format!("the default {DEFAULT_NAMESPACE:?}"),
            };
            return Err(bad(format!(
                "member namespace {namespace:?} (from {from}) is not in the StorageClass's allowedMemberNamespaces {list:?}: no member claim was made"
            )));
        }
    }
    let pvc = match (params.member_claim_name, params.pvc_name.as_deref()) {
        (Some(ClaimNaming::Generated), _) | (_, None) => pvc_name(uuid),
        (_, Some(host)) => host.to_string(),
    };
    Ok((namespace, pvc))
}

/// The member VolumeSnapshot of a snapshot id (`snap-<uuid>`).
pub fn snapshot_name(snapshot_id: &str) -> String {
    let name = format!("relay-{snapshot_id}");
    if is_dns_subdomain(&name) {
        name
    } else {
        format!("relay-snap-{:016x}", fnv64(snapshot_id))
    }
}

/// The member VolumeSnapshot holding a snapshot's data: the one the member
/// named (a snapshot of a member VolumeGroupSnapshot), or the relay's own.
pub fn member_snapshot_of(snap: &crate::domain::volume::Snapshot) -> String {
    snap.member_snapshot
        .clone()
        .unwrap_or_else(|| snapshot_name(&snap.id))
}

/// The member VolumeGroupSnapshot of a group snapshot id (`group-<uuid>`).
pub fn group_snapshot_name(group_id: &str) -> String {
    let name = format!("relay-{group_id}");
    if is_dns_subdomain(&name) {
        name
    } else {
        format!("relay-group-{:016x}", fnv64(group_id))
    }
}

/// The member VolumeAttachment of one volume on one member node.
pub fn attachment_name(volume_uuid: &str, member_node: &str) -> String {
    format!("relay-{volume_uuid}-{:016x}", fnv64(member_node))
}

/// Where a member volume lives, from its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberVolume {
    pub member: String,
    pub namespace: String,
    pub pvc: String,
    pub uuid: String,
    pub selected_node: Option<String>,
    /// The uid of the claim the relay made, where the record keeps it.
    pub claim_uid: Option<String>,
}

impl MemberVolume {
    pub fn of(vol: &Volume) -> CsiResult<Self> {
        let Backing::Member {
            member,
            namespace,
            pvc,
            selected_node,
            claim_uid,
        } = &vol.backing
        else {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {:?} is not a member-cluster volume (inline ephemeral volumes are not supported by the member backend)",
                vol.id
            )));
        };
        let uuid = parse_volume_id(&vol.id)
            .map(|(_, u)| u.to_string())
            .ok_or_else(|| CsiError::Internal(format!("{:?} is not a member volume id", vol.id)))?;
        Ok(MemberVolume {
            member: member.clone(),
            namespace: namespace.clone(),
            pvc: pvc.clone(),
            uuid,
            selected_node: selected_node.clone(),
            claim_uid: claim_uid.clone(),
        })
    }

    pub fn pvc_path(&self) -> String {
        format!("{}/{}", self.namespace, self.pvc)
    }
}

/// Labels every member object of this volume carries.
pub fn labels(uuid: &str) -> BTreeMap<String, String> {
    [
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (VOLUME_UUID_LABEL.to_string(), uuid.to_string()),
    ]
    .into()
}

/// Labels and annotations of a member PVC: the way back to the host volume.
pub fn pvc_metadata(
    vol: &Volume,
    uuid: &str,
    params: &VolumeParams,
    driver_name: &str,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = labels(uuid);
    let mut annotations: BTreeMap<String, String> = [
        (VOLUME_ID_ANNOTATION.to_string(), vol.id.clone()),
        (VOLUME_NAME_ANNOTATION.to_string(), vol.name.clone()),
        (DRIVER_ANNOTATION.to_string(), driver_name.to_string()),
    ]
    .into();
    for (key, value) in [
        (HOST_PVC_NAME, &params.pvc_name),
        (HOST_PVC_NAMESPACE, &params.pvc_namespace),
        (HOST_PV_NAME, &params.pv_name),
    ] {
        let Some(value) = value else { continue };
        annotations.insert(key.to_string(), value.clone());
        if key != HOST_PV_NAME && is_label_value(value) {
            labels.insert(key.to_string(), value.clone());
        }
    }
    (labels, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_member_namespaces_limit_where_claims_land() {
        let params = |template: Option<&str>, host: Option<&str>, list: &str| VolumeParams {
            member_namespace: template.map(str::to_string),
            pvc_namespace: host.map(str::to_string),
            allowed_member_namespaces: Some(list.to_string()),
            ..Default::default()
        };
        let lands = |p: &VolumeParams| member_claim(p, "0123").map(|(ns, _)| ns);
        assert_eq!(
            lands(&params(None, Some("team-a"), "team-*, shared")).unwrap(),
            "team-a"
        );
        assert_eq!(
            lands(&params(
                Some("${pvc.namespace}-m1"),
                Some("web"),
                "${pvc.namespace}-m1"
            ))
            .unwrap(),
            "web-m1"
        );
        assert_eq!(
            lands(&params(Some("shared"), Some("x"), "*")).unwrap(),
            "shared"
        );
        let refused = lands(&params(None, Some("kube-system"), "team-*,shared")).unwrap_err();
        let CsiError::Invalid { field, reason: msg } = refused else {
            panic!("want INVALID_ARGUMENT, got {refused:?}");
        };
        assert_eq!(field, "parameters");
        assert!(
            msg.contains("\"kube-system\"")
                && msg.contains("allowedMemberNamespaces \"team-*,shared\"")
                && msg.contains("host claim's namespace"),
            "{msg}"
        );
        // A prefix entry lets in what starts so, nothing else.
        assert!(lands(&params(None, Some("teamx"), "team-*")).is_err());
        // ${pvc.namespace} without the host namespace matches nothing.
        assert!(lands(&params(Some("fixed"), None, "${pvc.namespace}")).is_err());

        for ok in [
            "a",
            "team-*",
            "*",
            "${pvc.namespace}",
            "${pvc.namespace}-m1, shared-*",
        ] {
            assert!(check_allowed_namespaces(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a,,b", "Team", "a*b*", "-*", "a b", "x/../y"] {
            let why = check_allowed_namespaces(bad).unwrap_err();
            assert!(why.contains("allowedMemberNamespaces"), "{bad}: {why}");
        }
    }

    #[test]
    fn volume_ids_round_trip_and_stay_short() {
        let uuid = uuid::Uuid::new_v4();
        let member = "a".repeat(MAX_MEMBER_NAME);
        let id = volume_id(&member, &uuid);
        assert!(id.len() <= 128, "{}", id.len());
        let hex = uuid.simple().to_string();
        assert_eq!(parse_volume_id(&id), Some((member.as_str(), hex.as_str())));
        let id = volume_id("us-east-1", &uuid);
        assert_eq!(
            parse_volume_id(&id),
            Some(("us-east-1", hex.as_str())),
            "members may contain dashes"
        );
        for bad in [
            "vol-abc",
            "m-east",
            "m-east-XYZ",
            "m--0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(parse_volume_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_are_deterministic_and_valid() {
        let uuid = "0123456789abcdef0123456789abcdef";
        assert_eq!(pvc_name(uuid), "relay-0123456789abcdef0123456789abcdef");
        assert!(is_dns_subdomain(&pvc_name(uuid)));
        let a = attachment_name(uuid, "worker-1");
        assert_eq!(a, attachment_name(uuid, "worker-1"));
        assert_ne!(a, attachment_name(uuid, "worker-2"));
        assert!(is_dns_subdomain(&a) && a.len() <= 63, "{a}");
        assert_eq!(snapshot_name("snap-abc"), "relay-snap-abc");
        let odd = snapshot_name("Snap_X");
        assert!(is_dns_subdomain(&odd), "{odd}");
        assert_eq!(fnv64(""), 0xcbf2_9ce4_8422_2325, "FNV offset basis");
        assert_eq!(fnv64("a"), 0xaf63_dc4c_8601_ec8c, "FNV-1a test vector");
    }

    #[test]
    fn label_values_are_checked() {
        assert!(is_label_value("data-0"));
        assert!(is_label_value(""));
        assert!(!is_label_value("-x"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(!is_label_value("a/b"));
    }
}
