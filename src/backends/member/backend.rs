//! `MemberBackend`: the `Backend` whose volumes are member-cluster PVCs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;

use crate::backends::member::mobility::{access, import, kosmos_leftovers};
use crate::backends::member::pvc::{self, ClaimPlan, DataSource};
use crate::backends::member::{
    attach, capacity, claim_bound, claim_create, group_snapshot, namespace, snapshot,
};
use crate::backends::{
    Backend, CapacityReport, DataKind, GroupCut, Health, NodeSource, OwnAttachment, Placement,
    SourceData, StoredData,
};
use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::member_source::{self as source, MemberSource, SourceKind};
use crate::domain::params::{
    self, BackingChoice, Flag, GroupSnapshotParams, SnapshotParams, VolumeParams,
};
use crate::domain::sharing::Sharing;
use crate::domain::topology::{TOPOLOGY_MEMBER_KEY, TOPOLOGY_MEMBER_NODE_KEY};
use crate::domain::volume::{Backing, GroupSnapshot, Snapshot, Volume};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::{self, MemberVolume};
use crate::k8s::{nodes, WAIT_BUDGET};

/// How long a member found unreachable answers health checks from memory,
/// so ListVolumes over many volumes does not wait on it once per volume.
const UNREACHABLE_MEMORY: Duration = Duration::from_secs(15);

pub struct MemberBackend {
    members: BTreeMap<String, Cluster>,
    host: Option<Cluster>,
    driver_name: String,
    wait: Duration,
    unreachable: Mutex<HashMap<String, (Instant, String)>>,
    /// Which host nodes are virtual (no kubelet; pods run in a member).
    virtual_nodes: Option<crate::k8s::registrar::NodeSelector>,
    /// Members an operator declared lost for good (`--lost-member`): never
    /// contacted; their volumes can only be unpublished and deleted, which
    /// leaves their member objects where they are.
    lost: std::collections::BTreeSet<String>,
    /// Volume moves in progress (`mobility`), and the image their movers run.
    moves: std::sync::Arc<crate::backends::member::mobility::moving::Moves>,
    mover_image: Option<String>,
    mover_path: crate::backends::member::mobility::moving::MoverPath,
}

fn decode_volume_params(vol: &Volume) -> CsiResult<VolumeParams> {
    let map: HashMap<String, String> = vol.parameters.clone().into_iter().collect();
    params::decode(&map, "parameters")
}

fn sharing_of(params: &VolumeParams) -> CsiResult<Option<Sharing>> {
    Sharing::of(params).map_err(|why| CsiError::invalid("parameters", why))
}

/// Whether the node's attachment of `vol` may write: then the volume is
/// used in one member at a time unless its mode lets many nodes write.
fn writes_alone(vol: &Volume, node_id: &str) -> bool {
    vol.node(node_id)
        .and_then(|n| n.attachment.as_ref())
        .is_some_and(|a| {
            !a.readonly
                && !a.capability.mode.read_only()
                && a.capability.mode != crate::domain::capability::AccessMode::MultiNodeMultiWriter
        })
}

impl MemberBackend {
    /// The member VolumeAttachment the relay made of `at` for host node
    /// `node_id`, found by its labels and the host node it names: an
    /// attachment never made needs neither the node nor its member mapping
    /// (an unmapped node, or one deleted since, must not strand the volume).
    /// One named for another host node may be this one's too (two host
    /// nodes mapped to one member node share it, and it names the first),
    /// as may one of a build that did not name its host node: those are
    /// found by the name the node's current mapping gives.
    async fn attachment_for(
        &self,
        cluster: &Cluster,
        at: &MemberVolume,
        node_id: &str,
    ) -> CsiResult<Option<String>> {
        let ours = attach::of_volume(cluster, &at.uuid).await?;
        if let Some(va) = ours
            .iter()
            .find(|va| attach::host_node(va) == Some(node_id))
        {
            return Ok(va.metadata.name.clone());
        }
        if ours.is_empty() {
            return Ok(None);
        }
        let Some(name) = self.mapped_attachment(cluster, at, node_id).await? else {
            return Ok(None);
        };
        Ok(ours
            .iter()
            .any(|va| va.metadata.name.as_deref() == Some(name.as_str()))
            .then_some(name))
    }

