//! The member backend's group snapshots: one member VolumeGroupSnapshot
//! of the claims of one namespace of one member, cut by their CSI driver
//! at one instant (`group_snapshot` holds the member objects), or one
//! VolumeSnapshot per volume where the class asks for that.

use super::*;

impl MemberBackend {
    pub(super) fn check_group_params(&self, params: &GroupSnapshotParams) -> CsiResult<()> {
        for (key, class) in [
            (
                "memberGroupSnapshotClass",
                &params.member_group_snapshot_class,
            ),
            ("memberSnapshotClass", &params.member_snapshot_class),
        ] {
            if let Some(c) = class.as_ref().filter(|c| !naming::is_dns_subdomain(c)) {
                return Err(CsiError::invalid(
                    "parameters",
                    format!("{key} {c:?} is not a valid class name"),
                ));
            }
        }
        let per_volume = Flag::on(params.per_volume_snapshots);
        if per_volume && params.member_group_snapshot_class.is_some() {
            return Err(CsiError::invalid(
                "parameters",
                "memberGroupSnapshotClass names the member class of a group cut at one instant, and perVolumeSnapshots: \"true\" cuts one VolumeSnapshot per volume instead: set one of them",
            ));
        }
        if !per_volume && params.member_snapshot_class.is_some() {
            return Err(CsiError::invalid(
                "parameters",
                "memberSnapshotClass is the class of the per-volume snapshots of perVolumeSnapshots: \"true\"; for a member VolumeGroupSnapshot, name its class with memberGroupSnapshotClass",
            ));
        }
        Ok(())
    }

    pub(super) async fn cut_group(
        &self,
        group: &GroupSnapshot,
        members: &[(Snapshot, Volume)],
    ) -> CsiResult<GroupCut> {
        let map: HashMap<String, String> = group.parameters.clone().into_iter().collect();
        let typed: GroupSnapshotParams = params::decode(&map, "parameters")?;
        if Flag::on(typed.per_volume_snapshots) {
            return Ok(GroupCut::OneByOne);
        }
        let mut at = Vec::new();
        for (_, vol) in members {
            at.push(MemberVolume::of(vol)?);
        }
        let Some(first) = at.first() else {
            return Ok(GroupCut::Whole(Vec::new()));
        };
        if let Some(other) = at
            .iter()
            .find(|a| a.member != first.member || a.namespace != first.namespace)
        {
            return Err(CsiError::FailedPrecondition(format!(
                "a member VolumeGroupSnapshot takes the claims of one namespace of one member cluster, and these volumes are in {}/{} and {}/{}: group volumes of one class and namespace, {}",
                first.member,
                first.namespace,
                other.member,
                other.namespace,
                group_snapshot::PER_VOLUME_HINT
            )));
        }
        let cluster = self.cluster(&first.member)?;
        let label = cluster.label();
        let Some(version) = group_snapshot::served_version(cluster).await? else {
            return Err(CsiError::FailedPrecondition(format!(
                "{label} serves no VolumeGroupSnapshot API ({}): install external-snapshotter's group snapshot CRDs there with the gate CSIVolumeGroupSnapshot on, {}",
                group_snapshot::GROUP,
                group_snapshot::PER_VOLUME_HINT
            )));
        };
        // Every claim the relay's and bound to a PV of one CSI driver: the
        // member's snapshotter cuts only such groups.
        let mut driver: Option<String> = None;
        for ((_, vol), a) in members.iter().zip(&at) {
            let Some(claim) = pvc::owned(cluster, a, &vol.id).await? else {
                return Err(CsiError::FailedPrecondition(format!(
                    "{label}: PersistentVolumeClaim {} of volume {} is missing; there is nothing to snapshot",
                    a.pvc_path(),
                    vol.id
                )));
            };
            let pv = match pvc::bound_pv(&claim) {
                Some(name) => pvc::get_pv(cluster, name).await?,
                None => None,
            };
            let its = pv
                .as_ref()
                .and_then(|pv| pv.spec.as_ref())
                .and_then(|s| s.csi.as_ref())
                .map(|c| c.driver.clone());
            let Some(its) = its else {
                return Err(CsiError::FailedPrecondition(format!(
                    "{label}: PersistentVolumeClaim {} of volume {} is not bound to a CSI volume, and only a CSI driver cuts group snapshots; {}",
                    a.pvc_path(),
                    vol.id,
                    group_snapshot::PER_VOLUME_HINT
                )));
            };
            match &driver {
                Some(d) if *d != its => {
                    return Err(CsiError::FailedPrecondition(format!(
                        "{label}: the claims are of two CSI drivers ({d:?}, {its:?}), and one VolumeGroupSnapshot is cut by one driver; {}",
                        group_snapshot::PER_VOLUME_HINT
                    )))
                }
                _ => driver = Some(its),
            }
        }
        let driver = driver.unwrap_or_default();
        let class = group_snapshot::class_for(
            cluster,
            version,
            &driver,
            typed.member_group_snapshot_class.as_deref(),
        )
        .await?;
        let name = naming::group_snapshot_name(&group.id);
        let record = serde_json::to_string(&group_snapshot::GroupRecord {
            group: group.clone(),
            snapshots: members.iter().map(|(s, _)| s.clone()).collect(),
        })
        .map_err(|e| CsiError::Internal(format!("encode group snapshot record: {e}")))?;
        let plan = group_snapshot::GroupPlan {
            version,
            name: &name,
            namespace: &first.namespace,
            class: &class,
            group_id: &group.id,
            driver_name: &self.driver_name,
            uuids: at.iter().map(|a| a.uuid.clone()).collect(),
            record,
        };
        let claims: Vec<String> = at.iter().map(|a| a.pvc.clone()).collect();
        let cut = group_snapshot::ensure_ready(
            cluster,
            &group_snapshot::manifest(&plan),
            &plan,
            &claims,
            self.wait,
        )
        .await?;
        let mut snaps = Vec::new();
        for ((snap, _), a) in members.iter().zip(&at) {
            let mut snap = snap.clone();
            snap.member_snapshot = cut.get(&a.pvc).cloned();
            snaps.push(snap);
        }
        Ok(GroupCut::Whole(snaps))
    }
}
