//! The decisions of a move (`home`), against scripted API servers: a node
//! of the volume's own member needs none, and a move that cannot run is
//! refused before anything is made in either member.

use super::*;

fn movable_volume(b: &MemberBackend) -> Volume {
    let parameters: BTreeMap<String, String> = [
        ("memberNamespace", "relay"),
        ("movableBetween", "east=fast,west=slow"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    volume_placed_in_east(b, "pvc-78", parameters, AccessMode::SingleNodeWriter)
}

/// `moved_home(vol, node)` while the host answers for that node, and
/// neither member is asked anything.
async fn moved_home_with(
    b: &MemberBackend,
    c: (&mut MockApi, &mut MockApi, &mut MockApi),
    vol: &Volume,
    node: (&str, &str),
) -> CsiResult<Option<Backing>> {
    let (host, east, west) = c;
    let (result, (), (), ()) = tokio::join!(
        b.moved_home(vol, node.0),
        async {
            host.expect("GET", &format!("/api/v1/nodes/{}", node.0))
                .await
                .ok(host_node(node.0, node.1, &format!("{}-1", node.1)));
        },
        east.expect_idle(),
        west.expect_idle()
    );
    result
}

/// `moved_home(vol, node of east)`: east answers what `east_side`
/// scripts, west is asked nothing.
async fn at_home_with<F: std::future::Future<Output = ()>>(
    b: &MemberBackend,
    host: &mut MockApi,
    west: &mut MockApi,
    vol: &Volume,
    east_side: F,
) -> CsiResult<Option<Backing>> {
    let (result, (), (), ()) = tokio::join!(
        b.moved_home(vol, "host-e"),
        async {
            host.expect("GET", "/api/v1/nodes/host-e")
                .await
                .ok(host_node("host-e", "east", "east-1"));
        },
        east_side,
        west.expect_idle()
    );
    result
}

/// The data claim's path in east, and the claim bound to PV `pv-data`.
fn data_claim(vol: &Volume) -> (String, String, serde_json::Value) {
    let home = MemberVolume::of(vol).expect("member volume");
    let path = format!(
        "/api/v1/namespaces/{}/persistentvolumeclaims/{}",
        home.namespace, home.pvc
    );
    let claim = json!({"metadata": {"name": home.pvc, "namespace": home.namespace, "uid": "c1"},
        "spec": {"volumeName": "pv-data"}, "status": {"phase": "Bound"}});
    (home.uuid, path, claim)
}

fn attachment_of_data(deleting: bool) -> serde_json::Value {
    let mut va = json!({"metadata": {"name": "csi-abc"},
        "spec": {"attacher": "fast.csi", "nodeName": "east-1",
                 "source": {"persistentVolumeName": "pv-data"}}});
    if deleting {
        va["metadata"]["deletionTimestamp"] = json!("2026-12-06T17:21:19Z");
    }
    va
}

const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";
const PODS: &str = "/api/v1/namespaces/relay/pods";

/// What `mover_pod::remove_all` asks when no mover is there: each pod,
/// the Secret, each pod again.
async fn movers_removed(east: &mut MockApi, uuid: &str) {
    let pods = format!("/api/v1/namespaces/relay/pods/relay-{uuid}-mover");
    let secret = format!("/api/v1/namespaces/relay/secrets/relay-{uuid}-mover");
    for role in ["source", "target"] {
        east.expect("GET", &format!("{pods}-{role}"))
            .await
            .not_found();
    }
    east.expect("DELETE", &secret).await.not_found();
    for role in ["source", "target"] {
        east.expect("GET", &format!("{pods}-{role}"))
            .await
            .not_found();
    }
}

#[tokio::test(start_paused = true)]
async fn a_volume_of_a_movable_class_is_everywhere_and_a_node_of_its_member_moves_nothing() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let b = b.with_mover_image(Some("csi-relay:test".into()));
    let vol = movable_volume(&b);
    let members: Vec<&str> = vol
        .topology
        .iter()
        .filter_map(|t| t.get(TOPOLOGY_MEMBER_KEY).map(String::as_str))
        .collect();
    assert_eq!(members, ["east", "west"], "{:?}", vol.topology);
    let (_, claim_path, claim) = data_claim(&vol);
    // Two reads: no mover's attachment of the data claim's PV is left.
    let found = at_home_with(&b, &mut host, &mut west, &vol, async {
        east.expect("GET", &claim_path).await.ok(claim);
        east.expect("GET", VAS).await.ok(json!({"items": [
            {"metadata": {"name": "csi-other"},
             "spec": {"attacher": "fast.csi", "nodeName": "east-1",
                      "source": {"persistentVolumeName": "pv-other"}}}]}));
        east.expect_idle().await;
    })
    .await;
    assert!(matches!(found, Ok(None)), "{found:?}");
}

/// A pod back in the volume's member after a move it asked for stopped:
/// the import it uses waits until the member detached what the source
/// mover held, since both PVs share one attachment per node.
#[tokio::test(start_paused = true)]
async fn a_pod_back_home_waits_until_the_movers_attachment_is_detached() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let b = b.with_mover_image(Some("csi-relay:test".into()));
    let vol = movable_volume(&b);
    let (uuid, claim_path, claim) = data_claim(&vol);
    let found = at_home_with(&b, &mut host, &mut west, &vol, async {
        east.expect("GET", &claim_path).await.ok(claim);
        east.expect("GET", VAS)
            .await
            .ok(json!({"items": [attachment_of_data(false)]}));
        east.expect("GET", PODS).await.ok(json!({"items": []}));
        movers_removed(&mut east, &uuid).await;
        east.expect("GET", VAS)
            .await
            .ok(json!({"items": [attachment_of_data(true)]}));
        east.expect("GET", VAS).await.ok(json!({"items": []}));
        east.expect_idle().await;
    })
    .await;
    assert!(matches!(found, Ok(None)), "{found:?}");
}

