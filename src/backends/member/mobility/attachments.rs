//! A member's VolumeAttachments of a movable volume, read before a new
//! kind of user of it starts there: a mover, or the import pods use.
//!
//! A movable volume has two PVs in its member that name one volume handle:
//! the data claim's (the movers mount it) and the import's (the pods do).
//! The member's attach/detach controller knows a CSI volume by driver and
//! handle, and names its VolumeAttachment from them and the node alone
//! (`csi-<sha256(handle, driver, node)>`), so both PVs share one
//! attachment per node. A user of one PV that arrives while the other's
//! attachment is being detached finds it "already there", is reported
//! attached, and its kubelet then waits for an attachment that goes: a
//! block move's source mover stayed ContainerCreating for minutes this
//! way (2026-12-06, `mobility_block_e2e`, hostpath with attach required).
//! So the relay lets the new kind of user start only once the old kind's
//! attachments are gone; a driver that needs no attach has none, and waits
//! for nothing.

use std::time::Duration;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};

use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;

/// How often a wait reads the attachments again.
const POLL: Duration = Duration::from_millis(500);

/// One VolumeAttachment of one of the PVs asked about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub name: String,
    pub pv: String,
    pub node: String,
    pub detaching: bool,
}

impl Held {
    fn of(va: &VolumeAttachment, pvs: &[&str]) -> Option<Held> {
        let pv = va.spec.source.persistent_volume_name.as_deref()?;
        if !pvs.contains(&pv) {
            return None;
        }
        Some(Held {
            name: va.metadata.name.clone().unwrap_or_default(),
            pv: pv.to_string(),
            node: va.spec.node_name.clone(),
            detaching: va.metadata.deletion_timestamp.is_some(),
        })
    }
}

/// Lists what holds the attachments of `pvs` in `c`, as
/// "VolumeAttachment N of PV P to node X (being detached)".
pub fn describe(held: &[Held]) -> String {
    held.iter()
        .map(|h| {
            format!(
                "VolumeAttachment {} of PV {} to node {}{}",
                h.name,
                h.pv,
                h.node,
                if h.detaching { " (being detached)" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Of a new user's attachments found, those it must wait out: with a pod
/// of the volume running there (`shared`: the new user goes on that pod's
/// node), the attachment they share holds nothing back unless it is being
/// detached; with none, every attachment found is one being detached, or
/// about to be.
pub fn holding(found: Vec<Held>, shared: bool) -> Vec<Held> {
    found
        .into_iter()
        .filter(|h| !shared || h.detaching)
        .collect()
}

/// The VolumeAttachments of `c` whose source is one of `pvs`.
pub async fn of(c: &Cluster, pvs: &[&str]) -> CsiResult<Vec<Held>> {
    let mut found = Vec::new();
    if pvs.is_empty() {
        return Ok(found);
    }
    let api = Api::<VolumeAttachment>::all(c.client());
    c.list_pages(
        "list VolumeAttachments",
        &api,
        ListParams::default(),
        |page: Vec<VolumeAttachment>| {
            found.extend(page.iter().filter_map(|va| Held::of(va, pvs)));
            Ok::<_, CsiError>(())
        },
    )
    .await?;
    Ok(found)
}

/// Waits (at most `budget`) until `c` has no VolumeAttachment of `pvs`.
/// UNAVAILABLE, naming what still holds one, when the budget runs out.
pub async fn wait_gone(c: &Cluster, pvs: &[&str], budget: Duration, why: &str) -> CsiResult<()> {
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        let held = of(c, pvs).await?;
        if held.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CsiError::Unavailable(format!(
                "{}: {why} waits until {} is gone (the member's attach/detach controller detaches it once no pod there uses it; retry)",
                c.label(),
                describe(&held)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn va(name: &str, pv: &str, node: &str, deleting: bool) -> VolumeAttachment {
        let mut v = json!({
            "metadata": {"name": name},
            "spec": {"attacher": "hostpath.csi.k8s.io", "nodeName": node,
                     "source": {"persistentVolumeName": pv}},
        });
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-12-06T17:21:19Z");
        }
        serde_json::from_value(v).expect("VolumeAttachment")
    }

    #[test]
    fn only_the_pvs_asked_about_count_and_a_deletion_reads_as_detaching() {
        let pvs = ["relay-0a1b-import", "pvc-1"];
        let import = Held::of(&va("csi-1", "relay-0a1b-import", "n1", true), &pvs);
        assert_eq!(
            import,
            Some(Held {
                name: "csi-1".into(),
                pv: "relay-0a1b-import".into(),
                node: "n1".into(),
                detaching: true,
            })
        );
        assert!(Held::of(&va("csi-2", "pvc-other", "n1", false), &pvs).is_none());
        let data = Held::of(&va("csi-3", "pvc-1", "n2", false), &pvs);
        assert_eq!(data.as_ref().map(|h| h.detaching), Some(false));
        let text = describe(&[import.expect("import"), data.expect("data")]);
        assert_eq!(
            text,
            "VolumeAttachment csi-1 of PV relay-0a1b-import to node n1 (being detached), VolumeAttachment csi-3 of PV pvc-1 to node n2"
        );
    }

    #[test]
    fn a_shared_attachment_holds_back_only_while_it_is_being_detached() {
        let pvs = ["pv-data"];
        let attached = Held::of(&va("csi-1", "pv-data", "n1", false), &pvs).expect("held");
        let detaching = Held::of(&va("csi-2", "pv-data", "n2", true), &pvs).expect("held");
        let both = vec![attached.clone(), detaching.clone()];
        // Nobody of the volume there: each one is on its way out.
        assert_eq!(holding(both.clone(), false), both);
        // A pod there (a pre-copy's source goes next to it): only the one
        // being detached.
        assert_eq!(holding(both, true), vec![detaching]);
        assert!(holding(vec![attached], true).is_empty());
    }

    #[test]
    fn an_attachment_of_an_inline_volume_names_no_pv_and_never_counts() {
        let mut inline = va("csi-4", "pvc-1", "n1", false);
        inline.spec.source.persistent_volume_name = None;
        assert!(Held::of(&inline, &["pvc-1"]).is_none());
    }
}
