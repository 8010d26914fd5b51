//! What the node side mounts for a member volume: the member PV's source,
//! carried from ControllerPublishVolume to NodeStageVolume in the
//! publish_context (a flat string map, at most 4 KiB by the CSI spec).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::domain::error::{CsiError, CsiResult};

const P: &str = "relay.csi.dev/";
pub const SOURCE_TYPE: &str = "relay.csi.dev/source-type";
pub const MEMBER: &str = "relay.csi.dev/member";
pub const MEMBER_PV: &str = "relay.csi.dev/member-pv";
/// volume_context: the member PVC's namespace and name.
pub const MEMBER_NAMESPACE: &str = "relay.csi.dev/member-namespace";
pub const MEMBER_PVC: &str = "relay.csi.dev/member-pvc";
pub const MEMBER_NODE: &str = "relay.csi.dev/member-node";
pub const READONLY: &str = "relay.csi.dev/readonly";
/// JSON array of the member PV's mountOptions.
pub const MOUNT_OPTIONS: &str = "relay.csi.dev/mount-options";
pub const NFS_SERVER: &str = "relay.csi.dev/nfs-server";
pub const NFS_PATH: &str = "relay.csi.dev/nfs-path";
pub const HOST_PATH: &str = "relay.csi.dev/host-path";
pub const HOST_PATH_TYPE: &str = "relay.csi.dev/host-path-type";
pub const LOCAL_PATH: &str = "relay.csi.dev/local-path";
pub const FS_TYPE: &str = "relay.csi.dev/fs-type";
pub const CSI_DRIVER: &str = "relay.csi.dev/csi-driver";
pub const CSI_VOLUME_HANDLE: &str = "relay.csi.dev/csi-volume-handle";
/// JSON object of the member PV's csi.volumeAttributes.
pub const CSI_VOLUME_ATTRIBUTES: &str = "relay.csi.dev/csi-volume-attributes";
/// JSON object: the member VolumeAttachment's attachmentMetadata (the member
/// driver's own publish_context).
pub const CSI_PUBLISH_CONTEXT: &str = "relay.csi.dev/csi-publish-context";
/// `namespace/name` of the member Secret the member driver's NodeStage and
/// NodePublish need (the member PV's nodeStageSecretRef/nodePublishSecretRef).
/// Only the reference travels; the node plugin reads the Secret itself.
pub const CSI_STAGE_SECRET: &str = "relay.csi.dev/csi-stage-secret";
pub const CSI_PUBLISH_SECRET: &str = "relay.csi.dev/csi-publish-secret";
/// The member VolumeAttachment csi-relay created for this node.
pub const MEMBER_ATTACHMENT: &str = "relay.csi.dev/member-attachment";

/// The kind of storage behind a member PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    Nfs {
        server: String,
        path: String,
    },
    HostPath {
        path: String,
        type_: Option<String>,
    },
    Local {
        path: String,
        fs_type: Option<String>,
    },
    Csi {
        driver: String,
        volume_handle: String,
        fs_type: Option<String>,
        volume_attributes: BTreeMap<String, String>,
        /// The member VolumeAttachment's attachmentMetadata, when attached.
        publish_context: BTreeMap<String, String>,
        /// The member VolumeAttachment's name, when csi-relay made one.
        attachment: Option<String>,
        /// `namespace/name` of the member PV's nodeStageSecretRef.
        stage_secret: Option<String>,
        /// `namespace/name` of the member PV's nodePublishSecretRef.
        publish_secret: Option<String>,
    },
}

/// `namespace/name` of a Secret reference, checked.
fn secret_ref(
    r: Option<&k8s_openapi::api::core::v1::SecretReference>,
) -> CsiResult<Option<String>> {
    let Some(r) = r else { return Ok(None) };
    let (ns, name) = (
        r.namespace.as_deref().unwrap_or("default"),
        r.name.as_deref().unwrap_or_default(),
    );
    check_secret_ref(&format!("{ns}/{name}")).map(Some)
}

