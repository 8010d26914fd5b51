//! The observation against scripted member and host APIs: what it asks the
//! member for, and which RelayVolumes it writes after which change.

use serde_json::json;
use tower_test::mock::SendResponse;

use super::*;
use crate::k8s::testing::{self, Call, MockApi};

const V1: &str = "m-east-00000000000000000000000000000001";
const V2: &str = "m-east-00000000000000000000000000000002";

fn key(ns: &str, name: &str) -> Key {
    (ns.to_string(), name.to_string())
}

fn claim(id: &str, pv: &str) -> Claim {
    Claim {
        volume_id: id.into(),
        uid: Some(format!("uid-{pv}")),
        volume_name: Some(pv.into()),
    }
}

type Pending = Vec<SendResponse<http::Response<kube::client::Body>>>;

/// Answers the member's requests until `pvs` PVs were read and the pod
/// watch of `namespace` listed (empty) and is watching. Returns the
/// watches, kept open.
async fn serve_member(api: &mut MockApi, namespace: &str, mut pvs: usize) -> Pending {
    let pods = format!("/api/v1/namespaces/{namespace}/pods");
    let mut watching = Pending::new();
    let mut listed = false;
    while pvs > 0 || !listed || watching.is_empty() {
        let call: Call = api.next().await;
        assert_eq!(call.method, "GET", "the member is only read: {}", call.path);
        if call.path == pods && call.query_map().contains_key("watch") {
            watching.push(call.hang());
        } else if call.path == pods {
            listed = true;
            call.ok(json!({"kind": "PodList", "apiVersion": "v1",
                           "metadata": {"resourceVersion": "5"}, "items": []}));
        } else if let Some(pv) = call.path.strip_prefix("/api/v1/persistentvolumes/") {
            let claim = if pv == "pv-1" { "pvc1" } else { "pvc2" };
            let body = json!({"kind": "PersistentVolume", "apiVersion": "v1",
                "metadata": {"name": pv, "managedFields": [{"manager": "x"}]},
                "spec": {"claimRef": {"namespace": "shop", "name": claim, "uid": format!("uid-{pv}")},
                         "csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": format!("h-{pv}")}}});
            pvs -= 1;
            call.ok(body);
        } else {
            panic!("unexpected member request {} {}", call.path, call.query);
        }
    }
    watching
}

/// Answers `n` RelayVolume status applies with `status` and returns the
/// volume ids and the entries each carried, sorted.
async fn serve_host(api: &mut MockApi, n: usize, status: u16) -> Vec<(String, serde_json::Value)> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let call = api.next().await;
        assert_eq!(call.method, "PATCH");
        let name = call
            .path
            .strip_prefix("/apis/relay.csi.dev/v1alpha1/relayvolumes/")
            .and_then(|p| p.strip_suffix("/status"))
            .unwrap_or_else(|| panic!("a RelayVolume status: {}", call.path))
            .to_string();
        assert_eq!(
            call.query_map().get("fieldManager").map(String::as_str),
            Some("csi-relay-member-east")
        );
        seen.push((name, call.body["status"]["nodes"].clone()));
        if status == 200 {
            call.echo();
        } else {
            call.status(status, "InternalError", "etcd is having a bad day");
        }
    }
    seen.sort_by(|a, b| a.0.cmp(&b.0));
    seen
}

async fn settle(o: &mut Observer, rx: &mut mpsc::Receiver<Change>, n: usize) {
    for _ in 0..n {
        let change = rx.recv().await.expect("a change");
        o.apply(change);
    }
}

fn pod_running(watch: u64, claim: &str) -> Change {
    Change::Pods {
        namespace: "shop".into(),
        watch,
        sync: Sync::Set(
            key("shop", &format!("user-of-{claim}")),
            Some(PodUse {
                node: Some("n1".into()),
                running: true,
                claims: vec![claim.into()],
            }),
        ),
    }
}

