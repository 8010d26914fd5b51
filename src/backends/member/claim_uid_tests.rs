//! The uid of the claim the relay made, kept in the record: the one claim
//! the record names from then on, whatever carries the relay's marks.

use super::*;

/// The record after CreateVolume made the claim `uid`.
fn recorded(b: &MemberBackend, uid: &str) -> Volume {
    let mut vol = standard(b);
    if let Backing::Member { claim_uid, .. } = &mut vol.backing {
        *claim_uid = Some(uid.into());
    }
    vol.lifecycle = Lifecycle::Ready;
    vol
}

fn with_uid(mut claim: Value, uid: &str) -> Value {
    claim["metadata"]["uid"] = uid.into();
    claim
}

#[tokio::test(start_paused = true)]
async fn create_returns_the_record_with_the_uid_of_the_claim_it_made() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let (made, ()) = tokio::join!(b.create_volume(&vol, None), async {
        let post = api.expect("POST", PVCS).await;
        let body = with_uid(post.body.clone(), "uid-made");
        post.reply(201, body);
    });
    let Some(Backing::Member { claim_uid, pvc, .. }) = made.unwrap() else {
        panic!("a member backing")
    };
    assert_eq!(claim_uid.as_deref(), Some("uid-made"));
    assert_eq!(pvc, pvc_name(&vol));

    // A retry that finds the claim of an earlier attempt keeps its uid.
    let name = pvc_name(&vol);
    let (made, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.already_exists();
        api.expect("GET", &format!("{PVCS}/{name}"))
            .await
            .ok(with_uid(claim(&vol, "Pending", None), "uid-earlier"));
    });
    let Some(Backing::Member { claim_uid, .. }) = made.unwrap() else {
        panic!("a member backing")
    };
    assert_eq!(claim_uid.as_deref(), Some("uid-earlier"));
}

// A claim under the volume's name that carries every mark of the relay's
// but is not the claim it made (Kosmos's copy, or one made after ours was
// deleted) is neither grown, nor deleted, nor counted as the volume.
#[tokio::test(start_paused = true)]
async fn a_marked_claim_of_another_uid_is_not_the_volume() {
    let (b, mut api) = east();
    let vol = recorded(&b, "uid-made");
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let impostor = with_uid(claim(&vol, "Bound", Some("pv-other")), "uid-copy");

    let (grown, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path).await.ok(impostor.clone());
        api.expect_idle().await;
    });
    let err = grown.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    for part in ["uid-copy", "uid-made", &pvc_name(&vol)] {
        assert!(err.to_string().contains(part), "{part}: {err}");
    }

    let (deleted, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.ok(impostor.clone());
        api.expect_idle().await;
    });
    deleted.unwrap();

    // The claim it made is all of that again.
    let ours = with_uid(claim(&vol, "Bound", Some("pv-1")), "uid-made");
    let (deleted, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.ok(ours.clone());
        let del = api.expect("DELETE", &path).await;
        assert_eq!(del.body["preconditions"]["uid"], "uid-made");
        del.ok(ours.clone());
    });
    deleted.unwrap();
}

// Records made before the uid was kept are judged by the marks, as before.
#[tokio::test(start_paused = true)]
async fn a_record_without_a_uid_goes_by_the_marks() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    vol.lifecycle = Lifecycle::Ready;
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let ours = with_uid(claim(&vol, "Bound", Some("pv-1")), "uid-any");
    let (deleted, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.ok(ours.clone());
        api.expect("DELETE", &path).await.ok(ours.clone());
    });
    deleted.unwrap();
}