/// A pod of the volume still running there (another replica, on the
/// access claim) holds the attachment the mover's PV shares: nothing is
/// detached under it, so the publish goes on without a wait or a removal.
#[tokio::test(start_paused = true)]
async fn a_pod_running_there_holds_the_attachment_and_nothing_waits() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let b = b.with_mover_image(Some("csi-relay:test".into()));
    let vol = movable_volume(&b);
    let (_, claim_path, claim) = data_claim(&vol);
    let found = at_home_with(&b, &mut host, &mut west, &vol, async {
        east.expect("GET", &claim_path).await.ok(claim);
        east.expect("GET", VAS)
            .await
            .ok(json!({"items": [attachment_of_data(false)]}));
        east.expect("GET", PODS).await.ok(json!({"items": [
            {"metadata": {"name": "app-1", "namespace": "relay"},
             "spec": {"nodeName": "east-1", "containers": [],
                      "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
             "status": {"phase": "Running"}}]}));
        east.expect_idle().await;
    })
    .await;
    assert!(matches!(found, Ok(None)), "{found:?}");
}

/// An attachment that never goes: UNAVAILABLE after the budget, naming
/// it, so the attacher retries within its own timeout.
#[tokio::test(start_paused = true)]
async fn an_attachment_that_stays_makes_the_publish_retry_naming_it() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let b = b.with_mover_image(Some("csi-relay:test".into()));
    let vol = movable_volume(&b);
    let (uuid, claim_path, claim) = data_claim(&vol);
    let found = at_home_with(&b, &mut host, &mut west, &vol, async {
        east.expect("GET", &claim_path).await.ok(claim);
        east.expect("GET", VAS)
            .await
            .ok(json!({"items": [attachment_of_data(true)]}));
        east.expect("GET", PODS).await.ok(json!({"items": []}));
        movers_removed(&mut east, &uuid).await;
        // 25 s, a read each 500 ms.
        for _ in 0..51 {
            east.expect("GET", VAS)
                .await
                .ok(json!({"items": [attachment_of_data(true)]}));
        }
        east.expect_idle().await;
    })
    .await;
    let err = found.expect_err("refused");
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let says = err.to_string();
    assert!(
        says.contains("VolumeAttachment csi-abc of PV pv-data to node east-1 (being detached)"),
        "{says}"
    );
    assert!(says.contains("retry"), "{says}");
}

#[tokio::test(start_paused = true)]
async fn a_move_without_the_mover_image_is_refused_before_anything_is_made() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let vol = movable_volume(&b);
    let err = moved_home_with(
        &b,
        (&mut host, &mut east, &mut west),
        &vol,
        ("host-w", "west"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let says = err.to_string();
    assert!(
        says.contains("cannot move to member cluster west"),
        "{says}"
    );
    assert!(says.contains("--mover-image"), "{says}");
}

#[tokio::test(start_paused = true)]
async fn a_volume_whose_member_is_lost_does_not_move() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let b = b
        .with_mover_image(Some("csi-relay:test".into()))
        .with_lost_members(["east".to_string()]);
    let vol = movable_volume(&b);
    let err = moved_home_with(
        &b,
        (&mut host, &mut east, &mut west),
        &vol,
        ("host-w", "west"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("declared lost"), "{err}");
}

/// A pre-copy asked for a member the class does not list, or without the
/// mover image, is refused naming why, before either member is asked.
#[tokio::test(start_paused = true)]
async fn a_pre_copy_the_class_or_controller_cannot_serve_is_refused_before_anything_is_made() {
    let Clusters {
        b,
        mut east,
        mut west,
        host: _host,
    } = clusters();
    let vol = movable_volume(&b);
    let (result, (), ()) = tokio::join!(
        b.keep_copy(&vol, Some("north")),
        east.expect_idle(),
        west.expect_idle()
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.to_string().contains("\"north\" is not one of"), "{err}");
    let (result, (), ()) = tokio::join!(
        b.keep_copy(&vol, Some("west")),
        east.expect_idle(),
        west.expect_idle()
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("--mover-image"), "{err}");
    // Its own member: a no-op.
    let (own, (), ()) = tokio::join!(
        b.keep_copy(&vol, Some("east")),
        east.expect_idle(),
        west.expect_idle()
    );
    assert!(own.is_ok(), "{own:?}");
    // Nothing asked of a volume this process moves not: movers another
    // leader's pre-copy left are removed in every member (none here).
    let uuid = MemberVolume::of(&vol).unwrap().uuid;
    let (none, (), ()) = tokio::join!(
        b.keep_copy(&vol, None),
        no_movers(&mut east, &uuid),
        no_movers(&mut west, &uuid)
    );
    assert!(none.is_ok(), "{none:?}");
}

/// A member asked to remove a volume's movers, holding none: both pods
/// looked for, the Secret deleted (gone already), the pods looked for once
/// more.
async fn no_movers(api: &mut MockApi, uuid: &str) {
    let ns = "/api/v1/namespaces/relay";
    for round in 0..2 {
        for role in ["source", "target"] {
            api.expect("GET", &format!("{ns}/pods/relay-{uuid}-mover-{role}"))
                .await
                .not_found();
        }
        if round == 0 {
            api.expect("DELETE", &format!("{ns}/secrets/relay-{uuid}-mover"))
                .await
                .not_found();
        }
    }
}
