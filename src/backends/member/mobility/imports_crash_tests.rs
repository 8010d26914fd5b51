//! A controller killed at each step of an import and of its release,
//! against member API servers that keep what they were told (a small fake:
//! claims, PVs, the PV controller's binding, no pods). The attach or
//! detach future is dropped at the k-th write to the importing member (a
//! SIGKILL there: the store kept the intent, the member what was done),
//! then a new backend (the restarted controller) calls again: it
//! completes, and the member holds exactly one claim and one PV of the
//! volume (none once released).

use std::collections::BTreeMap as Map;

use super::*;
use crate::k8s::testing::Call;

/// A member API that remembers claims and PVs, and binds a claim to the
/// PV its `volumeName` names when that PV's `claimRef` names the claim (as
/// the member's PV controller does).
#[derive(Default)]
struct Fake {
    claims: Map<String, Value>,
    pvs: Map<String, Value>,
    uids: u32,
    /// The member's PV controller is slow: nothing gets Bound.
    holds_binding: bool,
}

fn is_write(call: &Call) -> bool {
    matches!(call.method.as_str(), "POST" | "PATCH" | "DELETE")
}

impl Fake {
    fn bind(&mut self, name: &str) {
        if self.holds_binding {
            return;
        }
        let Some(claim) = self.claims.get_mut(name) else {
            return;
        };
        let Some(pv_name) = claim["spec"]["volumeName"].as_str().map(str::to_string) else {
            return;
        };
        let Some(pv) = self.pvs.get_mut(&pv_name) else {
            return;
        };
        if pv["spec"]["claimRef"]["name"] == json!(name) {
            pv["spec"]["claimRef"]["uid"] = claim["metadata"]["uid"].clone();
            claim["status"] = json!({"phase": "Bound"});
        }
    }

    fn serve(&mut self, call: Call) {
        if call.query.contains("watch=") {
            // No watch here: the relay polls.
            return call.status(500, "InternalError", "no watch in this fake");
        }
        let path = call.path.clone();
        let (kind, name) = if let Some(rest) = path.strip_prefix(PVCS) {
            ("pvc", rest.trim_start_matches('/').to_string())
        } else if let Some(rest) = path.strip_prefix("/api/v1/persistentvolumes") {
            ("pv", rest.trim_start_matches('/').to_string())
        } else if path == PODS {
            return call.ok(pods(vec![]));
        } else {
            panic!("the fake serves no {} {path}", call.method);
        };
        let name = if name.is_empty() {
            call.body["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        } else {
            name
        };
        if kind == "pvc" {
            self.bind(&name);
        }
        let method = call.method.clone();
        let store = if kind == "pvc" {
            &mut self.claims
        } else {
            &mut self.pvs
        };
        match method.as_str() {
            "GET" => match store.get(&name) {
                Some(o) => call.ok(o.clone()),
                None => call.not_found(),
            },
            "POST" if store.contains_key(&name) => call.already_exists(),
            "POST" => {
                let mut made = call.body.clone();
                self.uids += 1;
                made["metadata"]["uid"] = json!(format!("uid-{}", self.uids));
                made["metadata"]["resourceVersion"] = json!("1");
                if kind == "pvc" {
                    made["status"] = json!({"phase": "Pending"});
                }
                let store = if kind == "pvc" {
                    &mut self.claims
                } else {
                    &mut self.pvs
                };
                store.insert(name, made.clone());
                call.reply(201, made)
            }
            "DELETE" => match store.remove(&name) {
                Some(o) => call.ok(o),
                None => call.not_found(),
            },
            "PATCH" => match store.get_mut(&name) {
                Some(o) => {
                    merge(o, &call.body);
                    let o = o.clone();
                    call.ok(o)
                }
                None => call.not_found(),
            },
            m => panic!("the fake serves no {m} {path}"),
        }
    }
}

/// A JSON merge patch (RFC 7386), as the API server applies it.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// Runs `fut` against the fakes; with `crash_at` Some(k), drops it at the
/// k-th write to west (0: before the first), unanswered. Some(output) when
/// it finished first.
async fn drive<F: std::future::Future>(
    fut: F,
    c: &mut Clusters,
    east: &mut Fake,
    west: &mut Fake,
    crash_at: Option<usize>,
) -> Option<F::Output> {
    tokio::pin!(fut);
    let mut writes = 0;
    loop {
        tokio::select! {
            out = &mut fut => return Some(out),
            call = c.east.next() => east.serve(call),
            call = c.west.next() => {
                if is_write(&call) {
                    if Some(writes) == crash_at {
                        return None;
                    }
                    writes += 1;
                }
                west.serve(call)
            }
            call = c.host.next() => call.ok(host_node("host-w", "west", "west-1")),
        }
    }
}

/// East, the origin: the data claim Bound to its PV.
fn origin(vol: &Volume) -> Fake {
    let mut east = Fake::default();
    let data = naming::pvc_name(&MemberVolume::of(vol).unwrap().uuid);
    let mut claim = claim_of(vol, "Bound", Some("pvc-e1"));
    claim["metadata"]["name"] = json!(data);
    east.claims.insert(data, claim);
    east.pvs.insert("pvc-e1".into(), origin_pv());
    east
}

/// West holds exactly the volume's access claim, bound to its import PV.
fn one_import(west: &Fake, vol: &Volume) {
    let pv = import::pv_name(&MemberVolume::of(vol).unwrap().uuid);
    assert_eq!(west.claims.keys().collect::<Vec<_>>(), ["data"]);
    assert_eq!(west.pvs.keys().collect::<Vec<_>>(), [&pv]);
    assert_eq!(west.claims["data"]["spec"]["volumeName"], json!(pv));
    assert_eq!(west.claims["data"]["status"]["phase"], "Bound");
}

#[tokio::test(start_paused = true)]
async fn a_controller_killed_at_each_step_of_an_import_completes_it_on_restart() {
    let mut steps_seen = 0;
    for crash_at in 0.. {
        let (vol, mut east) = publishing();
        let mut west = Fake::default();
        let (b, mut c) = started();
        let first = drive(
            b.attach(&vol, "host-w"),
            &mut c,
            &mut east,
            &mut west,
            Some(crash_at),
        )
        .await;
        if let Some(done) = first {
            // No write left to crash at: every step was covered.
            done.unwrap();
            one_import(&west, &vol);
            steps_seen = crash_at;
            break;
        }
        // Restarted: a new backend, the same members.
        let (b, mut c) = started();
        let ctx = drive(b.attach(&vol, "host-w"), &mut c, &mut east, &mut west, None)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("killed before write {crash_at}, the retry failed: {e}"));
        assert_eq!(ctx[source::MEMBER], "west");
        one_import(&west, &vol);
        assert_eq!(east.claims.len(), 1, "the origin keeps only its data claim");
    }
    // The PV, the claim: at least these two steps were cut.
    assert!(steps_seen >= 2, "only {steps_seen} writes seen");

