//! Moves of volumes on CSI storage (issue #62), on real kubelets, after
//! `mobility_e2e`'s and with its relay: member1's class `kl-hostpath`
//! (csi-driver-host-path on member-kl-1, kosmos/env-up.sh) and member2's
//! `m2-hostpath` (csi-driver-host-path on member2-kl-1, kosmos/shared-up.sh,
//! volumes of at most RELAY_OWN_MEMBER2_HOSTPATH_MAX bytes). Each driver
//! keeps a volume as a file (block) or directory (filesystem) named by its
//! handle under its own state directory; nothing of one member names the
//! other's.
//!
//! - **A block volume moved and moved back:** a Deployment on
//!   kosmos-member1 writes random data and a header to its raw device;
//!   moved to kosmos-member2, its pod reads the header there and marks the
//!   device, and the data past the header has the source's hash. Moved back
//!   (`movedDataRetention: keep`: member1's copy stayed), the pass sends
//!   only the chunks that changed. The Events on the host claim tell the
//!   move's steps.
//! - **A member too small:** a filesystem volume bigger than member2's
//!   driver takes, moved to kosmos-member2: the attach is refused with
//!   member2's own words (its provisioner's ProvisioningFailed), the pod
//!   stays Pending; moved back to kosmos-member1, it runs there on its data,
//!   the move shows Stopped, and member2 keeps neither a claim nor a mover.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use csi_relay::k8s::relay_volume::RelayVolume;

use crate::e2e_support::{apply, eventually, pods, ScriptedEnv};
use crate::global_storage_e2e::{Ctx, DRIVER, KOSMOS1, KOSMOS2};
use crate::mobility_e2e::{expect_pod_network, movers_left, passes, relay_claims};

const CLASS: &str = "movable-hostpath";
const MEMBER1_CLASS: &str = "kl-hostpath";
const MEMBER2_CLASS: &str = "m2-hostpath";
const WAIT: Duration = Duration::from_secs(180);
const MOVE_WAIT: Duration = Duration::from_secs(300);
/// The block volume's size, and the random data its app writes past the
/// first MiB (the header).
const BLOCK_CLAIM: &str = "64Mi";
const BLOCK_DATA_MIB: u64 = 32;
/// Bigger than member2's driver takes (shared-up.sh: 100 MiB).
const TOO_BIG: &str = "128Mi";

/// A one-pod Deployment on `node` using claim `data` as a raw device: on a
/// fresh one it writes random data past the first MiB, then the header
/// `RELAY:<token>`; on one with the header it writes `SEEN:<pod>` at byte
/// 512.
fn block_app(node: &str, token: &str) -> Value {
    let script = format!(
        "if [ \"$(head -c 6 /dev/xvda)\" = RELAY: ]; then \
           printf 'SEEN:%s\\n' $POD_NAME | dd of=/dev/xvda bs=512 seek=1 conv=notrunc,fsync; \
         else dd if=/dev/urandom of=/dev/xvda bs=1M seek=1 count={BLOCK_DATA_MIB} conv=notrunc,fsync && \
           printf 'RELAY:%s\\n' $TOKEN | dd of=/dev/xvda conv=notrunc,fsync; fi; sleep 3600"
    );
    app(
        node,
        token,
        &script,
        json!({"volumeDevices": [{"name": "v", "devicePath": "/dev/xvda"}]}),
    )
}

/// As `mobility_e2e`'s app, on a filesystem: 4 MiB and a token, or the
/// token copied to `seen-<pod>`.
fn files_app(node: &str, token: &str) -> Value {
    let script = "if [ -f /data/token ]; then cp /data/token /data/seen-$POD_NAME; \
         else head -c 4194304 /dev/urandom > /data/blob && echo $TOKEN > /data/token; fi; sleep 3600";
    app(
        node,
        token,
        script,
        json!({"volumeMounts": [{"name": "v", "mountPath": "/data"}]}),
    )
}

fn app(node: &str, token: &str, script: &str, uses: Value) -> Value {
    let mut container = json!({"name": "c", "image": "localhost/busybox:1.35",
        "imagePullPolicy": "Never", "command": ["sh", "-c", script],
        "env": [{"name": "TOKEN", "value": token},
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]});
    if let (Some(c), Some(u)) = (container.as_object_mut(), uses.as_object()) {
        c.extend(u.clone());
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": "global"}},
            "template": {"metadata": {"labels": {"app": "global"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                    "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "kosmos.io/node", "operator": "Exists"}],
                    "containers": [container],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}}})
}

