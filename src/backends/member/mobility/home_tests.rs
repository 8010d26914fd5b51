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
    let found = moved_home_with(
        &b,
        (&mut host, &mut east, &mut west),
        &vol,
        ("host-e", "east"),
    )
    .await;
    assert!(matches!(found, Ok(None)), "{found:?}");
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