    /// The name of the relay's attachment of `at` for host node `node_id`
    /// by the node's current mapping; none for a virtual node (the member
    /// attaches for its pods), a node gone or mapped to no member node.
    async fn mapped_attachment(
        &self,
        cluster: &Cluster,
        at: &MemberVolume,
        node_id: &str,
    ) -> CsiResult<Option<String>> {
        match nodes::resolve(
            self.host.as_ref(),
            cluster,
            node_id,
            self.virtual_nodes.as_ref(),
        )
        .await
        {
            Ok(nodes::NodePlace {
                member_node: Some(member_node),
                virtual_node: false,
            }) => Ok(Some(naming::attachment_name(&at.uuid, &member_node))),
            Ok(_) | Err(CsiError::NodeNotFound(_)) | Err(CsiError::FailedPrecondition(_)) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Another host node of `vol` that still holds member attachment
    /// `name`: host nodes mapped to one member node share the attachment,
    /// so it goes only when the last of them lets go. A record without the
    /// attachment's name (an attach cut short, a record rebuilt from its
    /// RelayVolume) is matched by the node's mapping.
    async fn other_holder(
        &self,
        cluster: &Cluster,
        vol: &Volume,
        at: &MemberVolume,
        node_id: &str,
        name: &str,
    ) -> CsiResult<Option<String>> {
        for (other, n) in &vol.nodes {
            let Some(a) = n.attachment.as_ref().filter(|_| other != node_id) else {
                continue;
            };
            let holds = if a.publish_context.is_empty() {
                self.mapped_attachment(cluster, at, other).await?.as_deref() == Some(name)
            } else {
                a.publish_context
                    .get(source::MEMBER_ATTACHMENT)
                    .map(String::as_str)
                    == Some(name)
            };
            if holds {
                return Ok(Some(other.clone()));
            }
        }
        Ok(None)
    }
    /// CreateVolume's work: the member PVC, from its source. Returns the
    /// backing with the uid of the claim made (or adopted from an earlier
    /// attempt), the one object the record names from then on.
    async fn create_claim(
        &self,
        vol: &Volume,
        source: Option<SourceData<'_>>,
    ) -> CsiResult<Backing> {
        let at = MemberVolume::of(vol)?;
        let cluster = self.cluster(&at.member)?;
        let params = decode_volume_params(vol)?;
        let params = moves::params_in(&params, sharing_of(&params)?.as_ref(), &at.member);
        let same_place = |what: String, backing: &Backing| -> CsiResult<()> {
            match backing {
                Backing::Member {
                    member, namespace, ..
                } if *member == at.member && *namespace == at.namespace => Ok(()),
                Backing::Member {
                    member, namespace, ..
                } => Err(CsiError::invalid(
                    "volume_content_source",
                    format!(
                        "{what} lives in member cluster {member}, namespace {namespace}; a volume made from it must be provisioned there too, not in {}, namespace {}",
                        at.member, at.namespace
                    ),
                )),
                _ => Err(CsiError::invalid(
                    "volume_content_source",
                    format!("{what} is not a member-cluster object"),
                )),
            }
        };
        let data_source = match source {
            None => None,
            Some(SourceData::Snapshot(snap)) => {
                same_place(format!("snapshot {}", snap.id), &snap.backing)?;
                Some(DataSource::Snapshot(naming::member_snapshot_of(snap)))
            }
            Some(SourceData::Volume(src)) => {
                same_place(format!("volume {}", src.id), &src.backing)?;
                let from = MemberVolume::of(src)?;
                if pvc::owned(cluster, &from, &src.id).await?.is_none() {
                    return Err(CsiError::FailedPrecondition(format!(
                        "{}: PersistentVolumeClaim {} of source volume {} is missing; there is nothing to clone",
                        cluster.label(),
                        from.pvc_path(),
                        src.id
                    )));
                }
                Some(DataSource::Claim(from.pvc))
            }
        };
        let class = match (&params.member_storage_class, &at.selected_node) {
            (Some(name), _) => pvc::storage_class(cluster, Some(name)).await?,
            (None, Some(_)) => pvc::storage_class(cluster, None).await?,
            (None, None) => None,
        };
        let late = class.as_ref().is_some_and(pvc::binds_late);
        let selected_node = match at.selected_node.clone().filter(|_| late) {
            // A gated volume's data claim is never a pod's, so no consumer
            // will ever bind it: the relay sends it to a node of the member
            // (every node there reaches shared storage).
            None if late && access::claim_of(&params, &at).is_some() => {
                access::some_node(cluster).await?
            }
            chosen => chosen,
        };
        let claim = pvc::manifest(&ClaimPlan {
            vol,
            at: &at,
            params: &params,
            data_source,
            selected_node: selected_node.as_deref(),
            driver_name: &self.driver_name,
        });
        if Flag::on(params.create_member_namespace) {
            namespace::ensure(cluster, &at.namespace).await?;
        }
        let made = claim_create::ensure(cluster, &claim, &vol.id).await?;
        let claim_uid = made.metadata.uid.clone();
        tracing::info!(volume_id = %vol.id, member = %at.member, pvc = %at.pvc_path(), uid = ?claim_uid, "member PVC created");
        // The class the member gave a claim that named none: its default.
        let class = match (
            class,
            made.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref()),
        ) {
            (Some(class), _) => Some(class),
            (None, Some(name)) if !name.is_empty() => {
                pvc::storage_class(cluster, Some(name)).await?
            }
            (None, _) => None,
        };
        if class.as_ref().is_some_and(|c| !pvc::binds_late(c)) {
            claim_bound::await_bound(cluster, made, self.wait).await?;
        }
        Ok(Backing::Member {
            member: at.member,
            namespace: at.namespace,
            pvc: at.pvc,
            selected_node: at.selected_node,
            claim_uid,
        })
    }

    /// `host` is where host Nodes are looked up (None: a host node maps to
    /// the member node of the same name only).
    pub fn new(members: Vec<Cluster>, host: Option<Cluster>, driver_name: &str) -> Self {
        MemberBackend {
            members: members
                .into_iter()
                .map(|c| (c.name().to_string(), c))
                .collect(),
            host,
            driver_name: driver_name.to_string(),
            wait: WAIT_BUDGET,
            unreachable: Mutex::new(HashMap::new()),
            virtual_nodes: None,
            lost: Default::default(),
            moves: Default::default(),
            mover_image: None,
            mover_path: Default::default(),
        }
    }

    /// The image the movers of volume moves run (`csi-relay mover`).
    pub fn with_mover_image(mut self, image: Option<String>) -> Self {
        self.mover_image = image;
        self
    }

    /// Which way the movers' bytes may go (`--mover-path`).
    pub fn with_mover_path(
        mut self,
        path: crate::backends::member::mobility::moving::MoverPath,
    ) -> Self {
        self.mover_path = path;
        self
    }

    /// Members declared lost for good (`--lost-member`). Only an
    /// operator's word makes a member lost: one that does not answer is
    /// waited for, however long.
    pub fn with_lost_members(mut self, lost: impl IntoIterator<Item = String>) -> Self {
        self.lost = lost.into_iter().collect();
        self
    }

    fn is_lost(&self, member: &str) -> bool {
        self.lost.contains(member)
    }

    /// Tells virtual nodes apart (`--virtual-node-selector`).
    /// Whether a host kubelet must finish a growth the member left to the
    /// node (NodeExpandVolume through the relay's node plugin): only where a
    /// host node that is not virtual uses the volume. On a virtual node, or
    /// unused, the member's own kubelet grows the filesystem where a member
    /// pod mounts it, and no host kubelet will ever call NodeExpandVolume:
    /// answering "node expansion required" would leave the host claim
    /// resizing for ever. A node that cannot be looked at counts as real.
    async fn host_node_finishes(&self, vol: &Volume) -> CsiResult<bool> {
        for (node_id, record) in &vol.nodes {
            if record.is_empty() {
                continue;
            }
            let virtual_node = match (&self.host, &self.virtual_nodes) {
                (Some(host), Some(selector)) => nodes::host_node(host, node_id)
                    .await?
                    .is_some_and(|n| selector.matches(&n)),
                _ => false,
            };
            if !virtual_node {
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub fn with_virtual_nodes(mut self, selector: crate::k8s::registrar::NodeSelector) -> Self {
        self.virtual_nodes = Some(selector);
        self
    }

    /// Overrides the bound of waits for member objects to converge.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    fn names(&self) -> Vec<&str> {
        self.members.keys().map(String::as_str).collect()
    }

    /// The member, when exactly one is configured.
    fn only_member(&self) -> Option<String> {
        let mut names = self.members.keys();
        match (names.next(), names.next()) {
            (Some(only), None) => Some(only.clone()),
            _ => None,
        }
    }

    fn cluster(&self, name: &str) -> CsiResult<&Cluster> {
        if self.is_lost(name) {
            return Err(CsiError::FailedPrecondition(format!(
                "member cluster {name:?} is declared lost (--lost-member {name}): its volumes can only be unpublished and deleted, which leaves their member objects there"
            )));
        }
        self.members.get(name).ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "member cluster {name:?} is not configured (--member); configured: {:?}",
                self.names()
            ))
        })
    }

    /// The member (and member node) a new volume goes to.
    fn choose(
        &self,
        params: &VolumeParams,
        req: Option<&csi::TopologyRequirement>,
    ) -> CsiResult<(String, Option<String>)> {
        let preferred: Vec<&HashMap<String, String>> = req
            .map(|r| {
                r.preferred
                    .iter()
                    .chain(&r.requisite)
                    .map(|t| &t.segments)
                    .collect()
            })
            .unwrap_or_default();
        let requisite: Vec<&HashMap<String, String>> = req
            .map(|r| r.requisite.iter().map(|t| &t.segments).collect())
            .unwrap_or_default();
        let named: Vec<&String> = preferred
            .iter()
            .filter_map(|s| s.get(TOPOLOGY_MEMBER_KEY))
            .collect();
        let sharing = sharing_of(params)?;
        let configured = named.iter().find(|m| {
            self.members.contains_key(m.as_str()) && sharing.as_ref().is_none_or(|s| s.includes(m))
        });
        let member = match (&params.member, configured, self.only_member()) {
            (Some(m), _, _) => m.clone(),
            (None, Some(m), _) => (*m).clone(),
            (None, None, _) if !named.is_empty() => {
                return Err(CsiError::ResourceExhausted(format!(
                    "the requested topology names member clusters {named:?}, none of which is configured (configured: {:?})",
                    self.names()
                )))
            }
            (None, None, Some(only)) => only,
            (None, None, None) => {
                return Err(CsiError::invalid(
                    "parameters",
                    format!(
                        "member is not set and the accessibility requirements name no member cluster ({TOPOLOGY_MEMBER_KEY}); configured: {:?}",
                        self.names()
                    ),
                ))
            }
        };
        // A shared volume is reachable from every sharing member.
        let accepts = |s: &&HashMap<String, String>| {
            s.get(TOPOLOGY_MEMBER_KEY).is_none_or(|m| {
                m == &member
                    || sharing
                        .as_ref()
                        .is_some_and(|sh| sh.includes(m) && sh.includes(&member))
            })
        };
        if !requisite.is_empty() && !requisite.iter().any(accepts) {
            return Err(CsiError::ResourceExhausted(format!(
                "none of the requisite topologies {requisite:?} can reach member cluster {member}"
            )));
        }
        let member_node = preferred
            .iter()
            .filter(|s| s.get(TOPOLOGY_MEMBER_KEY) == Some(&member))
            .find_map(|s| s.get(TOPOLOGY_MEMBER_NODE_KEY))
            .cloned();
        Ok((member, member_node))
    }

    fn remembered_unreachable(&self, member: &str) -> Option<String> {
        let memory = self.unreachable.lock().ok()?;
        memory
            .get(member)
            .filter(|(at, _)| at.elapsed() < UNREACHABLE_MEMORY)
            .map(|(_, why)| why.clone())
    }

    fn remember_unreachable(&self, member: &str, why: Option<String>) {
        if let Ok(mut memory) = self.unreachable.lock() {
            match why {
                Some(why) => memory.insert(member.to_string(), (Instant::now(), why)),
                None => memory.remove(member),
            };
        }
    }

    /// A Pending member PVC of a WaitForFirstConsumer class binds only once
    /// it knows its node: tell it the one the host node maps to.
    async fn nudge_binding(
        &self,
        cluster: &Cluster,
        at: &MemberVolume,
        claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
        params: &VolumeParams,
        member_node: Option<&str>,
    ) -> CsiResult<()> {
        let Some(node) = member_node else {
            return Ok(());
        };
        if pvc::annotation(claim, naming::SELECTED_NODE_ANNOTATION).is_some() {
            return Ok(());
        }
        let class = pvc::storage_class(cluster, params.member_storage_class.as_deref()).await?;
        if class.as_ref().is_some_and(pvc::binds_late) {
            pvc::select_node(cluster, &at.namespace, &at.pvc, node).await?;
            tracing::info!(pvc = %at.pvc_path(), member = %at.member, node, "member PVC sent to its first consumer's node");
        }
        Ok(())
    }

    /// Detaches what the relay attached for `node_id` in `at.member`.
    async fn detach_in(
        &self,
        vol: &Volume,
        node_id: &str,
        at: &MemberVolume,
        context: Option<&BTreeMap<String, String>>,
    ) -> CsiResult<()> {
        if self.is_lost(&at.member) {
            // Nothing of a lost member can be detached: the host node is
            // released, whatever the member still holds.
            tracing::warn!(volume_id = %vol.id, node_id, member = %at.member, "attachment released: its member cluster is declared lost");
            return Ok(());
        }
        let cluster = self.cluster(&at.member)?;
        let name = match context {
            None => return Ok(()),
            Some(c) if !c.is_empty() => match c.get(source::MEMBER_ATTACHMENT) {
                Some(name) => name.clone(),
                None => return Ok(()), // nothing was attached in the member
            },
            // What was attached is not known: an attach that was refused,
            // failed or cut short, or a record rebuilt from its RelayVolume.
            Some(_) => match self.attachment_for(cluster, at, node_id).await? {
                Some(name) => name,
                None => return Ok(()),
            },
        };
        if let Some(holder) = self.other_holder(cluster, vol, at, node_id, &name).await? {
            tracing::info!(volume_id = %vol.id, node_id, attachment = %name, holder = %holder, "member attachment kept: another host node mapped to the same member node still holds it");
            return Ok(());
        }
        if let Some(other) = attach::shared_with(cluster, &name).await? {
            // The host node is done with the volume; a member pod is not.
            // Ours stays (labelled as the relay's) until that one is gone.
            tracing::info!(volume_id = %vol.id, attachment = %name, other = %other, "member attachment kept: another attachment of the same volume and node is in use");
            return Ok(());
        }
        attach::ensure_detached(cluster, &name, self.wait).await
    }
}

