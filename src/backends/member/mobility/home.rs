//! The member backend's side of a move: when a volume of a
//! `movableBetween` class must live elsewhere before a node can use it,
//! what refuses the move, what starts it, and the switch of home; what a
//! move leaves behind, and how DeleteVolume clears every member.

use super::*;
use crate::backends::member::mobility::moving::{self, Plan};
use crate::backends::member::mobility::{attachments, import, mover_pod};
use crate::domain::params::Retention;

/// How long ControllerPublishVolume waits for a copy about to verify
/// before answering with its progress (the attacher's timeout is 60 s).
const MOVE_WAIT: Duration = Duration::from_secs(20);
/// How long after a switch the old member's claim waits for a pod to run
/// on the new copy before it is left to DeleteVolume or the next move.
const SERVED_WAIT: Duration = Duration::from_secs(900);
/// How long ControllerPublishVolume waits, after a move, for the member to
/// detach what a mover held before the pods' import is made (the attacher
/// gives up at 60 s, of which `MOVE_WAIT` may be spent).
const ATTACH_SETTLE: Duration = Duration::from_secs(25);

/// The parameters of the volume's claim in `member`: its class from
/// `movableBetween`.
pub(super) fn params_in(
    params: &VolumeParams,
    sharing: Option<&Sharing>,
    member: &str,
) -> VolumeParams {
    let mut p = params.clone();
    if let Some(class) = sharing.and_then(|s| s.class_in(member)) {
        p.member_storage_class = Some(class.to_string());
    }
    p
}

impl MemberBackend {
    pub(super) async fn move_home(
        &self,
        vol: &Volume,
        node_id: &str,
    ) -> CsiResult<Option<Backing>> {
        let params = decode_volume_params(vol)?;
        let Some(sharing) = sharing_of(&params)?.filter(Sharing::moves) else {
            return Ok(None);
        };
        let home = MemberVolume::of(vol)?;
        let Some(access) = access::claim_of(&params, &home) else {
            return Ok(None);
        };
        let here = match self.node_member(node_id).await? {
            Some(m) if sharing.includes(&m) => m,
            _ => return Ok(None),
        };
        if here == home.member {
            // A publish where the volume is: no pass begun before it serves,
            // and a move a pod elsewhere asked for (refused, or not yet
            // verified) is over: its pod came back.
            self.moves.interrupt(&vol.id);
            if let Some((to, last)) = self.moves.abandon(&vol.id) {
                self.stay_home(vol, &params, &home, &to, last);
            }
            // Its source mover, and the attachment that mover held, go
            // before the pod's import is made (`attachments`). A pre-copy's
            // mover stays: it shares the pod's attachment on its node.
            if self.moves.status(&vol.id).is_none() {
                self.settle_home(vol, &home, &access).await?;
            }
            return Ok(None);
        }
        let moving = |why: String| {
            CsiError::FailedPrecondition(format!(
                "volume {} lives in member cluster {} and cannot move to member cluster {here} (host node {node_id}): {why}",
                vol.id, home.member
            ))
        };
        if self.is_lost(&home.member) {
            return Err(moving(format!(
                "member cluster {} is declared lost (--lost-member), and its data with it",
                home.member
            )));
        }
        let image = self.mover_image.clone().ok_or_else(|| {
            moving("the controller has no --mover-image, the image its movers run".into())
        })?;
        let plan = self.move_plan(vol, &params, &sharing, &home, &access, &here, image)?;
        // Held in another member: refused, but the copy starts, so that the
        // pass after the holder let go sends only what changed since.
        if let Err(held) = self
            .held_for_move(vol, &access, &sharing, &here, node_id)
            .await
        {
            self.moves.ensure(plan);
            return Err(held);
        }
        if !self.moves.verified(&vol.id, &here) {
            self.moves.ensure(plan);
            if !self.moves.wait_verified(&vol.id, &here, MOVE_WAIT).await {
                let status = self
                    .moves
                    .status(&vol.id)
                    .map(|s| moving::describe(&s))
                    .unwrap_or_else(|| "starting".into());
                return Err(CsiError::Unavailable(format!(
                    "volume {} is moving from member cluster {} to member cluster {here}, where host node {node_id} runs its pods: {status}; ControllerPublishVolume succeeds once the copy is verified (retry)",
                    vol.id, home.member
                )));
            }
            // The wait let other calls in: what held it is asked again.
            self.held_for_move(vol, &access, &sharing, &here, node_id)
                .await?;
        }
        // The claim the copy was verified in becomes the one the record
        // names, by its uid.
        let target = self.cluster(&here)?;
        let claim = pvc::get(target, &home.namespace, &home.pvc)
            .await?
            .filter(|c| pvc::belongs_to(c, &vol.id) && !pvc::copies_the_host_claim(c))
            .ok_or_else(|| {
                CsiError::Unavailable(format!(
                    "{}: the move's claim {} of volume {} is gone after its copy was verified; retry",
                    target.label(),
                    home.pvc_path(),
                    vol.id
                ))
            })?;
        // The target mover and its attachment go before the import the
        // pods use is made there: both name one handle (`attachments`).
        // The source's mover goes after the switch; nothing of its member
        // starts meanwhile.
        mover_pod::remove_all(target, &home.uuid, &home.namespace).await?;
        if let Some(pv) = pvc::bound_pv(&claim) {
            let why = format!("the first pod of volume {} there", vol.id);
            attachments::wait_gone(target, &[pv], ATTACH_SETTLE, &why).await?;
        }
        let claim_uid = claim.metadata.uid;
        let last = self.moves.status(&vol.id);
        let seconds = self.moves.finish(&vol.id).unwrap_or_default();
        if let (Some(host), Some(last)) = (self.host.clone(), last) {
            let mut shown = moving::move_status(&home.member, &last, None);
            shown.phase = "Moved".into();
            shown.move_seconds = Some(seconds);
            shown.message = None;
            let id = vol.id.clone();
            let claim = params.pvc_namespace.clone().zip(params.pvc_name.clone());
            let note = format!(
                "volume {id} now lives in member cluster {here}, moved from {} in {seconds:.1} s; its snapshots, if any, stay in {}, where volumes restored from them are made",
                home.member, home.member
            );
            tokio::spawn(async move {
                crate::k8s::relay_move::report(&host, &id, &shown).await;
                if let Some(claim) = claim {
                    let step = &crate::k8s::relay_move::MOVED;
                    crate::k8s::relay_move::tell(&host, &claim, step, &note).await;
                }
            });
        }
        tracing::info!(volume_id = %vol.id, from = %home.member, to = %here, seconds, "move verified: the volume's home is now its new member");
        let retention = params.moved_data_retention.unwrap_or_default();
        self.after_move(vol, &home, &access, &here, retention);
        Ok(Some(Backing::Member {
            member: here,
            namespace: home.namespace.clone(),
            pvc: home.pvc.clone(),
            selected_node: None,
            claim_uid,
        }))
    }