#[tokio::test(start_paused = true)]
async fn each_change_writes_the_volume_it_concerns_and_nothing_else() {
    let (member_client, mut member) = testing::client();
    let (host, mut host_api) = testing::host();
    let (tx, mut rx) = mpsc::channel(16);
    let mut o = Observer::new("east".into(), member_client, host, tx);

    // Two relay claims appear in "shop": its pods are watched, their PVs
    // read once.
    o.apply(Change::Claims(Sync::Replace(vec![
        (key("shop", "pvc1"), claim(V1, "pv-1")),
        (key("shop", "pvc2"), claim(V2, "pv-2")),
    ])));
    o.read_pvs();
    let _watching = serve_member(&mut member, "shop", 2).await;
    // The pod listing and the two PVs.
    settle(&mut o, &mut rx, 3).await;
    assert_eq!(o.view.unresolved().count(), 0);

    // First round: both volumes' (empty) member entries.
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 2, 200));
    assert_eq!(written, [(V1.into(), json!([])), (V2.into(), json!([]))]);

    // A pod of pvc1 runs: V1 alone is written.
    o.apply(pod_running(1, "pvc1"));
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 200));
    assert_eq!(
        written,
        [(
            V1.into(),
            json!([{"node": "east/n1", "member": "east", "phase": "PUBLISHED", "pods": ["shop/user-of-pvc1"]}])
        )]
    );

    // The node's in-use list changes for V2's PV only: V2 alone.
    o.apply(Change::Nodes(Sync::Set(
        key("", "n1"),
        Some(["kubernetes.io/csi/hostpath.csi.k8s.io^h-pv-2".to_string()].into()),
    )));
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 200));
    assert_eq!(written[0].0, V2);
    assert_eq!(written[0].1[0]["phase"], "VOL_READY");

    // The same list again (a heartbeat), or news from a pod watch that was
    // since replaced: nothing to write.
    o.apply(Change::Nodes(Sync::Set(
        key("", "n1"),
        Some(["kubernetes.io/csi/hostpath.csi.k8s.io^h-pv-2".to_string()].into()),
    )));
    o.apply(pod_running(99, "pvc2"));
    o.write().await;

    // A write that fails is tried again for that volume, later.
    o.apply(pod_running(1, "pvc2"));
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 500));
    assert_eq!(written[0].0, V2);
    o.write().await;
    tokio::time::advance(retry_after(1)).await;
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 200));
    assert_eq!(written[0].0, V2);
    assert_eq!(written[0].1[0]["phase"], "PUBLISHED");

    // The claims go: their entries are cleared once, the pod watch stops
    // and the namespace's pods are forgotten.
    o.apply(Change::Claims(Sync::Set(key("shop", "pvc1"), None)));
    o.apply(Change::Claims(Sync::Replace(Vec::new())));
    assert!(o.pod_watches.is_empty());
    assert!(o.view.pod_keys_in("shop").is_empty());
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 2, 200));
    assert_eq!(written, [(V1.into(), json!([])), (V2.into(), json!([]))]);
    o.write().await;
    assert!(o.written.is_empty());
    host_api.expect_idle().await;
}