/// Validates `namespace/name`: a context is editable input.
pub fn check_secret_ref(value: &str) -> CsiResult<String> {
    match value.split_once('/') {
        Some((ns, name))
            if crate::domain::validate::is_dns_label(ns)
                && crate::domain::validate::is_dns_subdomain(name) =>
        {
            Ok(value.to_string())
        }
        _ => Err(CsiError::invalid(
            "publish_context",
            format!("{value:?} is not a namespace/name Secret reference"),
        )),
    }
}

impl SourceKind {
    /// The `source-type` value: nfs | hostPath | local | csi.
    pub fn name(&self) -> &'static str {
        match self {
            SourceKind::Nfs { .. } => "nfs",
            SourceKind::HostPath { .. } => "hostPath",
            SourceKind::Local { .. } => "local",
            SourceKind::Csi { .. } => "csi",
        }
    }
}

/// A member PV as the node side needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSource {
    pub member: String,
    pub pv: String,
    /// The member node the host node stands for, when it maps to one.
    pub member_node: Option<String>,
    pub read_only: bool,
    pub mount_options: Vec<String>,
    pub kind: SourceKind,
}

fn refuse(pv: &str, member: &str, why: impl std::fmt::Display) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "member cluster {member}: PersistentVolume {pv} {why}"
    ))
}

/// A hostPath or local PV is a directory on one member node's disk: it is
/// only that volume on the machine of that node. So it is relayed only when
/// the PV's required node affinity names the member node this host node
/// stands for (by `kubernetes.io/hostname` or `metadata.name`); any other
/// node would bind a directory of the same name on the wrong disk.
fn pinned_to(
    spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec,
    pv: &str,
    member: &str,
    member_node: Option<&str>,
) -> CsiResult<()> {
    let terms = spec
        .node_affinity
        .as_ref()
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    let names = |node: &str| {
        terms.iter().any(|t| {
            let exprs = t
                .match_expressions
                .iter()
                .flatten()
                .map(|e| (e, "kubernetes.io/hostname"));
            let fields = t
                .match_fields
                .iter()
                .flatten()
                .map(|e| (e, "metadata.name"));
            let mut all = exprs.chain(fields).peekable();
            all.peek().is_some()
                && all.all(|(e, key)| {
                    e.key == key
                        && e.operator == "In"
                        && e.values.iter().flatten().any(|v| v == node)
                })
        })
    };
    // The member nodes the affinity names, for a message that says where
    // the directory is; the affinity itself when it names none plainly.
    let holders: Vec<&str> = terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten().map(String::as_str))
        .collect();
    let on = if terms.is_empty() {
        "on one member node's disk, with no node affinity to say which".to_string()
    } else if holders.is_empty() {
        format!(
            "with node affinity {}",
            serde_json::to_string(terms).unwrap_or_else(|_| "(unreadable)".into())
        )
    } else {
        format!("on the disk of member node {}", holders.join(" or "))
    };
    let label = crate::domain::topology::TOPOLOGY_MEMBER_NODE_KEY;
    let fix = match holders.as_slice() {
        [one] => format!("run the pod on a host node that stands for {one} (label {label}={one})"),
        _ => format!("run the pod on a host node that stands for that member node (label {label})"),
    };
    match member_node {
        Some(node) if names(node) => Ok(()),
        Some(node) => Err(refuse(
            pv,
            member,
            format!(
                "is a directory {on}; this host node stands for member node {node}, where it is not: {fix}"
            ),
        )),
        None => Err(refuse(
            pv,
            member,
            format!(
                "is a directory {on}; this host node stands for no member node, so it cannot reach it: {fix}"
            ),
        )),
    }
}

impl MemberSource {
    /// Describes a bound member PV; FAILED_PRECONDITION for a source type
    /// csi-relay cannot relay.
    pub fn from_pv(
        member: &str,
        pv: &PersistentVolume,
        member_node: Option<&str>,
    ) -> CsiResult<Self> {
        Self::described(member, pv, member_node, true)
    }

