//! The member backend's global-storage steps: which member a node uses a
//! shared volume in, the import there, its release, and the single-writer
//! rule across members.

use k8s_openapi::api::core::v1::PersistentVolume;

use super::*;

impl MemberBackend {
    /// The member a host node runs its pods in (its label); None without a
    /// host cluster or a label.
    async fn node_member(&self, node_id: &str) -> CsiResult<Option<String>> {
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
    /// answers. A writer is refused while a pod in another member uses the
    /// volume.
    pub(super) async fn shared_place(
        &self,
        vol: &Volume,
        origin: &MemberVolume,
        sharing: &Sharing,
        node_id: &str,
    ) -> CsiResult<MemberVolume> {
        let to = self
            .node_member(node_id)
            .await?
            .filter(|m| *m != origin.member && sharing.includes(m));
        let here = to.clone().unwrap_or_else(|| origin.member.clone());
        if writes_alone(vol, node_id) {
            self.held_elsewhere(vol, origin, sharing, &here, node_id)
                .await?;
        }
        let Some(to) = to else {
            return Ok(origin.clone());
        };
        self.import_into(vol, origin, sharing, &to).await?;
        Ok(MemberVolume {
            member: to,
            ..origin.clone()
        })
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
                .is_some_and(|c| pvc::belongs_to(&c, &vol.id));
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
                return Err(CsiError::Unavailable(format!(
                    "{label}: PersistentVolumeClaim {path} is {phase}, not Bound: volume {} is imported into member cluster {to} once the member that provisions it binds it (retry)",
                    vol.id
                )))
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

    /// Makes the import of `vol` in member `to` from the origin's bound PV.
    async fn import_into(
        &self,
        vol: &Volume,
        origin: &MemberVolume,
        sharing: &Sharing,
        to: &str,
    ) -> CsiResult<()> {
        let target = self.cluster(to)?;
        let path = origin.pvc_path();
        let pv = self.origin_pv(vol, origin, to).await?;
        let params = decode_volume_params(vol)?;
        let wanted = import::pv_manifest(vol, origin, &pv, sharing, to, &self.driver_name)?;
        let claim = import::claim_manifest(
            origin,
            &wanted,
            naming::pvc_metadata(vol, &origin.uuid, &params, &self.driver_name),
        );
        if Flag::on(params.create_member_namespace) {
            namespace::ensure(target, &origin.namespace).await?;
        }
        import::ensure(target, origin, &wanted, &claim, &vol.id, self.wait).await?;
        tracing::info!(volume_id = %vol.id, from = %origin.member, to, claim = %path, "volume imported");
        Ok(())
    }

    /// After `node_id` let go of the volume in member `member`: the import
    /// there goes once no other node of the record uses it there.
    pub(super) async fn release_import(
        &self,
        vol: &Volume,
        node_id: &str,
        origin: &MemberVolume,
        member: &str,
    ) -> CsiResult<()> {
        for (other, n) in &vol.nodes {
            if other == node_id || n.attachment.is_none() {
                continue;
            }
            if self.used_in(vol, other, &origin.member).await? == member {
                tracing::info!(volume_id = %vol.id, node_id, member, holder = %other, "import kept: another host node uses it");
                return Ok(());
            }
        }
        if self.is_lost(member) {
            return Ok(());
        }
        import::remove(self.cluster(member)?, origin, &vol.id).await
    }
}

#[cfg(test)]
#[path = "backend_imports_tests.rs"]
mod tests;