// A PV that is not there yet is read again, later each time, and the
// volume's state follows once it is.
#[tokio::test(start_paused = true)]
async fn a_missing_pv_is_read_again_later() {
    let (member_client, mut member) = testing::client();
    let (host, _host_api) = testing::host();
    let (tx, mut rx) = mpsc::channel(16);
    let mut o = Observer::new("east".into(), member_client, host, tx);
    o.apply(Change::Claims(Sync::Set(
        key("shop", "pvc1"),
        Some(claim(V1, "pv-1")),
    )));
    o.read_pvs();
    let mut watching = Pending::new();
    let mut asked = 0;
    while asked == 0 || watching.is_empty() {
        let call = member.next().await;
        match call.path.as_str() {
            "/api/v1/persistentvolumes/pv-1" => {
                asked += 1;
                call.not_found();
            }
            "/api/v1/namespaces/shop/pods" if call.query_map().contains_key("watch") => {
                watching.push(call.hang())
            }
            "/api/v1/namespaces/shop/pods" => call
                .ok(json!({"kind": "PodList", "apiVersion": "v1",
                "metadata": {"resourceVersion": "5"}, "items": []})),
            other => panic!("unexpected member request {other}"),
        }
    }
    settle(&mut o, &mut rx, 2).await;
    // Not again at once.
    o.read_pvs();
    assert!(o.reading.is_empty());
    tokio::time::advance(retry_after(1)).await;
    o.read_pvs();
    assert_eq!(o.reading.len(), 1);
    // An API error is no answer either: later again, and later than before.
    member
        .expect("GET", "/api/v1/persistentvolumes/pv-1")
        .await
        .status(500, "InternalError", "etcd is having a bad day");
    settle(&mut o, &mut rx, 1).await;
    assert!(o.reading.is_empty());
    tokio::time::advance(retry_after(1)).await;
    o.read_pvs();
    assert!(o.reading.is_empty(), "the second failure waits longer");
    tokio::time::advance(retry_after(2) - retry_after(1)).await;
    o.read_pvs();
    assert_eq!(o.reading.len(), 1);
    let call = member.expect("GET", "/api/v1/persistentvolumes/pv-1").await;
    call.ok(
        json!({"kind": "PersistentVolume", "apiVersion": "v1", "metadata": {"name": "pv-1"},
                   "spec": {"claimRef": {"namespace": "shop", "name": "pvc1", "uid": "uid-pv-1"},
                            "csi": {"driver": "d", "volumeHandle": "h"}}}),
    );
    settle(&mut o, &mut rx, 1).await;
    assert_eq!(o.view.unresolved().count(), 0);
    o.apply(Change::Attachments(Sync::Set(
        key("", "va"),
        Some(Attachment {
            pv: Some("pv-1".into()),
            node: "n2".into(),
            attached: true,
        }),
    )));
    let states = o.view.state_of(V1).unwrap();
    assert_eq!(states[0].node, "n2");
}

// Past NAMESPACE_WATCHES namespaces with relay claims, one cluster-wide
// pod watch replaces the per-namespace ones, and back below half that the
// namespaces are watched one by one again; pods of namespaces left behind
// are forgotten, those still wanted kept until their watch lists again.
#[tokio::test(start_paused = true)]
async fn many_namespaces_share_one_cluster_wide_pod_watch() {
    let (member_client, _member) = testing::client();
    let (host, _host_api) = testing::host();
    let (tx, _rx) = mpsc::channel(16);
    let mut o = Observer::new("east".into(), member_client, host, tx);
    let claim_in = |i: usize| {
        Change::Claims(Sync::Set(
            key(&format!("ns{i}"), "data"),
            Some(claim(&format!("m-east-{i:032x}"), &format!("pv-{i}"))),
        ))
    };
    for i in 0..NAMESPACE_WATCHES {
        o.apply(claim_in(i));
    }
    assert_eq!(o.pod_watches.len(), NAMESPACE_WATCHES);
    let pod_in = |i: usize, watch: u64| Change::Pods {
        namespace: if watch == 0 {
            format!("ns{i}")
        } else {
            ALL_NAMESPACES.into()
        },
        watch: if watch == 0 { i as u64 + 1 } else { watch },
        sync: Sync::Set(
            key(&format!("ns{i}"), "user"),
            Some(PodUse {
                node: Some("n1".into()),
                running: true,
                claims: vec!["data".into()],
            }),
        ),
    };
    o.apply(pod_in(0, 0));
    o.apply(pod_in(1, 0));
    assert_eq!(o.view.pod_keys_in("").len(), 2);

    o.apply(claim_in(NAMESPACE_WATCHES));
    assert_eq!(o.pod_watches.keys().collect::<Vec<_>>(), [ALL_NAMESPACES]);
    let all = o.pod_watches[ALL_NAMESPACES].0;
    // Kept until the cluster-wide watch lists them.
    assert_eq!(o.view.pod_keys_in("").len(), 2);
    // A stopped namespace watch's news is stale.
    o.apply(pod_in(2, 0));
    assert_eq!(o.view.pod_keys_in("").len(), 2);
    o.apply(pod_in(2, all));
    assert_eq!(o.view.pod_keys_in("").len(), 3);
    // No flapping at the edge.
    o.apply(Change::Claims(Sync::Set(
        key(&format!("ns{NAMESPACE_WATCHES}"), "data"),
        None,
    )));
    assert_eq!(o.pod_watches.keys().collect::<Vec<_>>(), [ALL_NAMESPACES]);

    for i in (NAMESPACE_WATCHES / 2)..NAMESPACE_WATCHES {
        o.apply(Change::Claims(Sync::Set(
            key(&format!("ns{i}"), "data"),
            None,
        )));
    }
    // Half as many namespaces: one watch each again.
    assert!(!o.pod_watches.contains_key(ALL_NAMESPACES));
    assert_eq!(o.pod_watches.len(), NAMESPACE_WATCHES / 2);
    assert_eq!(o.view.pod_keys_in("").len(), 3);
    o.apply(Change::Claims(Sync::Set(key("ns2", "data"), None)));
    assert_eq!(
        o.view.pod_keys_in("").len(),
        2,
        "ns2's pods are forgotten with its watch"
    );
}

