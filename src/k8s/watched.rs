//! The member objects as the observation reads them off the wire: only the
//! fields member-side state needs. serde skips everything else without
//! building it (managedFields, a node's image list, a pod's containers), so
//! a watch event costs a parse, never the allocation of a full object.
//!
//! Each type stands for its Kubernetes kind on the API (`k8s_openapi`'s
//! `Resource` and `Metadata`), so `Api` and `watcher` take it as they would
//! the full type.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use serde::{Deserialize, Deserializer};

/// The metadata fields kept: what identifies the object, what a watch
/// resumes from, and the annotations (claims carry the volume id there).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    annotations: Option<BTreeMap<String, String>>,
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        deletion_timestamp: m.deletion_timestamp,
        annotations: m.annotations,
        ..Default::default()
    })
}

/// Makes `$lite` stand for `$full` on the API.
macro_rules! stands_for {
    ($lite:ident, $full:ty) => {
        impl k8s_openapi::Resource for $lite {
            const API_VERSION: &'static str = <$full as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$full as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$full as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$full as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$full as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $lite {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

#[derive(Clone, Debug, Deserialize)]
pub struct ClaimObject {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<ClaimSpec>,
}
stands_for!(ClaimObject, PersistentVolumeClaim);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSpec {
    pub volume_name: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct VolumeObject {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<VolumeSpec>,
}
stands_for!(VolumeObject, PersistentVolume);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    pub claim_ref: Option<ObjectReference>,
    pub csi: Option<CsiSource>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ObjectReference {
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub uid: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AttachmentObject {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    pub spec: AttachmentSpec,
    #[serde(default)]
    pub status: Option<AttachmentStatus>,
}
stands_for!(AttachmentObject, VolumeAttachment);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentSpec {
    #[serde(default)]
    pub node_name: String,
    #[serde(default)]
    pub source: AttachmentSource,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentSource {
    pub persistent_volume_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct AttachmentStatus {
    #[serde(default)]
    pub attached: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct NodeObject {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<NodeStatus>,
}
stands_for!(NodeObject, Node);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub volumes_in_use: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct PodObject {
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PodSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}
stands_for!(PodObject, Pod);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    pub node_name: Option<String>,
    #[serde(default)]
    pub volumes: Vec<PodVolume>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    pub persistent_volume_claim: Option<ClaimVolumeSource>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimVolumeSource {
    pub claim_name: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodStatus {
    pub phase: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // A full object from the API reads into its slim form: kept fields
    // survive, the rest (managedFields, containers, images) is not built.
    #[test]
    fn full_objects_read_into_their_slim_forms() {
        let pod: PodObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u1",
                         "resourceVersion": "42", "labels": {"app": "web"},
                         "deletionTimestamp": "2026-01-01T00:00:00Z",
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "a", "emptyDir": {}},
                                 {"name": "b", "persistentVolumeClaim": {"claimName": "data"}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-0"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("42"));
        assert!(pod.metadata.deletion_timestamp.is_some());
        assert!(pod.metadata.managed_fields.is_none());
        assert!(pod.metadata.labels.is_none());
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        let claims: Vec<_> = spec
            .volumes
            .iter()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.as_str())
            .collect();
        assert_eq!(claims, ["data"]);
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));

        let node: NodeObject = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"volumesInUse": ["kubernetes.io/csi/d^h"],
                       "images": [{"names": ["busybox"], "sizeBytes": 1}]}
        }))
        .unwrap();
        assert_eq!(
            node.status.unwrap().volumes_in_use,
            ["kubernetes.io/csi/d^h"]
        );

        let va: AttachmentObject = serde_json::from_value(json!({
            "metadata": {"name": "va"},
            "spec": {"attacher": "d", "nodeName": "n1",
                     "source": {"persistentVolumeName": "pv-1"}},
            "status": {"attached": true, "attachmentMetadata": {"k": "v"}}
        }))
        .unwrap();
        assert_eq!(va.spec.node_name, "n1");
        assert!(va.status.unwrap().attached);

        let pv: VolumeObject = serde_json::from_value(json!({
            "metadata": {"name": "pv-1"},
            "spec": {"claimRef": {"namespace": "shop", "name": "data", "uid": "c1"},
                     "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"a": "b"}}}
        }))
        .unwrap();
        let spec = pv.spec.unwrap();
        assert_eq!(spec.csi.unwrap().volume_handle, "h");
        assert_eq!(spec.claim_ref.unwrap().uid.as_deref(), Some("c1"));
    }

    #[test]
    fn slim_types_name_their_kinds_on_the_api() {
        use kube::Resource;
        assert_eq!(PodObject::plural(&()), "pods");
        assert_eq!(NodeObject::kind(&()), "Node");
        assert_eq!(AttachmentObject::api_version(&()), "storage.k8s.io/v1");
        assert_eq!(VolumeObject::plural(&()), "persistentvolumes");
        assert_eq!(ClaimObject::plural(&()), "persistentvolumeclaims");
    }
}
