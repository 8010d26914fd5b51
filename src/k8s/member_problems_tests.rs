//! A member's warnings on claims against scripted member and host APIs:
//! which reach the host, how, and when they go.

use kube::runtime::reflector;
use serde_json::{json, Value};

use super::*;
use crate::k8s::relay_volume::{RelayVolume, RelayVolumeSpec, RelayVolumeStatus};
use crate::k8s::testing::{self, MockApi};

const ID: &str = "m-east-00000000000000000000000000000001";
const CLAIM: &str = "/api/v1/namespaces/shop/persistentvolumeclaims/data";

fn member_claim(uid: &str, phase: &str, ours: bool) -> Value {
    let mut claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "shop", "uid": uid},
        "spec": {}, "status": {"phase": phase}});
    if ours {
        claim["metadata"]["labels"] = json!({naming::MANAGED_BY: naming::MANAGER});
        claim["metadata"]["annotations"] = json!({naming::VOLUME_ID_ANNOTATION: ID});
    }
    claim
}

fn warning(uid: &str) -> Warning {
    Warning {
        claim: ("shop".into(), "data".into()),
        uid: Some(uid.into()),
        said: "ProvisioningFailed: error generating accessibility requirements: no available topology found".into(),
    }
}

/// The problems of member "east", with the controller's view holding the
/// volume's RelayVolume (host claim shop/data) showing `last_error`.
fn problems(
    last_error: Option<&str>,
) -> (
    Problems,
    MockApi,
    MockApi,
    reflector::store::Writer<crate::k8s::relay_volume::Seen>,
) {
    let (member_client, member) = testing::client();
    let (host, host_api) = testing::host();
    let (reader, mut writer) = crate::k8s::relay_volume::new_view();
    writer.apply_watcher_event(&crate::k8s::relay_volume::applied(relay_volume(last_error)));
    (
        Problems::new("east".into(), member_client, host, reader),
        member,
        host_api,
        writer,
    )
}

fn relay_volume(last_error: Option<&str>) -> RelayVolume {
    let mut rv = RelayVolume::new(
        ID,
        RelayVolumeSpec {
            volume_id: ID.into(),
            volume_name: "pvc-1".into(),
            capacity_bytes: 1 << 30,
            member: Some("east".into()),
            member_pvc: Some("shop/data".into()),
            host_pvc: Some("shop/data".into()),
            record: String::new(),
            format_version: 1,
            leader_term: None,
        },
    );
    rv.status = Some(RelayVolumeStatus {
        last_error: last_error.map(str::to_string),
        ..Default::default()
    });
    rv
}

const SHOWN: &str = "member east: PersistentVolumeClaim shop/data is not provisioned: ProvisioningFailed: error generating accessibility requirements: no available topology found";

#[tokio::test(start_paused = true)]
async fn a_relay_claim_the_member_cannot_provision_is_shown_on_its_relay_volume_and_host_claim() {
    let (mut p, mut member, mut host, mut view) = problems(None);
    let ((), ()) = tokio::join!(p.warned(warning("uid-1")), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-1", "Pending", true));
        let shown = host
            .expect(
                "PATCH",
                &format!("/apis/relay.csi.dev/v1alpha1/relayvolumes/{ID}/status"),
            )
            .await;
        assert_eq!(
            shown.query_map().get("fieldManager").map(String::as_str),
            Some("csi-relay-errors"),
            "the manager the controller's own failure notes use"
        );
        assert_eq!(shown.body["status"]["lastError"], SHOWN);
        shown.echo();
        host.expect("GET", "/api/v1/namespaces/shop/persistentvolumeclaims/data")
            .await
            .ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": "data", "namespace": "shop", "uid": "host-uid"}}));
        let event = host
            .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
            .await;
        assert_eq!(event.body["type"], "Warning");
        assert_eq!(event.body["reason"], "MemberProvisioningFailed");
        assert_eq!(event.body["note"], SHOWN);
        assert_eq!(event.body["regarding"]["uid"], "host-uid");
        assert_eq!(event.body["regarding"]["kind"], "PersistentVolumeClaim");
        event.created();
        host.expect_idle().await;
    });

    // The member repeats itself (the event's count goes up): nothing new,
    // not even a read of the claim.
    let ((), ()) = tokio::join!(p.warned(warning("uid-1")), async {
        member.expect_idle().await;
        host.expect_idle().await;
    });

    // Still Pending: it stays. Then the claim binds: LAST-ERROR goes.
    let ((), ()) = tokio::join!(p.recheck(), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-1", "Pending", true));
        host.expect_idle().await;
    });
    view.apply_watcher_event(&crate::k8s::relay_volume::applied(relay_volume(Some(
        SHOWN,
    ))));
    let ((), ()) = tokio::join!(p.recheck(), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-1", "Bound", true));
        let cleared = host
            .expect(
                "PATCH",
                &format!("/apis/relay.csi.dev/v1alpha1/relayvolumes/{ID}/status"),
            )
            .await;
        assert!(
            cleared.body["status"].get("lastError").is_none(),
            "{}",
            cleared.body
        );
        cleared.echo();
    });
    let ((), ()) = tokio::join!(p.recheck(), async {
        member.expect_idle().await;
        host.expect_idle().await;
    });
}