/// A RelayVolume of `id` as the controller's view holds it, with `entries`.
fn held_object(id: &str, entries: serde_json::Value) -> RelayVolume {
    let mut obj = RelayVolume::new(
        &object_name(id),
        crate::k8s::relay_volume::RelayVolumeSpec {
            volume_id: id.into(),
            volume_name: "pvc-x".into(),
            capacity_bytes: 1,
            member: Some("east".into()),
            member_pvc: None,
            host_pvc: None,
            record: String::new(),
            format_version: 1,
            leader_term: None,
        },
    );
    obj.status = Some(serde_json::from_value(json!({"nodes": entries})).expect("status"));
    obj
}

// A new controller's observer finds the member as the objects already
// say (a restart, a failover): it writes only the volume whose entries
// differ, not every volume again. Writes also wait for the pod listing of
// a new namespace, so no volume is first written without its pods.
#[tokio::test(start_paused = true)]
async fn a_new_observer_writes_only_what_the_objects_do_not_hold() {
    let (member_client, mut member) = testing::client();
    let (host, mut host_api) = testing::host();
    let (tx, mut rx) = mpsc::channel(16);
    let mut o = Observer::new("east".into(), member_client, host, tx);
    let (seen, mut view) = crate::k8s::relay_volume::new_view();
    let running = json!([{"node": "east/n1", "member": "east", "phase": "PUBLISHED",
                          "pods": ["shop/user-of-pvc1"]}]);
    // V1 holds its running pod's entry (and a host node's, not this
    // observer's); V2 holds a state its pods no longer have.
    let mut v1 = running.clone();
    if let Some(list) = v1.as_array_mut() {
        list.insert(0, json!({"node": "host-a", "attached": true}));
    }
    view.apply_watcher_event(&crate::k8s::relay_volume::applied(held_object(V1, v1)));
    view.apply_watcher_event(&crate::k8s::relay_volume::applied(held_object(V2, running)));
    o.seen = Some(seen);

    o.apply(Change::Claims(Sync::Replace(vec![
        (key("shop", "pvc1"), claim(V1, "pv-1")),
        (key("shop", "pvc2"), claim(V2, "pv-2")),
    ])));
    o.read_pvs();
    // Before the pod watch has listed, nothing is written.
    o.write().await;
    host_api.expect_idle().await;
    let _watching = serve_member(&mut member, "shop", 2).await;
    settle(&mut o, &mut rx, 3).await;
    o.apply(pod_running(1, "pvc1"));

    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 200));
    assert_eq!(written, [(V2.into(), json!([]))], "only V2 differs");
    o.write().await;
    host_api.expect_idle().await;
}