    /// A PV of storage its class declares shared (`sharedWith`): a
    /// hostPath or local directory is on a filesystem every node of the
    /// member mounts, so it is not pinned to the node its affinity names.
    pub fn from_shared_pv(
        member: &str,
        pv: &PersistentVolume,
        member_node: Option<&str>,
    ) -> CsiResult<Self> {
        Self::described(member, pv, member_node, false)
    }

    fn described(
        member: &str,
        pv: &PersistentVolume,
        member_node: Option<&str>,
        on_one_node: bool,
    ) -> CsiResult<Self> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let spec = pv
            .spec
            .as_ref()
            .ok_or_else(|| refuse(&name, member, "has no spec"))?;
        let mut read_only = false;
        let kind = if let Some(nfs) = &spec.nfs {
            read_only = nfs.read_only.unwrap_or(false);
            SourceKind::Nfs {
                server: nfs.server.clone(),
                path: nfs.path.clone(),
            }
        } else if let Some(hp) = &spec.host_path {
            SourceKind::HostPath {
                path: hp.path.clone(),
                type_: hp.type_.clone().filter(|t| !t.is_empty()),
            }
        } else if let Some(local) = &spec.local {
            SourceKind::Local {
                path: local.path.clone(),
                fs_type: local.fs_type.clone().filter(|t| !t.is_empty()),
            }
        } else if let Some(csi) = &spec.csi {
            read_only = csi.read_only.unwrap_or(false);
            SourceKind::Csi {
                driver: csi.driver.clone(),
                volume_handle: csi.volume_handle.clone(),
                fs_type: csi.fs_type.clone().filter(|t| !t.is_empty()),
                volume_attributes: csi.volume_attributes.clone().unwrap_or_default(),
                stage_secret: secret_ref(csi.node_stage_secret_ref.as_ref())?,
                publish_secret: secret_ref(csi.node_publish_secret_ref.as_ref())?,
                publish_context: BTreeMap::new(),
                attachment: None,
            }
        } else {
            return Err(refuse(
                &name,
                member,
                "has a source csi-relay cannot relay (supported: nfs, hostPath, local, csi)",
            ));
        };
        if on_one_node && matches!(kind, SourceKind::HostPath { .. } | SourceKind::Local { .. }) {
            pinned_to(spec, &name, member, member_node)?;
        }
        Ok(MemberSource {
            member: member.to_string(),
            pv: name,
            member_node: member_node.map(str::to_string),
            read_only,
            mount_options: spec.mount_options.clone().unwrap_or_default(),
            kind,
        })
    }

    /// The publish_context entries.
    pub fn to_context(&self) -> CsiResult<BTreeMap<String, String>> {
        let mut c = BTreeMap::new();
        c.insert(SOURCE_TYPE.to_string(), self.kind.name().to_string());
        c.insert(MEMBER.to_string(), self.member.clone());
        c.insert(MEMBER_PV.to_string(), self.pv.clone());
        if let Some(n) = &self.member_node {
            c.insert(MEMBER_NODE.to_string(), n.clone());
        }
        if self.read_only {
            c.insert(READONLY.to_string(), "true".into());
        }
        if !self.mount_options.is_empty() {
            c.insert(MOUNT_OPTIONS.to_string(), json(&self.mount_options)?);
        }
        match &self.kind {
            SourceKind::Nfs { server, path } => {
                c.insert(NFS_SERVER.to_string(), server.clone());
                c.insert(NFS_PATH.to_string(), path.clone());
            }
            SourceKind::HostPath { path, type_ } => {
                c.insert(HOST_PATH.to_string(), path.clone());
                if let Some(t) = type_ {
                    c.insert(HOST_PATH_TYPE.to_string(), t.clone());
                }
            }
            SourceKind::Local { path, fs_type } => {
                c.insert(LOCAL_PATH.to_string(), path.clone());
                if let Some(f) = fs_type {
                    c.insert(FS_TYPE.to_string(), f.clone());
                }
            }
            SourceKind::Csi {
                driver,
                volume_handle,
                fs_type,
                volume_attributes,
                publish_context,
                attachment,
                stage_secret,
                publish_secret,
            } => {
                for (key, value) in [
                    (CSI_STAGE_SECRET, stage_secret),
                    (CSI_PUBLISH_SECRET, publish_secret),
                ] {
                    if let Some(v) = value {
                        c.insert(key.to_string(), v.clone());
                    }
                }
                c.insert(CSI_DRIVER.to_string(), driver.clone());
                c.insert(CSI_VOLUME_HANDLE.to_string(), volume_handle.clone());
                if let Some(f) = fs_type {
                    c.insert(FS_TYPE.to_string(), f.clone());
                }
                if !volume_attributes.is_empty() {
                    c.insert(CSI_VOLUME_ATTRIBUTES.to_string(), json(volume_attributes)?);
                }
                if !publish_context.is_empty() {
                    c.insert(CSI_PUBLISH_CONTEXT.to_string(), json(publish_context)?);
                }
                if let Some(a) = attachment {
                    c.insert(MEMBER_ATTACHMENT.to_string(), a.clone());
                }
            }
        }
        let size: usize = c.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > crate::domain::validate::MAX_MAP_BYTES {
            return Err(CsiError::FailedPrecondition(format!(
                "member cluster {}: the description of PersistentVolume {} takes {size} bytes, more than the {} bytes a CSI publish_context may hold",
                self.member,
                self.pv,
                crate::domain::validate::MAX_MAP_BYTES
            )));
        }
        Ok(c)
    }

    /// Whether this map describes a member volume at all.
    pub fn present<S: std::hash::BuildHasher>(
        context: &std::collections::HashMap<String, String, S>,
    ) -> bool {
        context.contains_key(SOURCE_TYPE)
    }

    /// Decodes a publish_context written by [`MemberSource::to_context`];
    /// INVALID_ARGUMENT naming the missing or malformed key.
    pub fn from_context<'a>(
        context: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> CsiResult<Self> {
        let c: BTreeMap<&str, &str> = context
            .into_iter()
            .filter(|(k, _)| k.starts_with(P))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let get = |key: &'static str| -> CsiResult<String> {
            c.get(key)
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string())
                .ok_or_else(|| CsiError::invalid("publish_context", format!("{key} is missing")))
        };
        let opt = |key: &str| c.get(key).map(|v| v.to_string());
        fn parse<T: serde::de::DeserializeOwned>(
            c: &BTreeMap<&str, &str>,
            key: &'static str,
        ) -> CsiResult<Option<T>> {
            c.get(key)
                .map(|v| {
                    serde_json::from_str(v).map_err(|e| {
                        CsiError::invalid("publish_context", format!("{key} is not valid: {e}"))
                    })
                })
                .transpose()
        }
        let kind = match get(SOURCE_TYPE)?.as_str() {
            "nfs" => SourceKind::Nfs {
                server: get(NFS_SERVER)?,
                path: get(NFS_PATH)?,
            },
            "hostPath" => SourceKind::HostPath {
                path: get(HOST_PATH)?,
                type_: opt(HOST_PATH_TYPE),
            },
            "local" => SourceKind::Local {
                path: get(LOCAL_PATH)?,
                fs_type: opt(FS_TYPE),
            },
            "csi" => SourceKind::Csi {
                driver: get(CSI_DRIVER)?,
                volume_handle: get(CSI_VOLUME_HANDLE)?,
                fs_type: opt(FS_TYPE),
                volume_attributes: parse(&c, CSI_VOLUME_ATTRIBUTES)?.unwrap_or_default(),
                publish_context: parse(&c, CSI_PUBLISH_CONTEXT)?.unwrap_or_default(),
                attachment: opt(MEMBER_ATTACHMENT),
                stage_secret: opt(CSI_STAGE_SECRET)
                    .map(|v| check_secret_ref(&v))
                    .transpose()?,
                publish_secret: opt(CSI_PUBLISH_SECRET)
                    .map(|v| check_secret_ref(&v))
                    .transpose()?,
            },
            other => {
                return Err(CsiError::invalid(
                    "publish_context",
                    format!("{SOURCE_TYPE} {other:?} is not one of nfs, hostPath, local, csi"),
                ))
            }
        };
        Ok(MemberSource {
            member: get(MEMBER)?,
            pv: get(MEMBER_PV)?,
            member_node: opt(MEMBER_NODE),
            read_only: opt(READONLY).as_deref() == Some("true"),
            mount_options: parse(&c, MOUNT_OPTIONS)?.unwrap_or_default(),
            kind,
        })
    }
}