#[tokio::test(start_paused = true)]
async fn a_call_that_wrote_since_keeps_its_last_error() {
    let (mut p, mut member, mut host, mut view) = problems(None);
    let ((), ()) = tokio::join!(p.warned(warning("uid-1")), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-1", "Pending", true));
        host.next().await.echo();
        host.next().await.not_found(); // no host claim: no event
        host.expect_idle().await;
    });
    view.apply_watcher_event(&crate::k8s::relay_volume::applied(relay_volume(Some(
        "ControllerPublishVolume: Unavailable: ...",
    ))));
    let ((), ()) = tokio::join!(p.recheck(), async {
        member.expect("GET", CLAIM).await.not_found();
        host.expect_idle().await;
    });
    assert!(p.open.is_empty());
}

#[tokio::test(start_paused = true)]
async fn warnings_of_other_claims_are_not_shown_and_foreign_ones_read_once() {
    let (mut p, mut member, mut host, _view) = problems(None);
    // Not the relay's claim: read once, then known.
    let ((), ()) = tokio::join!(p.warned(warning("uid-9")), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-9", "Pending", false));
    });
    let ((), ()) = tokio::join!(p.warned(warning("uid-9")), async {
        member.expect_idle().await;
    });
    // The relay's claim, but the warning was of an earlier claim of the
    // name, or the claim is bound: nothing is shown.
    let (mut p, mut member, mut host2, _view) = problems(None);
    for (uid, phase) in [("uid-old", "Pending"), ("uid-1", "Bound")] {
        let ((), ()) = tokio::join!(p.warned(warning(uid)), async {
            member
                .expect("GET", CLAIM)
                .await
                .ok(member_claim("uid-1", phase, true));
            host2.expect_idle().await;
        });
    }
    host.expect_idle().await;
    assert!(p.open.is_empty());
}

#[test]
fn only_claim_warnings_are_read_and_their_text_is_bounded() {
    let mut event = Event {
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("shop".into()),
            name: Some("data".into()),
            uid: Some("u".into()),
            ..Default::default()
        },
        reason: Some("ProvisioningFailed".into()),
        message: Some("x".repeat(2000)),
        ..Default::default()
    };
    let w = Warning::of(&event).expect("a claim's warning");
    assert_eq!(w.claim, ("shop".to_string(), "data".to_string()));
    assert!(w.said.len() <= MEMBER_WORDS + '…'.len_utf8());
    event.involved_object.kind = Some("Pod".into());
    assert_eq!(Warning::of(&event), None);
}

#[tokio::test(start_paused = true)]
async fn a_warning_the_host_did_not_take_is_shown_at_the_next_one() {
    let (mut p, mut member, mut host, _view) = problems(None);
    let ((), ()) = tokio::join!(p.warned(warning("uid-1")), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-1", "Pending", true));
        host.next()
            .await
            .status(500, "InternalError", "etcd is having a bad day");
        host.expect_idle().await;
    });
    assert!(p.open.is_empty(), "not shown: nothing to clear later");
    let ((), ()) = tokio::join!(p.warned(warning("uid-1")), async {
        member
            .expect("GET", CLAIM)
            .await
            .ok(member_claim("uid-1", "Pending", true));
        let shown = host.next().await;
        assert_eq!(shown.body["status"]["lastError"], SHOWN);
        shown.echo();
        host.next().await.not_found(); // no host claim: no event
        host.expect_idle().await;
    });
    assert_eq!(p.open.len(), 1);
}
