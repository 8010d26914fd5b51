//! The member backend's global-storage steps: which member a node uses a
//! shared volume in, the import there, its release, and the single-writer
//! rule across members.

use k8s_openapi::api::core::v1::PersistentVolume;

use super::*;
use crate::domain::volume::Progress;

impl MemberBackend {
    /// The member a host node runs its pods in (its label); None without a
    /// host cluster or a label.
    pub(super) async fn node_member(&self, node_id: &str) -> CsiResult<Option<String>> {
        let Some(host) = &self.host else {
            return Ok(None);
        };
        let node = nodes::host_node(host, node_id)
            .await?
            .ok_or_else(|| CsiError::NodeNotFound(node_id.to_string()))?;
        Ok(node
            .metadata
            .labels
            .and_then(|mut l| l.remove(TOPOLOGY_MEMBER_KEY)))
    }

    /// The member `node_id` uses the volume in: what its attachment
    /// recorded, else its label now, else the origin (a node gone, whose
    /// import DeleteVolume still removes).
    pub(super) async fn used_in(
        &self,
        vol: &Volume,
        node_id: &str,
        origin: &str,
    ) -> CsiResult<String> {
        let recorded = vol
            .node(node_id)
            .and_then(|n| n.attachment.as_ref())
            .and_then(|a| a.publish_context.get(source::MEMBER));
        if let Some(member) = recorded {
            return Ok(member.clone());
        }
        match self.node_member(node_id).await {
            Ok(Some(member)) => Ok(member),
            Ok(None) | Err(CsiError::NodeNotFound(_)) => Ok(origin.to_string()),
            Err(e) => Err(e),
        }
    }

    /// Where a node of a shared volume uses it: the origin, or an import
    /// into its own member, made here before ControllerPublishVolume
    /// answers. A gated volume (`access`) is used in every member, the
    /// origin included, through the access claim made here. A writer is
    /// refused while another member holds the volume.
    pub(super) async fn shared_place(
        &self,
        vol: &Volume,
        origin: &MemberVolume,
        sharing: &Sharing,
        node_id: &str,
    ) -> CsiResult<MemberVolume> {
        let here = self
            .node_member(node_id)
            .await?
            .filter(|m| sharing.includes(m))
            .unwrap_or_else(|| origin.member.clone());
        let gate = access::claim_of(&decode_volume_params(vol)?, origin);
        let claim = gate.clone().unwrap_or_else(|| origin.clone());
        if sharing.moves() && here != origin.member {
            // ControllerPublishVolume moves it first (`moved_home`).
            return Err(CsiError::Unavailable(format!(
                "volume {} lives in member cluster {}, not yet in member cluster {here} of host node {node_id}; its move is under way (retry)",
                vol.id, origin.member
            )));
        }
        if writes_alone(vol, node_id) {
            match &gate {
                Some(access) => {
                    self.held_by_another(vol, access, sharing, &here, node_id, false)
                        .await?
                }
                None => {
                    self.held_elsewhere(vol, origin, sharing, &here, node_id)
                        .await?
                }
            }
        }
        if gate.is_none() && here == origin.member {
            return Ok(claim);
        }
        self.import_into(vol, origin, &claim, sharing, &here)
            .await?;
        // The import in `here`: not the claim of the recorded uid.
        Ok(MemberVolume {
            member: here,
            claim_uid: None,
            ..claim
        })
    }

