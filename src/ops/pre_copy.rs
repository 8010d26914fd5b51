//! Pre-copy: a host claim labelled `relay.csi.dev/pre-copy-to=<member>`
//! asks for its volume's copy in that member ahead of a move, while its
//! pods still run where the volume is. The relay keeps the copy in sync by
//! repeated passes (`Backend::pre_copy`), so that when a pod of the claim
//! lands in that member the move sends only what changed since the last
//! pass: a cutover of seconds. Taking the label off stops the passes.
//!
//! A label, not an annotation, so that the leader lists only the claims
//! that ask (a label selector), every `EVERY`, instead of watching every
//! claim of the host: a lost or refused request is asked again at the next
//! round, and a new leader takes up what the old one kept.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};

use crate::k8s::cluster::Cluster;
use crate::ops::driver::Driver;
use crate::rt::limiter::volume_key;

pub const PRE_COPY_LABEL: &str = "relay.csi.dev/pre-copy-to";
const EVERY: Duration = Duration::from_secs(10);

/// What was asked, per volume id: the member.
type Asked = BTreeMap<String, String>;

/// The volume id and member each labelled claim of the driver's volumes
/// asks for.
async fn asked(d: &Driver, host: &Cluster) -> Result<Asked, String> {
    let api = Api::<PersistentVolumeClaim>::all(host.client());
    let list = host
        .run(
            &format!("list PersistentVolumeClaims labelled {PRE_COPY_LABEL}"),
            api.list(&ListParams::default().labels(PRE_COPY_LABEL)),
        )
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Asked::new();
    for claim in list.items {
        let to = claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PRE_COPY_LABEL))
            .cloned()
            .unwrap_or_default();
        let Some(pv) = claim.spec.and_then(|s| s.volume_name) else {
            continue;
        };
        // The claim names the PV; the PV's name is the volume's CSI name.
        let found = d.db(move |s| s.volume_by_name(&pv)).await;
        if let Ok(Some(vol)) = found {
            out.insert(vol.id, to);
        }
    }
    Ok(out)
}

/// One round: each asked volume's pre-copy ensured, each no longer asked
/// stopped; returns what is now kept (a volume whose lock was busy, or
/// whose request failed, is asked again next round).
async fn round(d: &Driver, host: &Cluster, kept: &Asked) -> Asked {
    let now = match asked(d, host).await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, "pre-copy: cannot list the claims that ask for one; next round");
            return kept.clone();
        }
    };
    let mut next = Asked::new();
    let gone: Vec<(&String, Option<&String>)> = kept
        .keys()
        .filter(|id| !now.contains_key(*id))
        .map(|id| (id, None))
        .collect();
    let wanted = now.iter().map(|(id, to)| (id, Some(to)));
    for (id, to) in wanted.chain(gone) {
        let Ok(_guard) = d.limiter.try_acquire(&[volume_key(id)]) else {
            if let Some(to) = kept.get(id) {
                next.insert(id.clone(), to.clone());
            }
            continue;
        };
        let key = id.clone();
        let vol = match d.db(move |s| s.volume(&key)).await {
            Ok(Some(v)) => v,
            _ => continue,
        };
        match d.backend.pre_copy(&vol, to.map(String::as_str)).await {
            Ok(()) => {
                if let Some(to) = to {
                    if kept.get(id) != Some(to) {
                        tracing::info!(volume_id = %id, to = %to, "pre-copy asked: passes keep a copy there in sync");
                    }
                    next.insert(id.clone(), to.clone());
                }
            }
            Err(e) => {
                tracing::warn!(volume_id = %id, error = %e, "pre-copy refused; asked again next round")
            }
        }
    }
    next
}

/// Every volume of a class whose volumes move, as kept by no member.
async fn movable(d: &Driver) -> Asked {
    match d.store.all_volumes().await {
        Ok(all) => all
            .into_iter()
            .filter(|v| v.parameters.contains_key("movableBetween"))
            .map(|v| (v.id, String::new()))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "pre-copy: the store's volumes not read; movers an earlier leader left stay until their volume moves or goes");
            Asked::new()
        }
    }
}

/// Rounds every `EVERY` until the process ends (the leader's).
pub fn spawn(d: Driver, host: Cluster) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // A new leader knows none of the pre-copies an old one kept: every
        // movable volume counts as kept at first, so that one no longer
        // asked has its movers removed (`Backend::pre_copy` with `None`
        // removes them where this process runs no move of the volume).
        let mut kept = movable(&d).await;
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            kept = round(&d, &host, &kept).await;
        }
    })
}