async fn claim_and_app(ctx: &Ctx, ns: &str, size: &str, block: bool, app: Value) {
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
        "resources": {"requests": {"storage": size}}});
    if block {
        spec["volumeMode"] = json!("Block");
    }
    Api::<PersistentVolumeClaim>::namespaced(ctx.host.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": spec}))
                .expect("pvc"),
        )
        .await
        .expect("create host PVC");
    Api::<Deployment>::namespaced(ctx.host.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(app).expect("deployment"),
        )
        .await
        .expect("create Deployment");
}

/// Where a member's hostpath driver keeps the relay's data claim of
/// `ns/data` (`state/<volume handle>`).
async fn volume_path(member: &Client, ns: &str, state: &Path) -> PathBuf {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), ns);
    let pvs: Api<PersistentVolume> = Api::all(member.clone());
    eventually(&format!("{ns}: the relay's data claim Bound"), WAIT, || {
        let (claims, pvs) = (claims.clone(), pvs.clone());
        async move {
            for c in claims.list(&ListParams::default()).await.ok()?.items {
                let name = c.metadata.name.clone().unwrap_or_default();
                let data = name.starts_with("relay-") && !name.ends_with("-import");
                let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                let Some(pv) = c.spec.and_then(|s| s.volume_name) else {
                    continue;
                };
                if !(data && bound) {
                    continue;
                }
                let pv = pvs.get_opt(&pv).await.ok().flatten()?;
                return Some(state.join(pv.spec?.csi?.volume_handle));
            }
            None
        }
    })
    .await
}

/// The bytes of `file` at `offset`, `len` of them (or fewer).
fn read_at(file: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    let Ok(mut f) = std::fs::File::open(file) else {
        return Vec::new();
    };
    if f.seek(SeekFrom::Start(offset)).is_err() {
        return Vec::new();
    }
    let n = f.read(&mut buf).unwrap_or(0);
    buf.truncate(n);
    buf
}

/// Until `file` holds `want` at `offset`.
async fn device_says(file: &Path, offset: u64, want: &str) {
    eventually(
        &format!("{} says {want:?} at {offset}", file.display()),
        WAIT,
        || async {
            read_at(file, offset, want.len())
                .starts_with(want.as_bytes())
                .then_some(())
        },
    )
    .await
}

/// The hash of `file` past its first MiB (the app's random data).
fn data_hash(file: &Path) -> String {
    let mut f =
        std::fs::File::open(file).unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
    f.seek(SeekFrom::Start(1 << 20)).expect("seek");
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut f, &mut h).unwrap_or_else(|e| panic!("hash {}: {e}", file.display()));
    h.finalize().to_hex().to_string()
}

fn file_hash(file: &Path) -> String {
    let mut f =
        std::fs::File::open(file).unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut f, &mut h).unwrap_or_else(|e| panic!("hash {}: {e}", file.display()));
    h.finalize().to_hex().to_string()
}

/// The reasons of the host claim's Events, oldest first.
async fn claim_events(host: &Client, ns: &str) -> Vec<(String, String)> {
    let claim = Api::<PersistentVolumeClaim>::namespaced(host.clone(), ns)
        .get("data")
        .await
        .expect("the host claim");
    let uid = claim.metadata.uid.unwrap_or_default();
    let fields = format!("involvedObject.uid={uid}");
    let mut list = Api::<Event>::namespaced(host.clone(), ns)
        .list(&ListParams::default().fields(&fields))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    list.into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

/// Until the host claim has an Event of each reason in `want`.
async fn told(host: &Client, ns: &str, want: &[&str]) -> Vec<(String, String)> {
    eventually(&format!("{ns}/data: Events {want:?}"), WAIT, || async {
        let events = claim_events(host, ns).await;
        want.iter()
            .all(|w| events.iter().any(|(r, _)| r == w))
            .then_some(events)
    })
    .await
}

/// The first attach error of the volume's host PV on `node` that `says`.
async fn attach_error_saying(
    host: &Client,
    pv: &str,
    node: &str,
    says: impl Fn(&str) -> bool,
) -> String {
    let vas: Api<VolumeAttachment> = Api::all(host.clone());
    eventually(&format!("the attach error of {pv} on {node}"), WAIT, || {
        let vas = vas.clone();
        let says = &says;
        async move {
            let list = vas.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|va| {
                let ours = va.spec.node_name == node
                    && va.spec.source.persistent_volume_name.as_deref() == Some(pv);
                let message = va.status.filter(|_| ours)?.attach_error?.message?;
                says(&message).then_some(message)
            })
        }
    })
    .await
}