    /// A gated volume's single-writer rule (`access::refusal`):
    /// FAILED_PRECONDITION while a writer's finished attachment is recorded
    /// on a host node of another member, or while another member has the
    /// volume's access claim (used or not: a pod may start on it at any
    /// moment, and it goes only at that member's last unpublish). A member
    /// declared lost counts for nothing (the operator's word that nothing
    /// runs there); one that cannot be asked fails the call.
    ///
    /// With `any_mode` (a move), readers hold it too and the message says
    /// the volume moves once they let go.
    pub(super) async fn held_by_another(
        &self,
        vol: &Volume,
        claim: &MemberVolume,
        sharing: &Sharing,
        here: &str,
        node_id: &str,
        any_mode: bool,
    ) -> CsiResult<()> {
        let refuse = |why: String| {
            CsiError::FailedPrecondition(if any_mode {
                format!(
                    "volume {} {why}; it moves to member cluster {here} (host node {node_id}) once they let go, its copy already syncing",
                    vol.id
                )
            } else {
                format!(
                    "volume {} has a single-writer access mode and {why}; host node {node_id} (member cluster {here}) can use it once they let go",
                    vol.id
                )
            })
        };
        let mut held = Vec::new();
        for (other, n) in &vol.nodes {
            let done = n
                .attachment
                .as_ref()
                .is_some_and(|a| a.progress == Progress::Done);
            if other != node_id && done && (any_mode || writes_alone(vol, other)) {
                held.push(access::Held {
                    member: self.used_in(vol, other, &claim.member).await?,
                    by: access::Holder::HostNode(other.clone()),
                });
            }
        }
        let lost = |m: &str| self.is_lost(m);
        if let Some(why) = access::refusal(here, &held, lost) {
            return Err(refuse(why));
        }
        for member in sharing.members().filter(|m| *m != here && !self.is_lost(m)) {
            let cluster = self.cluster(member)?;
            let found = pvc::get(cluster, &claim.namespace, &claim.pvc).await?;
            if !found.is_some_and(|c| import::is_access_claim(&c, claim, &vol.id)) {
                continue;
            }
            held.push(access::Held {
                member: member.to_string(),
                by: access::Holder::Claim {
                    path: claim.pvc_path(),
                    users: import::users(cluster, claim).await?,
                },
            });
        }
        match access::refusal(here, &held, lost) {
            Some(why) => Err(refuse(why)),
            None => Ok(()),
        }
    }

