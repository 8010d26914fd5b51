//! Gated access: how a single-writer volume of shared storage is kept to
//! one member at a time, whatever Kosmos, Liqo or a user does there.
//!
//! A member pod needs no host attachment to mount a member claim: a claim
//! that pods find by name in a member is a door the host's attach/detach
//! controller never guards. So the claim that holds the data gets a name
//! no pod looks for (`relay-<uuid>`, the generated member claim name), and
//! every member, the origin included, reaches the data only through an
//! *access claim* named as the host claim (what a mirrored pod names),
//! which the relay makes at ControllerPublishVolume once the host attached
//! a node of that member, and removes at ControllerUnpublishVolume once no
//! pod there uses it. The store's attachment records are the lock: an
//! access claim exists only in a member the store records an attachment
//! in, and a single-writer volume is recorded as written in one member at
//! a time.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::domain::capability::{AccessMode, Capability};
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params::VolumeParams;
use crate::domain::sharing::Sharing;
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::{self, MemberVolume};

/// Whether a new volume of these parameters and capabilities is gated: a
/// shared class, a mode no capability lets several nodes write, and a host
/// claim whose name the access claims take (external-provisioner's
/// `--extra-create-metadata`). ReadWriteMany volumes keep the origin claim
/// under the host claim's name: every member may write them at once.
/// A volume that moves (`movableBetween`) is gated whatever its mode: its
/// data may be copied only while no member pod can write it.
pub fn gated(params: &VolumeParams, caps: &[Capability], sharing: Option<&Sharing>) -> bool {
    if sharing.is_some_and(Sharing::moves) {
        return params.pvc_name.is_some();
    }
    sharing.is_some()
        && params.pvc_name.is_some()
        && !caps
            .iter()
            .any(|c| c.mode == AccessMode::MultiNodeMultiWriter)
}

/// The claim member pods use a gated volume through: the access claim's
/// name (the host claim's) and namespace (the data claim's), with the
/// origin's member (what an import's marks name). None for a volume that
/// is not gated: its pods use the origin claim itself, as made before.
///
/// A volume is gated when its data claim has the generated name and the
/// host claim's name is another: both are recorded at CreateVolume and
/// never change, so a record rebuilt from its RelayVolume tells the same.
pub fn claim_of(params: &VolumeParams, origin: &MemberVolume) -> Option<MemberVolume> {
    let host = params.pvc_name.as_deref()?;
    let gated = (params.shared_with.is_some() || params.movable_between.is_some())
        && origin.pvc == naming::pvc_name(&origin.uuid)
        && host != origin.pvc;
    // Another claim than the recorded one: known by the import PV it is
    // bound to, not by the data claim's uid.
    gated.then(|| MemberVolume {
        pvc: host.to_string(),
        claim_uid: None,
        ..origin.clone()
    })
}

/// What holds a single-writer volume in a member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// A writer's finished attachment recorded on this host node.
    HostNode(String),
    /// The access claim there, and the pods using it (`pod ns/name on
    /// node N`).
    Claim { path: String, users: Vec<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub member: String,
    pub by: Holder,
}

/// Why a writer in member `here` must wait, naming what holds the volume
/// in another member: the first hold outside `here` of a member not
/// declared lost. None: `here` may write.
pub fn refusal(here: &str, held: &[Held], lost: impl Fn(&str) -> bool) -> Option<String> {
    let h = held.iter().find(|h| h.member != here && !lost(&h.member))?;
    let member = &h.member;
    Some(match &h.by {
        Holder::HostNode(node) => format!(
            "is published for writing to host node {node} (member cluster {member})"
        ),
        Holder::Claim { users, .. } if !users.is_empty() => {
            format!("is in use in member cluster {member} by {}", users.join(", "))
        }
        Holder::Claim { path, .. } => format!(
            "is held in member cluster {member} by its access claim {path} (no pod uses it yet; it goes at that member's ControllerUnpublishVolume)"
        ),
    })
}