async fn move_phase(
    host: &Client,
    pv: &str,
    want: &str,
) -> csi_relay::k8s::relay_volume::RelayMoveStatus {
    let rvs: Api<RelayVolume> = Api::all(host.clone());
    eventually(
        &format!("the RelayVolume's status.move {want}"),
        WAIT,
        || async {
            let rv = rvs
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|rv| rv.spec.volume_name == pv)?;
            let m = rv.status?.moving?;
            (m.phase == want).then_some(m)
        },
    )
    .await
}

/// On a failure, what each member's hostpath driver and provisioner said
/// last of the volumes (their errors and deletes).
struct DriverLogsOnFailure(Vec<PathBuf>);

impl Drop for DriverLogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for path in &self.0 {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            let said: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("rror") || l.contains("DeleteVolume") || l.contains("elet"))
                .collect();
            eprintln!("--- {} (last of its errors and deletes):", path.display());
            for l in &said[said.len().saturating_sub(15)..] {
                eprintln!("{}", &l[..l.len().min(400)]);
            }
        }
    }
}

pub(crate) async fn run(kosmos: &ScriptedEnv, ctx: &Ctx, log: &dyn Fn() -> String) {
    let run = kosmos.run.path();
    let _logs = DriverLogsOnFailure(
        ["lab/logs", "shared/m2lab/logs"]
            .iter()
            .flat_map(|d| {
                [
                    "csi-hostpath.log",
                    "csi-provisioner.log",
                    "csi-attacher.log",
                ]
                .map(|f| run.join(d).join(f))
            })
            .collect(),
    );
    let state1 = run.join("lab/csi/hostpath-state");
    let state2 = run.join("shared/m2lab/csi/hostpath-state");
    let classes: Api<StorageClass> = Api::all(ctx.host.clone());
    let _ = classes.delete(CLASS, &DeleteParams::default()).await;
    apply(
        &classes,
        CLASS,
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": CLASS}, "provisioner": DRIVER,
               "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete",
               "parameters": {"member": "member1",
                              "movableBetween": format!("member1={MEMBER1_CLASS},member2={MEMBER2_CLASS}"),
                              "movedDataRetention": "keep",
                              "createMemberNamespace": "true"}}),
    )
    .await;

    // ---- A block volume, moved to member2 and back.
    let ns = ctx.namespace("moveblk").await;
    let token = format!("blk-{}", ctx.tag);
    claim_and_app(ctx, &ns, BLOCK_CLAIM, true, block_app(KOSMOS1, &token)).await;
    ctx.pod_running(&ctx.member1, &ns, None).await;
    let file1 = volume_path(&ctx.member1, &ns, &state1).await;
    device_says(&file1, 0, &format!("RELAY:{token}")).await;
    let source = data_hash(&file1);
    let before = passes(&log()).len();
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS2).await;
    ctx.old_pod_released(&ns, &ctx.member1).await;
    let pod2 = pods::one_running(&ctx.member2, &ns, "app=global", None, MOVE_WAIT).await;
    let took = t.elapsed().as_secs_f64();
    let file2 = volume_path(&ctx.member2, &ns, &state2).await;
    assert!(file2.starts_with(&state2), "{}", file2.display());
    device_says(&file2, 512, &format!("SEEN:{pod2}")).await;
    device_says(&file2, 0, &format!("RELAY:{token}")).await;
    assert_eq!(data_hash(&file2), source, "member2's block copy differs");
    let there: Vec<_> = passes(&log()).into_iter().skip(before).collect();
    println!(
        "figure: block volume of {BLOCK_CLAIM} ({BLOCK_DATA_MIB} MiB written) member1 → member2: edit to Running {took:.1} s; {} pass(es), sent {:.1} MiB",
        there.len(),
        there.iter().map(|p| p.1).sum::<u64>() as f64 / (1 << 20) as f64
    );
    let events = told(&ctx.host, &ns, &["MoveCopying", "MoveVerified", "Moved"]).await;
    println!(
        "figure: the host claim's Events of the move: {:?}",
        events.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>()
    );
    // The Event names the way the bytes went.
    let via = if expect_pod_network(kosmos.run.path()) {
        csi_relay::backends::member::mobility::moving::VIA_POD_NETWORK
    } else {
        csi_relay::backends::member::mobility::moving::VIA_API_SERVERS
    };
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "MoveVerified" && m.contains(via)),
        "MoveVerified does not say {via:?}: {events:?}"
    );
    // Back to member1, whose copy stayed (keep): only what changed goes.
    let before = passes(&log()).len();
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS1).await;
    ctx.old_pod_released(&ns, &ctx.member2).await;
    let pod1 = pods::one_running(&ctx.member1, &ns, "app=global", None, MOVE_WAIT).await;
    let took = t.elapsed().as_secs_f64();
    assert_eq!(volume_path(&ctx.member1, &ns, &state1).await, file1);
    device_says(&file1, 512, &format!("SEEN:{pod1}")).await;
    assert_eq!(data_hash(&file1), source, "member1's block copy differs");
    let back: Vec<_> = passes(&log()).into_iter().skip(before).collect();
    let sent = back.iter().map(|p| p.1).sum::<u64>();
    println!(
        "figure: block volume moved back member2 → member1 (member1's copy kept): edit to Running {took:.1} s; {} pass(es), sent {:.2} MiB of {BLOCK_CLAIM}",
        back.len(),
        sent as f64 / (1 << 20) as f64
    );
    assert!(
        sent < 8 << 20,
        "the move back sent {sent} bytes: more than what changed since member1's copy"
    );
    eventually("no mover left after the block moves", WAIT, || async {
        (movers_left(&ctx.member1, &ns).await + movers_left(&ctx.member2, &ns).await == 0)
            .then_some(())
    })
    .await;
    ctx.delete_and_check_nothing_left(&ns, [file1, file2]).await;

    // ---- Member2 too small: refused with its reason; back to member1.
    let ns = ctx.namespace("toosmall").await;
    let token = format!("small-{}", ctx.tag);
    claim_and_app(ctx, &ns, TOO_BIG, false, files_app(KOSMOS1, &token)).await;
    ctx.pod_running(&ctx.member1, &ns, None).await;
    let dir1 = volume_path(&ctx.member1, &ns, &state1).await;
    pods::file_says(&dir1.join("token"), &token, WAIT).await;
    let blob = file_hash(&dir1.join("blob"));
    let pv = pods::host_pv(&ctx.host, &ns, "data").await;
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS2).await;
    ctx.old_pod_released(&ns, &ctx.member1).await;
    let refused = attach_error_saying(&ctx.host, &pv, KOSMOS2, |m| {
        m.contains("is Pending: the member says ProvisioningFailed")
    })
    .await;
    println!(
        "figure: move to a member too small: refused {:.1} s after the edit: {refused}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        refused.contains("member cluster member2"),
        "the refusal names no member: {refused}"
    );
    assert!(
        pods::running(&ctx.member2, &ns, "app=global")
            .await
            .is_empty(),
        "a pod runs in member2 without the copy"
    );
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS1).await;
    ctx.old_pod_released(&ns, &ctx.member2).await;
    let pod1 = pods::one_running(&ctx.member1, &ns, "app=global", None, MOVE_WAIT).await;
    println!(
        "figure: moved back to member1 after the refusal: Running {:.1} s after the edit",
        t.elapsed().as_secs_f64()
    );
    pods::file_says(&dir1.join(format!("seen-{pod1}")), &token, WAIT).await;
    assert_eq!(
        file_hash(&dir1.join("blob")),
        blob,
        "member1's data changed"
    );
    let stopped = move_phase(&ctx.host, &pv, "Stopped").await;
    assert_eq!(
        (stopped.from.as_str(), stopped.to.as_str()),
        ("member1", "member2")
    );
    told(&ctx.host, &ns, &["MoveStopped"]).await;
    eventually("member2 keeps no claim and no mover", WAIT, || async {
        let left = relay_claims(&ctx.member2, &ns).await.len()
            + movers_left(&ctx.member1, &ns).await
            + movers_left(&ctx.member2, &ns).await;
        (left == 0).then_some(())
    })
    .await;
    ctx.delete_and_check_nothing_left(&ns, [dir1.clone(), dir1])
        .await;
    let _ = classes.delete(CLASS, &DeleteParams::default()).await;
}