    /// FAILED_PRECONDITION naming the member, pods and nodes that use a
    /// single-writer volume outside `here`. Only claims that are this
    /// volume's count (someone else's claim of the same name is not); a
    /// member declared lost counts for nothing (the operator's word that
    /// nothing runs there); one that cannot be asked fails the call.
    async fn held_elsewhere(
        &self,
        vol: &Volume,
        origin: &MemberVolume,
        sharing: &Sharing,
        here: &str,
        node_id: &str,
    ) -> CsiResult<()> {
        for member in sharing.members().filter(|m| *m != here && !self.is_lost(m)) {
            let cluster = self.cluster(member)?;
            let ours = pvc::get(cluster, &origin.namespace, &origin.pvc)
                .await?
                .is_some_and(|c| {
                    // In the origin, the claim the record names; elsewhere
                    // an import, which a copy's marks may pass for: counted,
                    // so the check errs toward refusing.
                    let relays = match member == origin.member {
                        true => pvc::is_recorded(&c, origin, &vol.id),
                        false => pvc::belongs_to(&c, &vol.id),
                    };
                    relays && !pvc::copies_the_host_claim(&c)
                });
            if !ours {
                continue;
            }
            let users = import::users(cluster, origin).await?;
            if !users.is_empty() {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {} has a single-writer access mode and is in use in member cluster {member} by {}; host node {node_id} (member cluster {here}) can use it once they let go",
                    vol.id,
                    users.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The origin's PV: as its member shows it, or, with that member
    /// declared lost, as the host PV's context recorded it at CreateVolume.
    async fn origin_pv(
        &self,
        vol: &Volume,
        origin: &MemberVolume,
        to: &str,
    ) -> CsiResult<PersistentVolume> {
        if self.is_lost(&origin.member) {
            return self.recorded_origin(vol, &origin.member).await;
        }
        let from = self.cluster(&origin.member)?;
        let label = from.label();
        let path = origin.pvc_path();
        let claim = pvc::owned(from, origin, &vol.id).await?.ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "{label}: PersistentVolumeClaim {path} is missing; there is no data to import into member cluster {to}"
            ))
        })?;
        let pv_name = match (pvc::phase(&claim), pvc::bound_pv(&claim)) {
            ("Bound", Some(pv)) => pv.to_string(),
            (phase, _) => {
                // A gated volume's data claim of a class that waits for a
                // consumer has none: it is sent to a node.
                // (Once sent, the member's provisioner is at work: the
                // nodes are not listed again on each retry.)
                let sent = pvc::annotation(&claim, naming::SELECTED_NODE_ANNOTATION).is_some();
                if origin.pvc == naming::pvc_name(&origin.uuid) && !sent {
                    if let Some(node) = pvc::a_schedulable_node(from).await? {
                        let params = decode_volume_params(vol)?;
                        let params = super::moves::params_in(
                            &params,
                            sharing_of(&params)?.as_ref(),
                            &origin.member,
                        );
                        self.nudge_binding(from, origin, &claim, &params, Some(&node))
                            .await?;
                    }
                }
                return Err(CsiError::Unavailable(format!(
                    "{label}: PersistentVolumeClaim {path} is {phase}, not Bound: volume {} is imported into member cluster {to} once the member that provisions it binds it (retry)",
                    vol.id
                )));
            }
        };
        pvc::get_pv(from, &pv_name).await?.ok_or_else(|| {
            CsiError::Unavailable(format!(
                "{label}: PersistentVolume {pv_name} bound to {path} is not visible yet; retry"
            ))
        })
    }

    /// The origin PV a lost member held, from the host PV's volume
    /// attributes: written by the CO from CreateVolume's answer and
    /// immutable since (the RelayVolume's copy is editable, so not used).
    async fn recorded_origin(&self, vol: &Volume, lost: &str) -> CsiResult<PersistentVolume> {
        let refuse = |why: String| {
            CsiError::FailedPrecondition(format!(
                "member cluster {lost}, which made volume {}, is declared lost (--lost-member {lost}), and {why}",
                vol.id
            ))
        };
        let host = self.host.as_ref().ok_or_else(|| {
            refuse("no host cluster is configured to read its PersistentVolume from".into())
        })?;
        let params = decode_volume_params(vol)?;
        let name = params.pv_name.clone().unwrap_or_else(|| vol.name.clone());
        let pv = host
            .fetch(
                &format!("get PersistentVolume {name}"),
                Api::<PersistentVolume>::all(host.client()).get(&name),
            )
            .await?
            .ok_or_else(|| refuse(format!("its host PersistentVolume {name} is gone")))?;
        let csi = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .filter(|c| c.driver == self.driver_name && c.volume_handle == vol.id)
            .ok_or_else(|| refuse(format!("host PersistentVolume {name} is not this volume's")))?;
        let text = csi
            .volume_attributes
            .as_ref()
            .and_then(|a| a.get(import::SHARED_SOURCE_KEY))
            .ok_or_else(|| refuse(format!(
                "host PersistentVolume {name} records no shared source ({}): its member class bound the claim only after CreateVolume answered, so where the data lies was never recorded",
                import::SHARED_SOURCE_KEY
            )))?;
        import::from_recorded(text)
            .map_err(|why| refuse(format!("its recorded shared source is unreadable: {why}")))
    }

    /// Makes the import of `vol` in member `to` from the origin's bound PV,
    /// under `claim`'s name (the origin claim's, or a gated volume's access
    /// claim).
    async fn import_into(
        &self,
        vol: &Volume,
        origin: &MemberVolume,
        claim: &MemberVolume,
        sharing: &Sharing,
        to: &str,
    ) -> CsiResult<()> {
        let target = self.cluster(to)?;
        let path = claim.pvc_path();
        let pv = self.origin_pv(vol, origin, to).await?;
        let params = decode_volume_params(vol)?;
        let wanted = import::pv_manifest(vol, claim, &pv, sharing, to, &self.driver_name)?;
        let made = import::claim_manifest(
            claim,
            &wanted,
            naming::pvc_metadata(vol, &origin.uuid, &params, &self.driver_name),
        );
        if Flag::on(params.create_member_namespace) {
            namespace::ensure(target, &claim.namespace).await?;
        }
        import::ensure(target, claim, &wanted, &made, &vol.id, self.wait).await?;
        tracing::info!(volume_id = %vol.id, from = %origin.member, to, claim = %path, "volume imported");
        Ok(())
    }

    /// After `node_id` let go of the volume in member `member`: the import
    /// there (named as `claim`) goes once no other node of the record uses
    /// it there.
    pub(super) async fn release_import(
        &self,
        vol: &Volume,
        node_id: &str,
        claim: &MemberVolume,
        member: &str,
    ) -> CsiResult<()> {
        for (other, n) in &vol.nodes {
            if other == node_id || n.attachment.is_none() {
                continue;
            }
            if self.used_in(vol, other, &claim.member).await? == member {
                tracing::info!(volume_id = %vol.id, node_id, member, holder = %other, "import kept: another host node uses it");
                return Ok(());
            }
        }
        if self.is_lost(member) {
            return Ok(());
        }
        import::remove(self.cluster(member)?, claim, &vol.id).await
    }
}

#[cfg(test)]
#[path = "imports_tests.rs"]
mod tests;