fn json<T: serde::Serialize>(value: &T) -> CsiResult<String> {
    serde_json::to_string(value)
        .map_err(|e| CsiError::Internal(format!("encode publish_context: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;
    use k8s_openapi::api::core::v1::PersistentVolume;

    fn pv(spec: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn round_trip(s: &MemberSource) {
        let ctx = s.to_context().unwrap();
        assert_eq!(&MemberSource::from_context(&ctx).unwrap(), s);
    }

    #[test]
    fn nfs_source() {
        let s = MemberSource::from_pv(
            "east",
            &pv(serde_json::json!({
                "nfs": {"server": "10.0.0.5", "path": "/exports/a", "readOnly": true},
                "mountOptions": ["nfsvers=4.1"],
            })),
            None,
        )
        .unwrap();
        let ctx = s.to_context().unwrap();
        assert_eq!(ctx[SOURCE_TYPE], "nfs");
        assert_eq!(ctx[NFS_SERVER], "10.0.0.5");
        assert_eq!(ctx[NFS_PATH], "/exports/a");
        assert_eq!(ctx[READONLY], "true");
        assert_eq!(ctx[MOUNT_OPTIONS], r#"["nfsvers=4.1"]"#);
        assert_eq!(ctx[MEMBER_PV], "pv-1");
        round_trip(&s);
    }

    #[test]
    fn host_path_and_local_sources() {
        let pinned = |source: serde_json::Value, node: &str| {
            let mut spec = source;
            spec["nodeAffinity"] = serde_json::json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}});
            pv(spec)
        };
        let host_path =
            serde_json::json!({"hostPath": {"path": "/data/x", "type": "DirectoryOrCreate"}});
        // On the wrong node, unpinned, or unmapped: the wrong disk, refused.
        for (p, node) in [
            (pinned(host_path.clone(), "worker-2"), Some("worker-1")),
            (pv(host_path.clone()), Some("worker-1")),
            (pinned(host_path.clone(), "worker-1"), None),
        ] {
            let err = MemberSource::from_pv("east", &p, node).unwrap_err();
            assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
            let text = err.to_string();
            assert!(text.contains("is a directory "), "{text}");
            assert!(
                text.contains("run the pod on a host node that stands for"),
                "{text}"
            );
        }
        let err = MemberSource::from_pv(
            "east",
            &pinned(host_path.clone(), "worker-2"),
            Some("worker-1"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "member cluster east: PersistentVolume pv-1 is a directory on the disk of member node worker-2; \
             this host node stands for member node worker-1, where it is not: run the pod on a host node \
             that stands for worker-2 (label topology.relay.csi.dev/member-node=worker-2)"
        );
        let err = MemberSource::from_pv("east", &pv(host_path.clone()), None).unwrap_err();
        assert!(
            err.to_string().contains(
                "is a directory on one member node's disk, with no node affinity to say which; \
                 this host node stands for no member node"
            ),
            "{err}"
        );
        let s = MemberSource::from_pv("east", &pinned(host_path, "worker-1"), Some("worker-1"))
            .unwrap();
        let ctx = s.to_context().unwrap();
        assert_eq!(ctx[SOURCE_TYPE], "hostPath");
        assert_eq!(ctx[HOST_PATH], "/data/x");
        assert_eq!(ctx[HOST_PATH_TYPE], "DirectoryOrCreate");
        assert_eq!(ctx[MEMBER_NODE], "worker-1");
        round_trip(&s);
        let s = MemberSource::from_pv(
            "east",
            &pinned(
                serde_json::json!({"local": {"path": "/mnt/disk1", "fsType": "xfs"}}),
                "worker-1",
            ),
            Some("worker-1"),
        )
        .unwrap();
        assert_eq!(s.to_context().unwrap()[LOCAL_PATH], "/mnt/disk1");
        round_trip(&s);
    }

    // Only references to the member driver's node Secrets travel, checked
    // both ways; the values are read by the node plugin.
    #[test]
    fn csi_node_secret_references_travel_not_secrets() {
        let s = MemberSource::from_pv(
            "east",
            &pv(serde_json::json!({"csi": {
                "driver": "rbd.csi.ceph.com", "volumeHandle": "h",
                "nodeStageSecretRef": {"name": "ceph-node", "namespace": "ceph"},
                "nodePublishSecretRef": {"name": "pub"}}})),
            None,
        )
        .unwrap();
        let ctx = s.to_context().unwrap();
        assert_eq!(ctx[CSI_STAGE_SECRET], "ceph/ceph-node");
        assert_eq!(ctx[CSI_PUBLISH_SECRET], "default/pub");
        round_trip(&s);
        for bad in ["../etc", "ns/../x", "Bad_NS/x", "no-slash"] {
            let mut edited = ctx.clone();
            edited.insert(CSI_STAGE_SECRET.to_string(), bad.to_string());
            let err = MemberSource::from_context(&edited).unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{bad}: {err}");
        }
    }

    #[test]
    fn csi_source_carries_attributes_as_json() {
        let mut s = MemberSource::from_pv(
            "east",
            &pv(serde_json::json!({"csi": {
                "driver": "ebs.csi.aws.com", "volumeHandle": "vol-123", "fsType": "ext4",
                "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "x"}
            }})),
            Some("worker-1"),
        )
        .unwrap();
        if let SourceKind::Csi {
            publish_context,
            attachment,
            ..
        } = &mut s.kind
        {
            publish_context.insert("devicePath".into(), "/dev/xvdba".into());
            *attachment = Some("relay-x".into());
        }
        let ctx = s.to_context().unwrap();
        assert_eq!(ctx[SOURCE_TYPE], "csi");
        assert_eq!(ctx[CSI_DRIVER], "ebs.csi.aws.com");
        assert_eq!(ctx[CSI_VOLUME_HANDLE], "vol-123");
        assert_eq!(ctx[FS_TYPE], "ext4");
        assert_eq!(
            ctx[CSI_VOLUME_ATTRIBUTES],
            r#"{"storage.kubernetes.io/csiProvisionerIdentity":"x"}"#
        );
        assert_eq!(ctx[CSI_PUBLISH_CONTEXT], r#"{"devicePath":"/dev/xvdba"}"#);
        assert_eq!(ctx[MEMBER_ATTACHMENT], "relay-x");
        round_trip(&s);
    }

    #[test]
    fn unsupported_or_oversized_sources_are_refused() {
        let err = MemberSource::from_pv(
            "east",
            &pv(serde_json::json!({"iscsi": {"targetPortal": "x", "iqn": "y", "lun": 0}})),
            None,
        )
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.to_string().contains("member cluster east"), "{err}");
        let big: BTreeMap<String, String> = (0..100)
            .map(|i| (format!("key-{i}"), "v".repeat(50)))
            .collect();
        let s = MemberSource::from_pv(
            "east",
            &pv(serde_json::json!({"csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": big}})),
            None,
        )
        .unwrap();
        assert_eq!(
            s.to_context().unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn bad_contexts_name_the_key() {
        let ctx: BTreeMap<String, String> = [
            (SOURCE_TYPE.to_string(), "nfs".to_string()),
            (MEMBER.to_string(), "east".to_string()),
            (MEMBER_PV.to_string(), "pv".to_string()),
            (NFS_SERVER.to_string(), "s".to_string()),
        ]
        .into();
        let err = MemberSource::from_context(&ctx).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains(NFS_PATH), "{err}");
        let mut ctx = ctx;
        ctx.insert(SOURCE_TYPE.into(), "iscsi".into());
        assert!(MemberSource::from_context(&ctx)
            .unwrap_err()
            .to_string()
            .contains("iscsi"));
    }
}