#[async_trait::async_trait]
impl Backend for MemberBackend {
    fn kind(&self) -> &'static str {
        "member"
    }

    /// Ready once configured (start-up checked the settings): an unreachable
    /// member must not make the whole driver fail its liveness probe; calls
    /// against it answer UNAVAILABLE naming it.
    async fn healthy(&self) -> CsiResult<()> {
        Ok(())
    }

    /// Unbounded here: each member cluster enforces its own quotas.
    async fn total_capacity(&self) -> CsiResult<u64> {
        Ok(i64::MAX as u64)
    }

    fn volume_topology(&self) -> Vec<BTreeMap<String, String>> {
        self.members
            .keys()
            .map(|m| [(TOPOLOGY_MEMBER_KEY.to_string(), m.clone())].into())
            .collect()
    }

    fn check_parameters(&self, params: &VolumeParams) -> CsiResult<()> {
        if params.backing != BackingChoice::Auto {
            return Err(CsiError::invalid(
                "parameters",
                "backing configures the local backend; the member backend uses the member StorageClass (memberStorageClass)",
            ));
        }
        if let Some(m) = &params.member {
            if !self.members.contains_key(m) {
                return Err(CsiError::invalid(
                    "parameters",
                    format!(
                        "member {m:?} is not a configured member cluster (--member); configured: {:?}",
                        self.names()
                    ),
                ));
            }
        }
        if let Some(ns) = &params.member_namespace {
            naming::check_namespace_template(ns)
                .map_err(|why| CsiError::invalid("parameters", why))?;
        }
        if let Some(list) = &params.allowed_member_namespaces {
            naming::check_allowed_namespaces(list)
                .map_err(|why| CsiError::invalid("parameters", why))?;
        }
        if let Some(sharing) = sharing_of(params)? {
            let key = if sharing.moves() {
                "movableBetween"
            } else {
                "sharedWith"
            };
            if let Some(m) = sharing.members().find(|m| !self.members.contains_key(*m)) {
                return Err(CsiError::invalid(
                    "parameters",
                    format!(
                        "{key} names member {m:?}, which is not a configured member cluster (--member); configured: {:?}",
                        self.names()
                    ),
                ));
            }
            if let Some(m) = params.member.as_ref().filter(|m| !sharing.includes(m)) {
                return Err(CsiError::invalid(
                    "parameters",
                    format!("member {m:?} is not one of the members {key} lists"),
                ));
            }
            for m in sharing.members() {
                if let Some(class) = sharing.class_in(m).filter(|c| !naming::is_dns_subdomain(c)) {
                    return Err(CsiError::invalid(
                        "parameters",
                        format!("movableBetween gives member {m:?} the class {class:?}, which is not a valid StorageClass name"),
                    ));
                }
            }
        }
        if let Some(sc) = &params.member_storage_class {
            if !naming::is_dns_subdomain(sc) {
                return Err(CsiError::invalid(
                    "parameters",
                    format!("memberStorageClass {sc:?} is not a valid StorageClass name"),
                ));
            }
        }
        Ok(())
    }

    fn check_snapshot_parameters(&self, params: &SnapshotParams) -> CsiResult<()> {
        match &params.member_snapshot_class {
            Some(c) if !naming::is_dns_subdomain(c) => Err(CsiError::invalid(
                "parameters",
                format!("memberSnapshotClass {c:?} is not a valid VolumeSnapshotClass name"),
            )),
            _ => Ok(()),
        }
    }

    fn place(
        &self,
        name: &str,
        params: &VolumeParams,
        caps: &[Capability],
        req: Option<&csi::TopologyRequirement>,
        _source: Option<&Backing>,
    ) -> CsiResult<Placement> {
        self.check_parameters(params)?;
        let (member, selected_node) = self.choose(params, req)?;
        let uuid = naming::volume_uuid(&self.driver_name, name);
        let (namespace, mut pvc) = naming::member_claim(params, &uuid.simple().to_string())?;
        let sharing = sharing_of(params)?;
        if sharing.as_ref().is_some_and(Sharing::moves) && params.pvc_name.is_none() {
            return Err(CsiError::invalid(
                "parameters",
                "a movableBetween class needs the host claim's name (csi.storage.k8s.io/pvc/name): run external-provisioner with --extra-create-metadata",
            ));
        }
        if access::gated(params, caps, sharing.as_ref()) {
            // The data under a name no pod looks for: members reach it
            // through the access claims publish makes (`access`).
            pvc = naming::pvc_name(&uuid.simple().to_string());
        }
        let context = BTreeMap::from([
            (source::MEMBER.to_string(), member.clone()),
            (source::MEMBER_NAMESPACE.to_string(), namespace.clone()),
            (source::MEMBER_PVC.to_string(), pvc.clone()),
        ]);
        // Shared storage is reachable from every sharing member: the host
        // scheduler may place the volume's pods on any of them.
        let mut reach = vec![member.clone()];
        if let Some(sharing) = sharing {
            reach.extend(
                sharing
                    .members()
                    .filter(|m| *m != member && !self.is_lost(m))
                    .map(str::to_string),
            );
        }
        Ok(Placement {
            id: naming::volume_id(&member, &uuid),
            topology: reach
                .into_iter()
                .map(|m| [(TOPOLOGY_MEMBER_KEY.to_string(), m)].into())
                .collect(),
            backing: Backing::Member {
                member,
                namespace,
                pvc,
                selected_node,
                // Known once the claim is made (`create_volume`).
                claim_uid: None,
            },
            context,
        })
    }

    fn serves_topology(&self, params: &VolumeParams, segments: &HashMap<String, String>) -> bool {
        match segments.get(TOPOLOGY_MEMBER_KEY) {
            Some(m) => {
                let shared = sharing_of(params).ok().flatten();
                self.members.contains_key(m)
                    && match &shared {
                        Some(s) => s.includes(m),
                        None => params.member.as_ref().is_none_or(|p| p == m),
                    }
            }
            None => true,
        }
    }

    async fn capacity_for(
        &self,
        params: &VolumeParams,
        segments: Option<&HashMap<String, String>>,
    ) -> CsiResult<Option<CapacityReport>> {
        let member = params
            .member
            .clone()
            .or_else(|| segments.and_then(|s| s.get(TOPOLOGY_MEMBER_KEY)).cloned())
            .or_else(|| self.only_member());
        let Some(member) = member else {
            return Ok(None);
        };
        let cluster = self.cluster(&member)?;
        let params = &moves::params_in(params, sharing_of(params)?.as_ref(), &member);
        let Some(class) =
            pvc::storage_class(cluster, params.member_storage_class.as_deref()).await?
        else {
            return Ok(None);
        };
        let name = class.metadata.name.unwrap_or_default();
        capacity::of_class(cluster, &name).await
    }

    async fn node_known(&self, node_id: &str) -> CsiResult<bool> {
        match &self.host {
            Some(host) => Ok(nodes::host_node(host, node_id).await?.is_some()),
            // Without the host cluster the node is resolved at attach time.
            None => Ok(true),
        }
    }

    async fn create_volume(
        &self,
        vol: &Volume,
        source: Option<SourceData<'_>>,
    ) -> CsiResult<Option<Backing>> {
        // A member object missing on the way (an API answering 404 where
        // nothing expected it) is no missing content source.
        self.create_claim(vol, source)
            .await
            .map(Some)
            .map_err(|e| match e {
                CsiError::NotFound(why) => CsiError::FailedPrecondition(why),
                other => other,
            })
    }

    /// A shared volume's origin PV as an import needs it, once its claim is
    /// Bound (a member class that binds at once: CreateVolume waited for
    /// it); nothing for one that binds later.
    async fn created_context(&self, vol: &Volume) -> CsiResult<BTreeMap<String, String>> {
        // A movable volume's data is in one member only: nothing another
        // could import if that member were lost.
        if sharing_of(&decode_volume_params(vol)?)?.is_none_or(|s| s.moves()) {
            return Ok(BTreeMap::new());
        }
        let at = MemberVolume::of(vol)?;
        let cluster = self.cluster(&at.member)?;
        let Some(claim) = pvc::owned(cluster, &at, &vol.id).await? else {
            return Ok(BTreeMap::new());
        };
        let Some(pv) = (match (pvc::phase(&claim), pvc::bound_pv(&claim)) {
            ("Bound", Some(name)) => pvc::get_pv(cluster, name).await?,
            _ => None,
        }) else {
            return Ok(BTreeMap::new());
        };
        Ok([(
            import::SHARED_SOURCE_KEY.to_string(),
            import::recorded(&pv)?,
        )]
        .into())
    }

    /// The host PVC the request named (external-provisioner's
    /// `--extra-create-metadata`) is gone, or its name is now another
    /// claim's: the provisioner names a volume `pvc-<claim uid>`, and no
    /// claim will ask for this name again.
    async fn abandoned(&self, vol: &Volume) -> CsiResult<bool> {
        let Some(host) = &self.host else {
            return Ok(false);
        };
        let params = decode_volume_params(vol)?;
        let (Some(namespace), Some(name)) = (&params.pvc_namespace, &params.pvc_name) else {
            return Ok(false);
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(host.client(), namespace);
        let claim = host
            .fetch(
                &format!("get PersistentVolumeClaim {namespace}/{name}"),
                api.get_metadata(name),
            )
            .await?;
        Ok(match claim.and_then(|c| c.metadata.uid) {
            None => true,
            Some(uid) => vol.name.starts_with("pvc-") && vol.name != format!("pvc-{uid}"),
        })
    }

    fn left_behind(&self, vol: &Volume) -> Option<String> {
        let at = MemberVolume::of(vol).ok()?;
        self.is_lost(&at.member).then(|| {
            format!(
                "member cluster {} was declared lost (--lost-member): PersistentVolumeClaim {} there, and the data in it, were left as they were",
                at.member,
                at.pvc_path()
            )
        })
    }

    async fn delete_volume(&self, vol: &Volume) -> CsiResult<()> {
        let at = MemberVolume::of(vol)?;
        // Every import goes before the data does (its removal never
        // deletes data); the data goes once, in the member that made it.
        // A gated volume has its access claims in the origin too.
        let params = decode_volume_params(vol)?;
        if let Some(sharing) = sharing_of(&params)? {
            let gate = access::claim_of(&params, &at);
            let claim = gate.clone().unwrap_or_else(|| at.clone());
            for member in sharing
                .members()
                .filter(|m| (gate.is_some() || *m != at.member) && !self.is_lost(m))
            {
                let c = self.cluster(member)?;
                import::remove(c, &claim, &vol.id).await?;
                kosmos_leftovers::remove_claim_copy(c, &claim).await?;
            }
            if sharing.moves() {
                self.delete_moved(vol, &sharing, &at).await?;
            }
            if let Some(host) = &self.host {
                kosmos_leftovers::remove_host_pv_copy(host, &at.uuid).await?;
            }
        }
        if let Some(left) = self.left_behind(vol) {
            tracing::warn!(volume_id = %vol.id, name = %vol.name, left_behind = %left, "volume released without its member");
            return Ok(());
        }
        let cluster = self.cluster(&at.member)?;
        pvc::delete(cluster, &at, &vol.id).await
    }

    /// The node must finish it when the member's resizer leaves the rest to
    /// the node (NodeResizePending, FileSystemResizePending): where the
    /// volume is proxied to a host node, no member kubelet will.
    async fn expand_volume(&self, vol: &Volume, new_size: u64) -> CsiResult<bool> {
        let at = MemberVolume::of(vol)?;
        let cluster = self.cluster(&at.member)?;
        let label = cluster.label();
        let path = at.pvc_path();
        let claim = pvc::owned(cluster, &at, &vol.id).await?.ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "{label}: PersistentVolumeClaim {path} is missing"
            ))
        })?;
        let phase = pvc::phase(&claim);
        if phase != "Bound" {
            return Err(CsiError::Unavailable(format!(
                "{label}: PersistentVolumeClaim {path} is {phase}, not Bound; it can be expanded once bound (retry)"
            )));
        }
        let claim = if pvc::requested(&claim).unwrap_or(0) < new_size {
            pvc::request_storage(cluster, &at.namespace, &at.pvc, new_size).await?
        } else {
            claim
        };
        // The member's answer.
        if pvc::capacity(&claim).unwrap_or(0) >= new_size {
            return Ok(false);
        }
        let conditions = pvc::conditions(&claim);
        let condition = |t: &str| {
            conditions
                .iter()
                .find(|(kind, _)| kind == t)
                .map(|(_, m)| m.clone())
        };
        match pvc::resize_status(&claim) {
            Some("ControllerResizeInfeasible") => {
                return Err(CsiError::FailedPrecondition(format!(
                    "{label} cannot grow PersistentVolumeClaim {path} to {new_size} bytes: {}",
                    condition("ControllerResizeError")
                        .unwrap_or_else(|| "resize infeasible".into())
                )))
            }
            // Done on the controller side; the rest happens where it is mounted.
            Some("NodeResizePending") | Some("NodeResizeInProgress") => {
                return self.host_node_finishes(vol).await
            }
            _ => {}
        }
        if condition("FileSystemResizePending").is_some() {
            return self.host_node_finishes(vol).await;
        }
        let why = condition("ControllerResizeError")
            .map(|m| format!(": the member's resizer reports {m:?}"))
            .unwrap_or_default();
        Err(CsiError::Unavailable(format!(
            "{label} is growing PersistentVolumeClaim {path} to {new_size} bytes (it reports {} bytes){why}; retry",
            pvc::capacity(&claim).unwrap_or(0)
        )))
    }

    async fn create_snapshot(&self, snap: &Snapshot, source: &Volume) -> CsiResult<()> {
        let at = MemberVolume::of(source)?;
        let cluster = self.cluster(&at.member)?;
        let map: HashMap<String, String> = snap.parameters.clone().into_iter().collect();
        let typed: SnapshotParams = params::decode(&map, "parameters")?;
        if pvc::owned(cluster, &at, &source.id).await?.is_none() {
            return Err(CsiError::FailedPrecondition(format!(
                "{}: PersistentVolumeClaim {} of volume {} is missing; there is nothing to snapshot",
                cluster.label(),
                at.pvc_path(),
                source.id
            )));
        }
        let name = naming::snapshot_name(&snap.id);
        let record = serde_json::to_string(snap)
            .map_err(|e| CsiError::Internal(format!("encode snapshot record: {e}")))?;
        let annotations = BTreeMap::from([
            (naming::SNAPSHOT_RECORD_ANNOTATION.to_string(), record),
            (naming::SNAPSHOT_ID_ANNOTATION.to_string(), snap.id.clone()),
            (naming::VOLUME_ID_ANNOTATION.to_string(), source.id.clone()),
            (
                naming::DRIVER_ANNOTATION.to_string(),
                self.driver_name.clone(),
            ),
        ]);
        let obj = snapshot::manifest(&snapshot::SnapshotPlan {
            name: &name,
            namespace: &at.namespace,
            pvc: &at.pvc,
            class: typed.member_snapshot_class.as_deref(),
            labels: naming::labels(&at.uuid),
            annotations,
        });
        snapshot::ensure_ready(cluster, &obj, &snap.id, self.wait).await
    }

    async fn delete_snapshot(&self, snap: &Snapshot) -> CsiResult<()> {
        let Backing::Member {
            member, namespace, ..
        } = &snap.backing
        else {
            return Err(CsiError::FailedPrecondition(format!(
                "snapshot {:?} is not a member-cluster snapshot",
                snap.id
            )));
        };
        if self.is_lost(member) {
            tracing::warn!(snapshot_id = %snap.id, member = %member, namespace = %namespace, "snapshot released: its member cluster is declared lost, and its member VolumeSnapshot is left there");
            return Ok(());
        }
        if snap.member_snapshot.is_some() {
            // The member's VolumeGroupSnapshot owns it, and goes first
            // (delete_group_snapshot): the member deletes it with the group.
            return Ok(());
        }
        let cluster = self.cluster(member)?;
        Ok(snapshot::delete(cluster, namespace, &naming::snapshot_name(&snap.id)).await?)
    }

    fn check_group_snapshot_parameters(&self, params: &GroupSnapshotParams) -> CsiResult<()> {
        self.check_group_params(params)
    }

    async fn create_group_snapshot(
        &self,
        group: &GroupSnapshot,
        members: &[(Snapshot, Volume)],
    ) -> CsiResult<GroupCut> {
        self.cut_group(group, members).await
    }

    async fn delete_group_snapshot(
        &self,
        group: &GroupSnapshot,
        snaps: &[Snapshot],
    ) -> CsiResult<()> {
        // Asked of the member whatever the records say: a cut that failed
        // after making the member VolumeGroupSnapshot recorded no member
        // snapshot names, and one of per-volume snapshots finds none (404).
        let Some(Backing::Member {
            member, namespace, ..
        }) = snaps.first().map(|s| &s.backing)
        else {
            return Ok(());
        };
        if self.is_lost(member) {
            tracing::warn!(group_snapshot_id = %group.id, member = %member, namespace = %namespace, "group snapshot released: its member cluster is declared lost, and its member VolumeGroupSnapshot is left there");
            return Ok(());
        }
        let cluster = self.cluster(member)?;
        group_snapshot::delete(cluster, namespace, &naming::group_snapshot_name(&group.id)).await
    }

    async fn moved_home(&self, vol: &Volume, node_id: &str) -> CsiResult<Option<Backing>> {
        self.move_home(vol, node_id).await
    }

    async fn pre_copy(&self, vol: &Volume, to: Option<&str>) -> CsiResult<()> {
        self.keep_copy(vol, to).await
    }

    async fn attach(&self, vol: &Volume, node_id: &str) -> CsiResult<BTreeMap<String, String>> {
        let origin = MemberVolume::of(vol)?;
        let sharing = sharing_of(&decode_volume_params(vol)?)?;
        let at = match &sharing {
            Some(sharing) => self.shared_place(vol, &origin, sharing, node_id).await?,
            None => origin,
        };
        let cluster = self.cluster(&at.member)?;
        let label = cluster.label();
        let path = at.pvc_path();
        let place = nodes::resolve(
            self.host.as_ref(),
            cluster,
            node_id,
            self.virtual_nodes.as_ref(),
        )
        .await?;
        let claim = pvc::owned(cluster, &at, &vol.id).await?.ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "{label}: PersistentVolumeClaim {path} is missing; the volume's storage is gone"
            ))
        })?;
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(CsiError::FailedPrecondition(format!(
                "{label}: PersistentVolumeClaim {path} is being deleted"
            )));
        }
        if place.virtual_node {
            // A virtual node (for the whole member cluster or one member
            // node): its pods run in the member, whose own attach/detach
            // controller attaches the volume where the member pod lands (and
            // whose scheduler binds a WaitForFirstConsumer claim then).
            // Nothing to attach here, and nothing for a node plugin to
            // mount on the host; the member-side watch reports the rest.
            tracing::info!(volume_id = %vol.id, node_id, claim = %path, "virtual node: NODE_READY without a relay attachment");
            return Ok(if sharing.is_some() {
                // Which member the node uses the volume in: detach and
                // the single-writer check read it from the record.
                [(source::MEMBER.to_string(), at.member.clone())].into()
            } else {
                BTreeMap::new()
            });
        }
        let pv_name = match (pvc::phase(&claim), pvc::bound_pv(&claim)) {
            ("Bound", Some(pv)) => pv.to_string(),
            (phase, _) => {
                let params = decode_volume_params(vol)?;
                self.nudge_binding(cluster, &at, &claim, &params, place.member_node.as_deref())
                    .await?;
                return Err(CsiError::Unavailable(format!(
                    "{label}: PersistentVolumeClaim {path} is {phase}, not Bound yet; ControllerPublishVolume succeeds once the member binds it (retry)"
                )));
            }
        };
        let pv = pvc::get_pv(cluster, &pv_name).await?.ok_or_else(|| {
            CsiError::Unavailable(format!(
                "{label}: PersistentVolume {pv_name} bound to {path} is not visible yet; retry"
            ))
        })?;
        let mut described = match sharing {
            Some(s) if !s.moves() => {
                MemberSource::from_shared_pv(&at.member, &pv, place.member_node.as_deref())?
            }
            _ => MemberSource::from_pv(&at.member, &pv, place.member_node.as_deref())?,
        };
        described.to_context()?; // fits, before anything is created for it
        if let SourceKind::Csi {
            driver,
            publish_context,
            attachment,
            ..
        } = &mut described.kind
        {
            if attach::attach_required(cluster, driver).await? {
                let node = place.member_node.as_deref().ok_or_else(|| {
                    CsiError::FailedPrecondition(format!(
                        "{label}: CSI driver {driver} of PersistentVolume {pv_name} attaches volumes to nodes, but host node {node_id} stands for no single member node (label it {TOPOLOGY_MEMBER_NODE_KEY})"
                    ))
                })?;
                let name = naming::attachment_name(&at.uuid, node);
                let wanted = attach::Wanted {
                    name: &name,
                    attacher: driver,
                    pv: &pv_name,
                    member_node: node,
                    host_node: node_id,
                };
                let va = attach::manifest(&wanted, naming::labels(&at.uuid));
                *publish_context = attach::ensure_attached(cluster, &va, self.wait).await?;
                *attachment = Some(name);
            }
        }
        described.to_context()
    }

    /// Member PVCs whose host PersistentVolume is gone: candidates for
    /// housekeeping, which removes those no record owns either. A claim
    /// without the host PV's name (no --extra-create-metadata) is never
    /// listed: nothing tells whether the CO still uses it.
    async fn stored_data(&self) -> CsiResult<Vec<StoredData>> {
        let Some(host) = &self.host else {
            return Ok(Vec::new());
        };
        // Claims of this driver that name a host PV, per member.
        let mut candidates = Vec::new();
        for (member, cluster) in &self.members {
            let listed = pvc::made_by(cluster, &self.driver_name, |claim| {
                let (Some(id), Some(host_pv)) = (
                    pvc::annotation_of(claim, naming::VOLUME_ID_ANNOTATION),
                    pvc::annotation_of(claim, naming::HOST_PV_NAME),
                ) else {
                    return;
                };
                if claim.deletion_timestamp.is_none()
                    && naming::parse_volume_id(id).map(|(m, _)| m) == Some(member.as_str())
                {
                    let path = format!(
                        "{member}/{}/{}",
                        claim.namespace.as_deref().unwrap_or_default(),
                        claim.name.as_deref().unwrap_or_default()
                    );
                    candidates.push((id.to_string(), host_pv.to_string(), path));
                }
            })
            .await;
            if let Err(e) = listed {
                tracing::warn!(member = %member, error = %e, "cannot list member claims; next sweep");
            }
        }
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        // One metadata-only listing of the host's PVs per sweep, not a read
        // per claim.
        let pvs =
            kube::api::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(host.client());
        let mut present = std::collections::HashSet::new();
        host.list_metadata_pages(
            "list PersistentVolumes",
            &pvs,
            kube::api::ListParams::default(),
            |items| {
                present.extend(items.into_iter().filter_map(|pv| pv.metadata.name));
                Ok::<_, CsiError>(())
            },
        )
        .await?;
        Ok(candidates
            .into_iter()
            .filter(|(_, host_pv, _)| !present.contains(host_pv))
            .map(|(id, _, path)| StoredData {
                kind: DataKind::Volume,
                id,
                path: path.into(),
                temporary: false,
            })
            .collect())
    }

    async fn remove_data(&self, data: &StoredData) -> CsiResult<()> {
        let place = data.path.to_string_lossy().into_owned();
        let mut parts = place.splitn(3, '/');
        let (Some(member), Some(namespace), Some(name)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(CsiError::Internal(format!(
                "{place:?} names no member claim"
            )));
        };
        let cluster = self.cluster(member)?;
        let uuid = naming::parse_volume_id(&data.id)
            .map(|(_, u)| u.to_string())
            .unwrap_or_default();
        let at = MemberVolume {
            member: member.to_string(),
            namespace: namespace.to_string(),
            pvc: name.to_string(),
            uuid,
            selected_node: None,
            claim_uid: None,
        };
        // Deletes only a claim that carries this id, as of the uid read.
        pvc::delete(cluster, &at, &data.id).await
    }

    async fn node_secret(
        &self,
        member: &str,
        reference: &str,
    ) -> CsiResult<HashMap<String, String>> {
        let cluster = self.cluster(member).map_err(|_| {
            CsiError::FailedPrecondition(format!(
                "the member volume's driver needs Secret {reference} of member cluster {member}, and this node plugin has no client for it: run it with --member {member}=KUBECONFIG (get on secrets is all it needs)"
            ))
        })?;
        let reference = source::check_secret_ref(reference)?;
        let (namespace, name) = reference.split_once('/').unwrap_or_default();
        let api = kube::api::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
            cluster.client(),
            namespace,
        );
        let secret = cluster
            .fetch(&format!("get Secret {reference}"), api.get(name))
            .await?
            .ok_or_else(|| {
                CsiError::FailedPrecondition(format!(
                    "{}: Secret {reference}, named by the member PersistentVolume for its driver's node calls, does not exist",
                    cluster.label()
                ))
            })?;
        let mut values = HashMap::new();
        for (key, bytes) in secret.data.unwrap_or_default() {
            let value = String::from_utf8(bytes.0).map_err(|_| {
                CsiError::FailedPrecondition(format!(
                    "{}: key {key:?} of Secret {reference} is not UTF-8 text; CSI secrets are strings",
                    cluster.label()
                ))
            })?;
            values.insert(key, value);
        }
        Ok(values)
    }

    async fn recover_snapshots(&self) -> CsiResult<Vec<Snapshot>> {
        let mut found = Vec::new();
        for (member, cluster) in &self.members {
            snapshot::made_by_relay(cluster, |obj| {
                match snapshot::recovered(member, &self.driver_name, &obj) {
                    Ok(snap) => found.push(snap),
                    Err(why) => tracing::warn!(
                        member = %member,
                        volume_snapshot = %obj.metadata.name.as_deref().unwrap_or_default(),
                        reason = %why,
                        "member VolumeSnapshot not recovered"
                    ),
                }
            })
            .await?;
        }
        Ok(found)
    }

    async fn recover_groups(&self) -> CsiResult<Vec<(GroupSnapshot, Vec<Snapshot>)>> {
        let mut found = Vec::new();
        for (member, cluster) in &self.members {
            // Each agreeing record, by namespace: a namespace's VolumeSnapshots
            // are listed once for all its groups, and not for a record refused.
            let mut by_namespace: BTreeMap<String, Vec<_>> = BTreeMap::new();
            group_snapshot::made_by_relay(cluster, |obj| {
                match group_snapshot::recovered(member, &self.driver_name, &obj) {
                    Ok(record) => by_namespace
                        .entry(obj.metadata.namespace.clone().unwrap_or_default())
                        .or_default()
                        .push((record, obj)),
                    Err(why) => tracing::warn!(
                        member = %member,
                        volume_group_snapshot = %obj.metadata.name.as_deref().unwrap_or_default(),
                        reason = %why,
                        "member VolumeGroupSnapshot not recovered"
                    ),
                }
            })
            .await?;
            for (namespace, records) in by_namespace {
                let snapshots = group_snapshot::snapshots_in(cluster, &namespace).await?;
                for (record, obj) in records {
                    let record = group_snapshot::settled(record, &obj, &snapshots);
                    found.push((record.group, record.snapshots));
                }
            }
        }
        Ok(found)
    }

    async fn own_attachments(&self) -> CsiResult<Vec<OwnAttachment>> {
        let mut found = Vec::new();
        for (member, cluster) in &self.members {
            match attach::own(cluster).await {
                Ok(list) => found.extend(list.into_iter().map(|(name, uuid)| OwnAttachment {
                    volume_id: format!("m-{member}-{uuid}"),
                    name,
                    place: member.clone(),
                })),
                Err(e) => {
                    tracing::warn!(member = %member, error = %e, "cannot list member attachments; next sweep")
                }
            }
        }
        Ok(found)
    }

    async fn collect_attachment(&self, a: &OwnAttachment) -> CsiResult<bool> {
        let cluster = self.cluster(&a.place)?;
        if attach::shared_with(cluster, &a.name).await?.is_some() {
            return Ok(false);
        }
        attach::ensure_detached(cluster, &a.name, self.wait).await?;
        Ok(true)
    }

    async fn detach(&self, vol: &Volume, node_id: &str) -> CsiResult<()> {
        let context = vol
            .node(node_id)
            .and_then(|n| n.attachment.as_ref())
            .map(|a| &a.publish_context);
        let origin = MemberVolume::of(vol)?;
        let params = decode_volume_params(vol)?;
        let at = match sharing_of(&params)? {
            Some(sharing) => {
                let member = self.used_in(vol, node_id, &origin.member).await?;
                let gate = access::claim_of(&params, &origin);
                let member = if sharing.includes(&member) {
                    member
                } else {
                    origin.member.clone()
                };
                if member == origin.member && gate.is_none() {
                    origin
                } else {
                    // An import, or a gated volume's access claim (in the
                    // origin too): it goes with the member's last node.
                    let claim = gate.unwrap_or_else(|| origin.clone());
                    let at = MemberVolume {
                        member,
                        claim_uid: None,
                        ..claim.clone()
                    };
                    self.detach_in(vol, node_id, &at, context).await?;
                    return self.release_import(vol, node_id, &claim, &at.member).await;
                }
            }
            None => origin,
        };
        self.detach_in(vol, node_id, &at, context).await
    }

    async fn health(&self, vol: &Volume) -> Health {
        let abnormal = |message: String| Health {
            abnormal: true,
            message,
        };
        let at = match MemberVolume::of(vol) {
            Ok(at) => at,
            Err(e) => return abnormal(e.to_string()),
        };
        let cluster = match self.cluster(&at.member) {
            Ok(c) => c,
            Err(e) => return abnormal(e.to_string()),
        };
        if let Some(why) = self.remembered_unreachable(&at.member) {
            return abnormal(why);
        }
        let label = cluster.label();
        let path = at.pvc_path();
        let claim = match pvc::owned(cluster, &at, &vol.id).await {
            Ok(c) => {
                self.remember_unreachable(&at.member, None);
                c
            }
            Err(e) => {
                if matches!(e, CsiError::Unavailable(_)) {
                    self.remember_unreachable(&at.member, Some(e.to_string()));
                }
                return abnormal(e.to_string());
            }
        };
        let Some(claim) = claim else {
            return abnormal(format!("{label}: PersistentVolumeClaim {path} is missing"));
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return abnormal(format!(
                "{label}: PersistentVolumeClaim {path} is being deleted"
            ));
        }
        match (pvc::phase(&claim), pvc::bound_pv(&claim)) {
            ("Bound", pv) => Health {
                abnormal: false,
                message: format!(
                    "{label}: PersistentVolumeClaim {path} is Bound to PersistentVolume {}",
                    pv.unwrap_or("?")
                ),
            },
            ("Lost", _) => abnormal(format!(
                "{label}: PersistentVolumeClaim {path} is Lost: its PersistentVolume is gone"
            )),
            (phase, _) => Health {
                abnormal: false,
                message: format!(
                    "{label}: PersistentVolumeClaim {path} is {phase}: waiting for the member to bind it"
                ),
            },
        }
    }

    fn node_source(&self, vol: &Volume) -> CsiResult<NodeSource> {
        let context = vol
            .nodes
            .values()
            .filter_map(|n| n.attachment.as_ref())
            .map(|a| &a.publish_context)
            .find(|c| c.contains_key(source::SOURCE_TYPE));
        match context {
            Some(c) => Ok(NodeSource::Member(Box::new(MemberSource::from_context(c)?))),
            None => Err(CsiError::FailedPrecondition(format!(
                "volume {:?} has no member source description yet: ControllerPublishVolume provides it",
                vol.id
            ))),
        }
    }
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;

#[path = "mobility/imports.rs"]
mod imports;

#[path = "backend_groups.rs"]
mod groups;

#[path = "mobility/home.rs"]
mod moves;