// A pod watch that never lists holds the writes for a bounded time only.
#[tokio::test(start_paused = true)]
async fn writes_wait_for_a_pod_listing_only_so_long() {
    let (member_client, _member) = testing::client();
    let (host, mut host_api) = testing::host();
    let (tx, _rx) = mpsc::channel(16);
    let mut o = Observer::new("east".into(), member_client, host, tx);
    o.apply(Change::Claims(Sync::Replace(vec![(
        key("shop", "pvc1"),
        claim(V1, "pv-1"),
    )])));
    o.write().await;
    host_api.expect_idle().await;
    tokio::time::advance(LIST_GRACE).await;
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 200));
    assert_eq!(written, [(V1.into(), json!([]))]);
}

// A PV read that ends starts the next one at once: reads are not paced by
// the write tick (8 per tick took a new controller 10 minutes to read
// 10,000 claims' PVs), and never more than PARALLEL run at once.
#[tokio::test(start_paused = true)]
async fn each_pv_read_that_ends_starts_the_next_without_waiting_for_a_tick() {
    let (member_client, mut member) = testing::client();
    let (host, _host_api) = testing::host();
    let (tx, mut rx) = mpsc::channel(64);
    let mut o = Observer::new("east".into(), member_client, host, tx);
    let n = PARALLEL * 3;
    o.apply(Change::Claims(Sync::Replace(
        (0..n)
            .map(|i| {
                let id = format!("m-east-{i:032x}");
                (
                    key("shop", &format!("pvc{i}")),
                    claim(&id, &format!("pv-{i}")),
                )
            })
            .collect(),
    )));
    assert_eq!(
        o.reading.len(),
        PARALLEL,
        "the first reads start with the claims"
    );
    let mut watching = Pending::new();
    let served = async {
        let mut read = 0;
        while read < n {
            let call = member.next().await;
            let Some(i) = call.path.strip_prefix("/api/v1/persistentvolumes/pv-") else {
                match call.query_map().contains_key("watch") {
                    true => watching.push(call.hang()),
                    false => call.ok(json!({"kind": "PodList", "apiVersion": "v1",
                        "metadata": {"resourceVersion": "5"}, "items": []})),
                }
                continue;
            };
            let i = i.to_string();
            call.ok(json!({"kind": "PersistentVolume", "apiVersion": "v1",
                "metadata": {"name": format!("pv-{i}")},
                "spec": {"claimRef": {"namespace": "shop", "name": format!("pvc{i}"), "uid": format!("uid-pv-{i}")},
                         "csi": {"driver": "d", "volumeHandle": format!("h-{i}")}}}));
            read += 1;
            loop {
                let change = rx.recv().await.expect("a change");
                let was_read = matches!(change, Change::Volume { .. });
                o.apply(change);
                assert!(
                    o.reading.len() <= PARALLEL,
                    "{} reads at once",
                    o.reading.len()
                );
                if was_read {
                    break;
                }
            }
        }
    };
    // No tick runs here: under reads paced by it, the ninth never starts.
    tokio::time::timeout(SETTLE, served)
        .await
        .expect("every PV read without a tick");
    assert_eq!(o.view.unresolved().count(), 0);
    assert!(o.reading.is_empty());
}

// A volume whose object the listed view lacks is new: it holds no entries
// of this member, so empty ones are not written (they were one status
// patch more per new volume). A view that has not listed knows nothing.
#[tokio::test(start_paused = true)]
async fn a_new_object_gets_no_empty_entries_once_the_view_has_listed() {
    let (member_client, _member) = testing::client();
    let (host, mut host_api) = testing::host();
    let (tx, _rx) = mpsc::channel(16);
    let mut o = Observer::new("east".into(), member_client, host, tx);
    let (seen, _view) = crate::k8s::relay_volume::new_view();
    o.seen = Some(seen);
    o.seen_listed = true;
    o.apply(Change::Claims(Sync::Replace(vec![(
        key("shop", "pvc1"),
        claim(V1, "pv-1"),
    )])));
    tokio::time::advance(LIST_GRACE).await;
    o.write().await;
    host_api.expect_idle().await;

    o.seen_listed = false;
    o.written.clear();
    o.dirty.insert(V1.into());
    let ((), written) = tokio::join!(o.write(), serve_host(&mut host_api, 1, 200));
    assert_eq!(written, [(V1.into(), json!([]))]);
}