    /// A pre-copy asked on the host claim (`ops::pre_copy`): the move's
    /// passes run while the volume's pods still run in its member, so that
    /// the move, when a pod lands in `to`, sends only what changed since.
    /// `None`: no longer asked; a move only that wanted stops and its
    /// movers go (the copy stays, for a later pre-copy or move to finish,
    /// and DeleteVolume removes it).
    pub(super) async fn keep_copy(&self, vol: &Volume, to: Option<&str>) -> CsiResult<()> {
        let params = decode_volume_params(vol)?;
        let not_movable = || {
            CsiError::FailedPrecondition(format!(
                "volume {} is not of a class with movableBetween: it cannot be copied to another member",
                vol.id
            ))
        };
        let sharing = sharing_of(&params)?
            .filter(Sharing::moves)
            .ok_or_else(not_movable)?;
        let home = MemberVolume::of(vol)?;
        let Some(to) = to else {
            // Ours, or no move of it here at all: movers left by another
            // leader's pre-copy, which this one never knew.
            let ours = self.moves.stop_pre_copy(&vol.id);
            if ours || self.moves.status(&vol.id).is_none() {
                for member in sharing.members().filter(|m| !self.is_lost(m)) {
                    mover_pod::remove_all(self.cluster(member)?, &home.uuid, &home.namespace)
                        .await?;
                }
                if ours {
                    tracing::info!(volume_id = %vol.id, "pre-copy no longer asked: its movers removed");
                }
            }
            return Ok(());
        };
        if to == home.member {
            return Ok(());
        }
        if !sharing.includes(to) {
            return Err(CsiError::Invalid {
                field: "label relay.csi.dev/pre-copy-to",
                reason: format!(
                    "volume {}: member cluster {to:?} is not one of its class's movableBetween members ({})",
                    vol.id,
                    sharing.members().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        if self.is_lost(&home.member) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {}: its member cluster {} is declared lost (--lost-member)",
                vol.id, home.member
            )));
        }
        let access = access::claim_of(&params, &home).ok_or_else(not_movable)?;
        let image = self.mover_image.clone().ok_or_else(|| {
            CsiError::FailedPrecondition(format!(
                "volume {}: the controller has no --mover-image, the image its movers run",
                vol.id
            ))
        })?;
        let plan = self.move_plan(vol, &params, &sharing, &home, &access, to, image)?;
        self.moves.ensure_pre_copy(plan);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn move_plan(
        &self,
        vol: &Volume,
        params: &VolumeParams,
        sharing: &Sharing,
        home: &MemberVolume,
        access: &MemberVolume,
        here: &str,
        image: String,
    ) -> CsiResult<Plan> {
        let target = MemberVolume {
            member: here.to_string(),
            selected_node: None,
            claim_uid: None,
            ..home.clone()
        };
        let member_params = params_in(params, Some(sharing), here);
        let mut claim = pvc::manifest(&pvc::ClaimPlan {
            vol,
            at: &target,
            params: &member_params,
            data_source: None,
            selected_node: None,
            driver_name: &self.driver_name,
        });
        claim
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(MOVED_FROM_ANNOTATION.into(), home.member.clone());
        let host = self.host.clone().and_then(|h| {
            params
                .pv_name
                .clone()
                .or_else(|| Some(vol.name.clone()))
                .map(|pv| (h, pv))
        });
        Ok(Plan {
            volume_id: vol.id.clone(),
            uuid: home.uuid.clone(),
            from: self.cluster(&home.member)?.clone(),
            to: self.cluster(here)?.clone(),
            data: home.clone(),
            access: access.clone(),
            target_claim: claim,
            image,
            path: self.mover_path,
            block: vol
                .capabilities
                .iter()
                .any(|c| c.access == crate::domain::capability::AccessType::Block),
            host,
            host_claim: params.pvc_namespace.clone().zip(params.pvc_name.clone()),
        })
    }

    /// FAILED_PRECONDITION while anything uses the volume outside `here`: a
    /// finished attachment of any mode on a host node of another member,
    /// or an access claim there (a move copies a volume nothing writes).
    async fn held_for_move(
        &self,
        vol: &Volume,
        access: &MemberVolume,
        sharing: &Sharing,
        here: &str,
        node_id: &str,
    ) -> CsiResult<()> {
        self.held_by_another(vol, access, sharing, here, node_id, true)
            .await
    }

    /// After the switch: the movers go; the old member's data claim goes
    /// once a pod ran on the new copy (`movedDataRetention: delete`), unless
    /// the volume is on its way back there.
    fn after_move(
        &self,
        vol: &Volume,
        home: &MemberVolume,
        access: &MemberVolume,
        here: &str,
        retention: Retention,
    ) {
        let (Ok(from), Ok(to)) = (self.cluster(&home.member), self.cluster(here)) else {
            return;
        };
        let (from, to) = (from.clone(), to.clone());
        let (old, access, id, uuid) = (
            home.clone(),
            MemberVolume {
                member: here.to_string(),
                claim_uid: None,
                ..access.clone()
            },
            vol.id.clone(),
            home.uuid.clone(),
        );
        let moves = self.moves.clone();
        tokio::spawn(async move {
            // The target's mover went at the switch, before the import.
            if let Err(e) = mover_pod::remove_all(&from, &uuid, &old.namespace).await {
                tracing::warn!(volume_id = %id, member = %from.name(), error = %e, "move: movers left (DeleteVolume or the next move removes them)");
            }
            if retention == Retention::Keep {
                return;
            }
            let deadline = tokio::time::Instant::now() + SERVED_WAIT;
            while tokio::time::Instant::now() < deadline {
                if moving::served_in(&to, &access).await.unwrap_or(false) {
                    if moves.status(&id).is_some() {
                        return; // moving again: the old copy is its target
                    }
                    match pvc::delete(&from, &old, &id).await {
                        Ok(()) => {
                            tracing::info!(volume_id = %id, member = %from.name(), claim = %old.pvc_path(), "move: the old member's claim deleted; a pod ran on the new copy")
                        }
                        Err(e) => {
                            tracing::warn!(volume_id = %id, error = %e, "move: the old member's claim left (DeleteVolume removes it)")
                        }
                    }
                    return;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        });
    }

    /// A move given up because a pod of the volume runs in its own member
    /// again: the volume never left. Its movers go from both members, and
    /// the copy's claim in `to` goes when it never got storage (Pending: a
    /// class or a size that member refuses); a Bound copy stays, so that a
    /// later move sends only what changed (DeleteVolume removes it). A
    /// new move of the volume started meanwhile keeps what it finds.
    fn stay_home(
        &self,
        vol: &Volume,
        params: &VolumeParams,
        home: &MemberVolume,
        to: &str,
        last: moving::Status,
    ) {
        let (Ok(from), Ok(target)) = (self.cluster(&home.member), self.cluster(to)) else {
            return;
        };
        let (from, target, home, id) = (from.clone(), target.clone(), home.clone(), vol.id.clone());
        let (to, moves, host) = (to.to_string(), self.moves.clone(), self.host.clone());
        let claim = params.pvc_namespace.clone().zip(params.pvc_name.clone());
        tokio::spawn(async move {
            let copy = MemberVolume {
                member: to.clone(),
                selected_node: None,
                claim_uid: None,
                ..home.clone()
            };
            let mut left = Vec::new();
            for c in [&from, &target] {
                if moves.status(&id).is_some() {
                    return;
                }
                if let Err(e) = mover_pod::remove_all(c, &home.uuid, &home.namespace).await {
                    left.push(format!("{}: movers left: {e}", c.label()));
                }
            }
            let unbound = match pvc::get(&target, &copy.namespace, &copy.pvc).await {
                Ok(Some(c)) => pvc::belongs_to(&c, &id) && pvc::phase(&c) != "Bound",
                Ok(None) => false,
                Err(e) => {
                    left.push(format!(
                        "{}: the copy's claim not read: {e}",
                        target.label()
                    ));
                    false
                }
            };
            let mut kept = "its copy there is kept for a later move";
            if unbound && moves.status(&id).is_none() {
                kept = "its copy's claim there, never provisioned, deleted";
                if let Err(e) = pvc::delete(&target, &copy, &id).await {
                    left.push(format!("{}: the copy's claim left: {e}", target.label()));
                }
            }
            let note = format!(
                "volume {id} stays in member cluster {}: a pod of it runs there again, so its move to member cluster {to} stopped ({}); {kept}{}",
                home.member,
                moving::describe(&last),
                if left.is_empty() { String::new() } else { format!("; DeleteVolume or the next move clears: {}", left.join("; ")) }
            );
            tracing::info!(volume_id = %id, from = %home.member, to = %to, "{note}");
            if let Some(host) = host {
                let mut shown = moving::move_status(&home.member, &last, None);
                shown.phase = "Stopped".into();
                shown.message = Some(note.clone());
                crate::k8s::relay_move::report(&host, &id, &shown).await;
                if let Some(claim) = claim {
                    crate::k8s::relay_move::tell(
                        &host,
                        &claim,
                        &crate::k8s::relay_move::STOPPED,
                        &note,
                    )
                    .await;
                }
            }
        });
    }

    /// Before a pod's import is made in the volume's home: no attachment
    /// there of the data claim's PV, which only movers mount
    /// (`attachments`); one found, the movers go and the wait is for the
    /// member to detach it. Two reads when there is none. A pod of the
    /// volume running there holds the attachment they share: nothing is
    /// detached under it then, and nothing waits.
    async fn settle_home(
        &self,
        vol: &Volume,
        home: &MemberVolume,
        access: &MemberVolume,
    ) -> CsiResult<()> {
        let c = self.cluster(&home.member)?;
        let claim = pvc::get(c, &home.namespace, &home.pvc).await?;
        let Some(pv) = claim.as_ref().and_then(pvc::bound_pv) else {
            return Ok(());
        };
        if attachments::of(c, &[pv]).await?.is_empty()
            || !import::pods_using(c, access).await?.is_empty()
        {
            return Ok(());
        }
        mover_pod::remove_all(c, &home.uuid, &home.namespace).await?;
        let why = format!("the pod of volume {} back in its member", vol.id);
        attachments::wait_gone(c, &[pv], ATTACH_SETTLE, &why).await
    }

    /// DeleteVolume of a movable volume: every member's movers, and the
    /// data claims a move left outside the volume's home (an old copy, a
    /// target never switched to).
    pub(super) async fn delete_moved(
        &self,
        vol: &Volume,
        sharing: &Sharing,
        home: &MemberVolume,
    ) -> CsiResult<()> {
        self.moves.finish(&vol.id);
        for member in sharing.members().filter(|m| !self.is_lost(m)) {
            let c = self.cluster(member)?;
            mover_pod::remove_all(c, &home.uuid, &home.namespace).await?;
            if member != home.member {
                let left = MemberVolume {
                    member: member.to_string(),
                    claim_uid: None,
                    ..home.clone()
                };
                pvc::delete(c, &left, &vol.id).await?;
            }
        }
        Ok(())
    }
}

/// On a move's target claim: the member it came from.
pub const MOVED_FROM_ANNOTATION: &str = "relay.csi.dev/moved-from";