/// The first node by name of `cluster` that is Ready and schedulable:
/// where a gated volume's data claim of a late-binding class is sent. None
/// when there is none now (the claim then waits, and CreateVolume's retry
/// sends it once one is).
pub async fn some_node(cluster: &Cluster) -> CsiResult<Option<String>> {
    let api = Api::<Node>::all(cluster.client());
    let mut best: Option<String> = None;
    cluster
        .list_pages(
            "list Nodes",
            &api,
            ListParams::default(),
            |page: Vec<Node>| {
                for node in page.iter().filter(|n| usable(n)) {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    if best.as_ref().is_none_or(|b| name < *b) {
                        best = Some(name);
                    }
                }
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    Ok(best)
}

fn usable(node: &Node) -> bool {
    let schedulable = node
        .spec
        .as_ref()
        .is_none_or(|s| s.unschedulable != Some(true));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    schedulable && ready && node.metadata.name.as_deref().is_some_and(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::capability::AccessType;

    fn params(shared: bool, host: Option<&str>) -> VolumeParams {
        VolumeParams {
            shared_with: shared.then(|| "east,west".to_string()),
            pvc_name: host.map(str::to_string),
            ..Default::default()
        }
    }

    fn cap(mode: AccessMode) -> Capability {
        Capability {
            mode,
            access: AccessType::Block,
        }
    }

    fn origin(pvc: &str) -> MemberVolume {
        MemberVolume {
            member: "east".into(),
            namespace: "shop".into(),
            pvc: pvc.into(),
            uuid: "0a1b".into(),
            selected_node: None,
            claim_uid: None,
        }
    }

    #[test]
    fn a_data_claim_goes_to_a_ready_schedulable_node_only() {
        let node = |name: &str, ready: &str, cordoned: bool| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"unschedulable": cordoned},
                "status": {"conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        assert!(usable(&node("a", "True", false)));
        assert!(!usable(&node("b", "False", false)));
        assert!(!usable(&node("c", "True", true)));
        assert!(!usable(&node("", "True", false)));
    }

    #[test]
    fn only_shared_single_writer_volumes_with_a_host_claim_are_gated() {
        let s = Sharing::of(&params(true, None)).unwrap().unwrap();
        let rwo = [cap(AccessMode::SingleNodeWriter)];
        let rwop = [cap(AccessMode::SingleNodeSingleWriter)];
        let mnsw = [cap(AccessMode::MultiNodeSingleWriter)];
        let rwx = [cap(AccessMode::MultiNodeMultiWriter)];
        for caps in [&rwo[..], &rwop[..], &mnsw[..]] {
            assert!(gated(&params(true, Some("data")), caps, Some(&s)));
        }
        assert!(!gated(&params(true, Some("data")), &rwx, Some(&s)));
        assert!(!gated(&params(true, None), &rwo, Some(&s)));
        assert!(!gated(&params(false, Some("data")), &rwo, None));
    }

    #[test]
    fn pods_use_the_access_claim_of_a_gated_volume_and_the_origin_claim_otherwise() {
        let data = naming::pvc_name("0a1b");
        let got = claim_of(&params(true, Some("data")), &origin(&data)).unwrap();
        assert_eq!(
            (
                got.member.as_str(),
                got.namespace.as_str(),
                got.pvc.as_str()
            ),
            ("east", "shop", "data")
        );
        // The access claim is another object than the recorded data claim:
        // the data claim's uid never judges it (an import is known by the
        // PV it is bound to).
        let recorded = MemberVolume {
            claim_uid: Some("uid-data".into()),
            ..origin(&data)
        };
        let got = claim_of(&params(true, Some("data")), &recorded).unwrap();
        assert_eq!(got.claim_uid, None);
        // Made before gating: the origin claim holds the host claim's name.
        assert!(claim_of(&params(true, Some("data")), &origin("data")).is_none());
        // Not shared, or no host claim name known.
        assert!(claim_of(&params(false, Some("data")), &origin(&data)).is_none());
        assert!(claim_of(&params(true, None), &origin(&data)).is_none());
    }

    /// The rule over interleavings: four host nodes, two in each of two
    /// members; publish (cut short by a crash after the access claim is
    /// made, or not), unpublish (cut short after the claim is gone, or
    /// not), member pods starting wherever an access claim lets them and
    /// stopping. Publish and unpublish take the steps the backend takes:
    /// the intent recorded, `refusal` judged over the finished writers'
    /// records and the other members' access claims, then the claim made;
    /// unpublish waits while a pod uses the claim, and keeps it while
    /// another node of the member is recorded. Whatever the order, pods
    /// run in one member at most, and once everything lets go any member
    /// may take the volume.
    mod interleavings {
        use super::super::*;
        use proptest::prelude::*;
        use std::collections::{BTreeMap, BTreeSet};

        #[derive(Debug, Clone)]
        enum Op {
            Publish { node: u8, crash: bool },
            Unpublish { node: u8, crash: bool },
            PodStarts { member: u8 },
            PodStops { member: u8 },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..4, any::<bool>()).prop_map(|(node, crash)| Op::Publish { node, crash }),
                (0u8..4, any::<bool>()).prop_map(|(node, crash)| Op::Unpublish { node, crash }),
                (0u8..2).prop_map(|member| Op::PodStarts { member }),
                (0u8..2).prop_map(|member| Op::PodStops { member }),
            ]
        }

        fn member_of(node: u8) -> String {
            format!("m{}", node % 2)
        }

        #[derive(Default)]
        struct World {
            /// host node -> attachment finished
            records: BTreeMap<u8, bool>,
            claims: BTreeSet<String>,
            pods: BTreeMap<String, usize>,
        }

        impl World {
            fn publish(&mut self, node: u8, crash: bool) -> bool {
                let here = member_of(node);
                self.records.entry(node).or_insert(false);
                let mut held: Vec<Held> = self
                    .records
                    .iter()
                    .filter(|(n, done)| **n != node && **done)
                    .map(|(n, _)| Held {
                        member: member_of(*n),
                        by: Holder::HostNode(format!("node-{n}")),
                    })
                    .collect();
                held.extend(self.claims.iter().map(|m| {
                    Held {
                        member: m.clone(),
                        by: Holder::Claim {
                            path: "shop/data".into(),
                            users: vec!["pod"; self.pods.get(m).copied().unwrap_or(0)]
                                .into_iter()
                                .map(String::from)
                                .collect(),
                        },
                    }
                }));
                if refusal(&here, &held, |_| false).is_some() {
                    return false;
                }
                self.claims.insert(here);
                if !crash {
                    self.records.insert(node, true);
                }
                true
            }

            fn unpublish(&mut self, node: u8, crash: bool) {
                if !self.records.contains_key(&node) {
                    return;
                }
                let here = member_of(node);
                let shared = self
                    .records
                    .keys()
                    .any(|n| *n != node && member_of(*n) == here);
                if !shared {
                    if self.pods.get(&here).copied().unwrap_or(0) > 0 {
                        return; // UNAVAILABLE while a pod uses the claim
                    }
                    self.claims.remove(&here);
                    if crash {
                        return; // the record outlives the claim
                    }
                }
                self.records.remove(&node);
            }

            fn apply(&mut self, op: &Op) {
                match *op {
                    Op::Publish { node, crash } => {
                        self.publish(node, crash);
                    }
                    Op::Unpublish { node, crash } => self.unpublish(node, crash),
                    Op::PodStarts { member } => {
                        let m = format!("m{member}");
                        if self.claims.contains(&m) {
                            *self.pods.entry(m).or_default() += 1;
                        }
                    }
                    Op::PodStops { member } => {
                        if let Some(n) = self.pods.get_mut(&format!("m{member}")) {
                            *n = n.saturating_sub(1);
                        }
                    }
                }
            }

            fn members_running(&self) -> usize {
                self.pods.values().filter(|n| **n > 0).count()
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn at_most_one_member_runs_a_single_writer_volume(ops in proptest::collection::vec(op(), 1..60)) {
                let mut w = World::default();
                for op in &ops {
                    w.apply(op);
                    prop_assert!(w.members_running() <= 1, "after {op:?} in {ops:?}");
                }
                // Everything lets go: pods stop, every node unpublishes.
                w.pods.clear();
                for node in 0..4 {
                    w.unpublish(node, false);
                }
                prop_assert!(w.records.is_empty() && w.claims.is_empty());
                prop_assert!(w.publish(1, false), "member m1 may take it");
                prop_assert!(!w.publish(0, false), "while m1 holds it, m0 may not");
            }
        }
    }
}