    // Killed while the claim waits to be Bound: the call had answered
    // UNAVAILABLE (or never answered); the restarted controller finds
    // both made, and answers once the member binds them.
    let (vol, mut east) = publishing();
    let mut west = Fake {
        holds_binding: true,
        ..Default::default()
    };
    let (b, mut c) = started();
    let err = drive(b.attach(&vol, "host-w"), &mut c, &mut east, &mut west, None)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    west.holds_binding = false;
    let (b, mut c) = started();
    drive(b.attach(&vol, "host-w"), &mut c, &mut east, &mut west, None)
        .await
        .unwrap()
        .unwrap();
    one_import(&west, &vol);
    println!("an import killed before each of its {steps_seen} writes, each completed on restart");
}

#[tokio::test(start_paused = true)]
async fn a_controller_killed_at_each_step_of_a_release_finishes_it_on_restart() {
    for crash_at in 0.. {
        let (mut vol, mut east) = publishing();
        let mut west = Fake::default();
        let (b, mut c) = started();
        let ctx = drive(b.attach(&vol, "host-w"), &mut c, &mut east, &mut west, None)
            .await
            .unwrap()
            .unwrap();
        on_node(&mut vol, "host-w", ctx, Progress::Done);
        let (b, mut c) = started();
        let first = drive(
            b.detach(&vol, "host-w"),
            &mut c,
            &mut east,
            &mut west,
            Some(crash_at),
        )
        .await;
        if let Some(done) = first {
            done.unwrap();
            assert!(west.claims.is_empty() && west.pvs.is_empty());
            assert!(crash_at >= 2, "the claim's and the PV's deletes were cut");
            break;
        }
        let (b, mut c) = started();
        drive(b.detach(&vol, "host-w"), &mut c, &mut east, &mut west, None)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("killed before write {crash_at}, the retry failed: {e}"));
        assert!(
            west.claims.is_empty() && west.pvs.is_empty(),
            "killed before write {crash_at}: left {:?} {:?}",
            west.claims.keys(),
            west.pvs.keys()
        );
        assert_eq!(east.claims.len(), 1, "the data stays");
    }
}

/// A gated volume whose node host-w of west is publishing, and east with
/// its data claim.
fn publishing() -> (Volume, Fake) {
    let mut vol = placed_volume(&clusters().b, AccessMode::SingleNodeWriter);
    on_node(&mut vol, "host-w", BTreeMap::new(), Progress::Applying);
    let east = origin(&vol);
    (vol, east)
}

/// A new controller: its backend and the members' scripted APIs.
fn started() -> (MemberBackend, Clusters) {
    let mut c = clusters();
    let b = std::mem::replace(&mut c.b, clusters().b);
    (b, c)
}
