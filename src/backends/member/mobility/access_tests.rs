//! Gated access (`access`) against scripted API servers: a single-writer
//! shared volume's data claim under the generated name, the access claim
//! made in the origin too, the writer refused while another member holds
//! the volume, a copy with the relay's marks that holds nothing, and the
//! access claim removed at the origin's last unpublish.

use super::*;

fn gated_volume(b: &MemberBackend) -> Volume {
    placed_volume(b, AccessMode::SingleNodeWriter)
}

fn data_claim(vol: &Volume) -> String {
    naming::pvc_name(&MemberVolume::of(vol).unwrap().uuid)
}

/// The relay's access claim `data` in a member: bound to the import PV.
fn access_claim(vol: &Volume) -> Value {
    let pv = import::pv_name(&MemberVolume::of(vol).unwrap().uuid);
    let mut c = claim_of(vol, "Bound", Some(&pv));
    c["metadata"]["labels"] = json!({import::IMPORTED_FROM_LABEL: "east"});
    c
}

#[tokio::test]
async fn a_single_writer_volume_keeps_its_data_under_the_generated_name() {
    let b = clusters().b;
    let rwo = gated_volume(&b);
    assert_eq!(MemberVolume::of(&rwo).unwrap().pvc, data_claim(&rwo));
    assert_eq!(rwo.context[source::MEMBER_PVC], data_claim(&rwo));
    let rwx = placed_volume(&b, AccessMode::MultiNodeMultiWriter);
    assert_eq!(MemberVolume::of(&rwx).unwrap().pvc, "data");
}

/// A writer's finished attachment on a host node of east: a writer on a
/// node of west is refused naming it, before any member is asked.
#[tokio::test(start_paused = true)]
async fn a_writer_is_refused_while_another_member_holds_a_finished_attachment() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let mut vol = gated_volume(&b);
    let ctx: BTreeMap<String, String> = [(source::MEMBER.to_string(), "east".to_string())].into();
    on_node(&mut vol, "host-e", ctx, Progress::Done);
    on_node(&mut vol, "host-w", BTreeMap::new(), Progress::Applying);
    let (result, (), (), ()) = tokio::join!(
        b.attach(&vol, "host-w"),
        async {
            host.expect("GET", "/api/v1/nodes/host-w")
                .await
                .ok(host_node("host-w", "west", "west-1"));
        },
        east.expect_idle(),
        west.expect_idle()
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string()
            .contains("published for writing to host node host-e (member cluster east)"),
        "{err}"
    );
}

/// West has the access claim and no pod uses it yet: an east writer (the
/// origin's own node) is refused all the same, naming the claim.
#[tokio::test(start_paused = true)]
async fn an_unused_access_claim_in_another_member_holds_the_volume() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let mut vol = gated_volume(&b);
    on_node(&mut vol, "host-e", BTreeMap::new(), Progress::Applying);
    let (result, (), (), ()) = tokio::join!(
        b.attach(&vol, "host-e"),
        async {
            host.expect("GET", "/api/v1/nodes/host-e")
                .await
                .ok(host_node("host-e", "east", "east-1"));
        },
        east.expect_idle(),
        async {
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(access_claim(&vol));
            west.expect_page(PODS).await.ok(pods(vec![]));
            west.expect_idle().await;
        }
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string()
            .contains("held in member cluster west by its access claim relay/data"),
        "{err}"
    );
}

/// In west, a claim `data` as Kosmos copies it, with every mark of the
/// relay's: bound to no import PV, it holds nothing, and east's node goes
/// on to make its access claim from the data claim (missing here, so the
/// call stops there, saying so).
#[tokio::test(start_paused = true)]
async fn a_copy_with_the_relays_marks_holds_nothing() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let mut vol = gated_volume(&b);
    on_node(&mut vol, "host-e", BTreeMap::new(), Progress::Applying);
    let mut copy = access_claim(&vol);
    copy["spec"]["volumeName"] = json!("pvc-host-77");
    copy["spec"]["storageClassName"] = json!("global");
    let data = data_claim(&vol);
    let (result, (), (), ()) = tokio::join!(
        b.attach(&vol, "host-e"),
        async {
            host.expect("GET", "/api/v1/nodes/host-e")
                .await
                .ok(host_node("host-e", "east", "east-1"));
        },
        async {
            east.expect("GET", &format!("{PVCS}/{data}"))
                .await
                .not_found();
            east.expect_idle().await;
        },
        async {
            west.expect("GET", &format!("{PVCS}/data")).await.ok(copy);
            west.expect_idle().await;
        }
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("PersistentVolumeClaim relay/{data} is missing")),
        "{err}"
    );
}

/// The origin's last node lets go: its access claim and PV go there too
/// (the data claim stays); UNAVAILABLE while a pod still uses it.
#[tokio::test(start_paused = true)]
async fn the_origins_last_unpublish_removes_its_access_claim() {
    let Clusters {
        b,
        mut east,
        west: _west,
        host: _host,
    } = clusters();
    let mut vol = gated_volume(&b);
    let ctx: BTreeMap<String, String> = [(source::MEMBER.to_string(), "east".to_string())].into();
    on_node(&mut vol, "host-e", ctx, Progress::Done);
    let uuid = MemberVolume::of(&vol).unwrap().uuid;
    let pv_name = import::pv_name(&uuid);
    let (result, ()) = tokio::join!(b.detach(&vol, "host-e"), async {
        east.expect("GET", &format!("{PVCS}/data"))
            .await
            .ok(access_claim(&vol));
        east.expect_page(PODS)
            .await
            .ok(pods(vec![pod_using("app-0", "east-1")]));
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.to_string().contains("pod relay/app-0 on node east-1"),
        "{err}"
    );

    let import_pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "uid": "p-1", "labels": {
            naming::VOLUME_UUID_LABEL: uuid, import::IMPORTED_FROM_LABEL: "east"}}});
    let (result, ()) = tokio::join!(b.detach(&vol, "host-e"), async {
        east.expect("GET", &format!("{PVCS}/data"))
            .await
            .ok(access_claim(&vol));
        east.expect_page(PODS).await.ok(pods(vec![]));
        east.expect("DELETE", &format!("{PVCS}/data"))
            .await
            .ok(access_claim(&vol));
        east.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
            .await
            .ok(import_pv.clone());
        east.expect("DELETE", &format!("/api/v1/persistentvolumes/{pv_name}"))
            .await
            .ok(import_pv.clone());
        east.expect_idle().await;
    });
    result.unwrap();
}

/// A publish to west was refused (no access claim made there), and a pod
/// placed by hand on a west node names the claim: it mounts nothing of the
/// volume, so the unpublish goes through instead of waiting on it forever.
#[tokio::test(start_paused = true)]
async fn a_pod_naming_a_claim_the_relay_never_made_does_not_hold_the_release() {
    let Clusters {
        b,
        east: _east,
        mut west,
        host: _host,
    } = clusters();
    let mut vol = gated_volume(&b);
    let ctx: BTreeMap<String, String> = [(source::MEMBER.to_string(), "west".to_string())].into();
    on_node(&mut vol, "host-w", ctx, Progress::Applying);
    let pv_name = import::pv_name(&MemberVolume::of(&vol).unwrap().uuid);
    let mut copy = access_claim(&vol);
    copy["spec"]["volumeName"] = json!("pvc-host-77");
    let (result, ()) = tokio::join!(b.detach(&vol, "host-w"), async {
        west.expect("GET", &format!("{PVCS}/data")).await.ok(copy);
        west.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
            .await
            .not_found();
        west.expect_idle().await;
    });
    result.unwrap();
}
