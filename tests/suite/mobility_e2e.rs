//! Volumes that move between members that share no storage (issue #62),
//! on real kubelets: member1's class `local-path` (demo-up.sh: hostPath
//! PVs under RUN/demo/disk/local-path on member-kl-1) and member2's own
//! `m2-local-path` (shared-up.sh: hostPath PVs under RUN/shared/m2-own on
//! member2-kl-1). No PV of either member names the other's directory: the
//! data goes only through the relay's movers, a pod of the relay's own
//! image in each member (`csi-relay mover`, built here with
//! tests/deploy-kit/image.sh from this test's binary and imported into both
//! kubelets' containerd), reached by the controller through each member
//! API server's port-forward.
//!
//! - **The seed's demo, moved:** a Deployment on kosmos-member1 writes
//!   1 GiB of random data and a token; its node selector changed to
//!   kosmos-member2, its pod runs in member2 on a copy with the same hash,
//!   and reads the token. Figures: edit to Running, the copy's MB/s beside
//!   a plain `cp` of the same file on this machine. The old claim goes
//!   once the pod ran there (`movedDataRetention: delete`); the movers and
//!   their Secrets go.
//! - **Pre-copied back:** the host claim labelled
//!   `relay.csi.dev/pre-copy-to=member1` while the pod runs in member2; once
//!   a pass is done, 10 MiB rewritten, then the Deployment moved back: the
//!   cutover (old pod gone to new pod Running) and what the last pass sent.
//! - **A SIGKILL of a mover and of the controller during a copy:** moved to
//!   member2 again (a full copy: its copy was deleted), the source mover's
//!   process and then the controller killed while the copy runs; the pod
//!   runs in member2 on data with member1's hash, one claim in use, no
//!   mover left.
//! - **Delete:** nothing of the volume in the host, in either member, or
//!   in either member's directory.
//!
//! Then `mobility_block_e2e` (block volumes, a member too small) with the
//! same relay. Run by `global_storage_e2e` at its end, in the same
//! environment.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use csi_relay::k8s::relay_volume::RelayVolume;

use crate::e2e_support::demo_relay::{DemoRelay, Prerequisites};
use crate::e2e_support::{apply, eventually, pods, ScriptedEnv};
use crate::global_storage_e2e::{
    containerd_socket, seconds, Ctx, DRIVER, HOST_NODE, KOSMOS1, KOSMOS2,
};

/// The mover image (tests/deploy-kit/image.sh's name for this binary).
const MOVER_IMAGE: &str = "localhost/csi-relay:0.1.0";
const MEMBER1_CLASS: &str = "local-path";
const MEMBER2_CLASS: &str = "m2-local-path";
const CLASS: &str = "movable";
/// The size of the demo's data (RELAY_MOVE_MIB, default the issue's
/// 1 GiB; `.ci/run` sets less, to keep a cold run within its hour), and
/// its claim's.
fn data_mib() -> u64 {
    std::env::var("RELAY_MOVE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|m| (16..=1024).contains(m))
        .unwrap_or(1024)
}
const CLAIM: &str = "1280Mi";
/// What one move may take here (a 1 GiB copy through two port-forwards).
const MOVE_WAIT: Duration = Duration::from_secs(600);
const WAIT: Duration = Duration::from_secs(180);

/// A one-pod Deployment that writes `mib` MiB of random data and a token
/// into a fresh volume, or copies the token it finds into `seen-<pod>`.
fn mover_app(node: &str, token: &str, mib: u64) -> Value {
    let script = format!(
        "if [ -f /data/token ]; then cp /data/token /data/seen-$POD_NAME; \
         else head -c {} /dev/urandom > /data/blob && echo $TOKEN > /data/token; fi; sleep 3600",
        mib << 20
    );
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": "global"}},
            "template": {"metadata": {"labels": {"app": "global"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                    "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "kosmos.io/node", "operator": "Exists"}],
                    "containers": [{"name": "c", "image": "localhost/busybox:1.35",
                        "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                        "env": [{"name": "TOKEN", "value": token},
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}}})
}

fn hash(path: &Path) -> String {
    let mut h = blake3::Hasher::new();
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    std::io::copy(&mut f, &mut h).unwrap_or_else(|e| panic!("hash {}: {e}", path.display()));
    h.finalize().to_hex().to_string()
}

/// The directory of the relay's data claim of `ns/data` in a member (the
/// hostPath of the PV bound to `relay-<uuid>`).
async fn data_dir(member: &Client, ns: &str) -> PathBuf {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), ns);
    let pvs: Api<PersistentVolume> = Api::all(member.clone());
    eventually(&format!("{ns}: the relay's data claim Bound"), WAIT, || {
        let (claims, pvs) = (claims.clone(), pvs.clone());
        async move {
            for c in claims.list(&ListParams::default()).await.ok()?.items {
                let name = c.metadata.name.clone().unwrap_or_default();
                let data = name.starts_with("relay-") && !name.ends_with("-import");
                let ours = c
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("relay.csi.dev/volume-id"));
                let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
                let Some(pv) = c.spec.and_then(|s| s.volume_name) else {
                    continue;
                };
                if !(data && ours && bound) {
                    continue;
                }
                let pv = pvs.get_opt(&pv).await.ok().flatten()?;
                return pv.spec?.host_path.map(|h| PathBuf::from(h.path));
            }
            None
        }
    })
    .await
}

/// The relay's claims of `ns` in a member, by name.
pub(crate) async fn relay_claims(member: &Client, ns: &str) -> Vec<String> {
    Api::<PersistentVolumeClaim>::namespaced(member.clone(), ns)
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=csi-relay"))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a member still holds movers or their Secrets in `ns`.
pub(crate) async fn movers_left(member: &Client, ns: &str) -> usize {
    let lp = ListParams::default().labels("relay.csi.dev/mover");
    let pods = Api::<Pod>::namespaced(member.clone(), ns)
        .list(&lp)
        .await
        .map(|l| l.items.len())
        .unwrap_or(1);
    let secrets = Api::<Secret>::namespaced(member.clone(), ns)
        .list(&lp)
        .await
        .map(|l| l.items.len())
        .unwrap_or(1);
    pods + secrets
}

/// The controller's "move: pass done" lines: (total, sent, wire, seconds,
/// verified) of each pass.
/// How many of the log's passes went mover to mover on the pod network.
pub(crate) fn pod_network_passes(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("move: pass done") && l.contains("pod_network=true"))
        .count()
}

/// Which way the movers' bytes should go here: on the members' pod
/// network where the Kosmos environment made one (tests/kosmos/env-up.sh)
/// and `RELAY_MOVER_PATH` is not `api` (a run that measures the API
/// servers' way, passed on as `--mover-path`).
pub(crate) fn expect_pod_network(run: &Path) -> bool {
    run.join("podnet").exists() && std::env::var("RELAY_MOVER_PATH").as_deref() != Ok("api")
}

pub(crate) fn passes(log: &str) -> Vec<(u64, u64, u64, f64, bool)> {
    log.lines()
        .filter(|l| l.contains("move: pass done"))
        .filter_map(|l| {
            let field = |k: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{k}=")))
                    .map(|v| v.trim_matches('"').to_string())
            };
            Some((
                field("total")?.parse().ok()?,
                field("sent")?.parse().ok()?,
                field("wire")?.parse().ok()?,
                field("seconds")?.parse().ok()?,
                field("verified")? == "true",
            ))
        })
        .collect()
}

/// The PID of a mover process of this machine (its container's) for the
/// volume `uuid` in `role`: found by its command line, which names both.
fn mover_pid(uuid: &str, role: &str) -> Option<i32> {
    let want_role = format!("--role={role}");
    let want_move = format!("--move-id={uuid}-");
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let e = e.ok()?;
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let mover = args.iter().any(|a| a == "mover")
            && args.contains(&want_role)
            && args.iter().any(|a| a.starts_with(&want_move));
        mover.then_some(pid)
    })
}

/// Builds the mover image from this test's binary and imports it into the
/// containerd of each member's kubelet node (`labs`).
fn mover_image_into(run: &Path, labs: &[PathBuf]) {
    let tar = run.join("mover-image.tar");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let t = Instant::now();
    let out = std::process::Command::new(repo.join("tests/deploy-kit/image.sh"))
        .arg(&tar)
        .env("CSI_RELAY_BIN", env!("CARGO_BIN_EXE_csi-relay"))
        .env("IMAGE_REF", MOVER_IMAGE)
        .env("WORK_DIR", run.join("mover-image"))
        .output()
        .expect("run image.sh");
    assert!(
        out.status.success(),
        "image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(run.join("mover-image"));
    for lab in labs {
        let toml = std::fs::read_to_string(lab.join("containerd.toml")).unwrap_or_default();
        let snapshotter = toml
            .lines()
            .find_map(|l| l.trim().strip_prefix("snapshotter = \""))
            .map(|s| s.trim_end_matches('"').to_string())
            .unwrap_or_else(|| "overlayfs".into());
        let out = std::process::Command::new("ctr")
            .arg("-a")
            .arg(containerd_socket(lab))
            .args(["-n", "k8s.io", "images", "import", "--snapshotter"])
            .arg(&snapshotter)
            .arg(&tar)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr import into {}: {}",
            lab.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::fs::remove_file(&tar);
    println!(
        "figure: mover image built and imported into 2 kubelets in {} s",
        seconds(t.elapsed())
    );
}

/// `cp` of `file` to a new file beside it, flushed: the floor a copy on
/// this machine has; MB/s.
fn cp_floor(file: &Path) -> f64 {
    let to = file.with_extension("cp-floor");
    let t = Instant::now();
    let ok = std::process::Command::new("cp")
        .arg(file)
        .arg(&to)
        .status()
        .is_ok_and(|s| s.success())
        && std::process::Command::new("sync")
            .arg("-f")
            .arg(&to)
            .status()
            .is_ok_and(|s| s.success());
    let secs = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&to);
    assert!(ok, "cp {}", file.display());
    (data_mib() << 20) as f64 / 1e6 / secs
}

/// Waits for the move's pod in `to` after the Deployment was sent there;
/// returns its name and the seconds from `since`.
async fn moved(ctx: &Ctx, ns: &str, from: &Client, to: &Client, since: Instant) -> (String, f64) {
    ctx.old_pod_released(ns, from).await;
    let pod = pods::one_running(to, ns, "app=global", None, MOVE_WAIT).await;
    (pod, since.elapsed().as_secs_f64())
}

pub(crate) async fn run(pre: &Prerequisites, kosmos: &ScriptedEnv, ctx: &Ctx) {
    let run = kosmos.run.path();
    let shared = run.join("shared");
    let demo = run.join("demo");
    let env = &pre.env;
    mover_image_into(run, &[run.join("lab"), shared.join("m2lab")]);
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
                              "movedDataRetention": "delete",
                              "createMemberNamespace": "true"}}),
    )
    .await;
    let member1 = format!("member1={}", env.relay_member_kubeconfig);
    let member2 = format!(
        "member2={}",
        pre.e2e_home.join("run/member2-relay.kubeconfig").display()
    );
    let path = format!(
        "--mover-path={}",
        std::env::var("RELAY_MOVER_PATH").unwrap_or_else(|_| "auto".into())
    );
    let mut relay = DemoRelay::start(
        env,
        &pre.sidecars,
        &[member1, member2],
        &["--virtual-node-attach", "--mover-image", MOVER_IMAGE, &path],
        &demo,
        "member1",
    )
    .await;
    let pod_network = expect_pod_network(run);
    let _log = LogOnFailure(relay.controller.path("driver.log"));
    for node in [KOSMOS1, KOSMOS2, HOST_NODE] {
        pods::relay_registered(&ctx.host, DRIVER, node, WAIT).await;
    }
    if std::env::var("RELAY_KOSMOS_ONLY").as_deref() == Ok("mobility-block") {
        crate::mobility_block_e2e::run(kosmos, ctx, &|| relay.controller.log()).await;
        return;
    }

    // ---- The seed's demo, with 1 GiB of data, moved to member2.
    let ns = ctx.namespace("move").await;
    let token = format!("move-{}", ctx.tag);
    let pvc = json!({"metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                 "resources": {"requests": {"storage": CLAIM}}}});
    Api::<PersistentVolumeClaim>::namespaced(ctx.host.clone(), &ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(pvc).expect("pvc"),
        )
        .await
        .expect("create host PVC");
    let deployments: Api<Deployment> = Api::namespaced(ctx.host.clone(), &ns);
    deployments
        .create(
            &PostParams::default(),
            &serde_json::from_value(mover_app(KOSMOS1, &token, data_mib())).expect("deployment"),
        )
        .await
        .expect("create Deployment");
    ctx.pod_running(&ctx.member1, &ns, None).await;
    let dir1 = data_dir(&ctx.member1, &ns).await;
    pods::file_says(&dir1.join("token"), &token, WAIT).await;
    let source_hash = hash(&dir1.join("blob"));
    let floor = cp_floor(&dir1.join("blob"));
    let uuid = relay_claims(&ctx.member1, &ns)
        .await
        .into_iter()
        .find_map(|c| {
            c.strip_prefix("relay-")
                .filter(|u| u.len() == 32)
                .map(String::from)
        })
        .expect("the data claim relay-<uuid> in member1");

    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS2).await;
    let (pod2, took) = moved(ctx, &ns, &ctx.member1, &ctx.member2, t).await;
    let dir2 = data_dir(&ctx.member2, &ns).await;
    assert!(
        dir2.starts_with(shared.join("m2-own")),
        "member2's copy {} is not on member2's own storage",
        dir2.display()
    );
    pods::file_says(&dir2.join(format!("seen-{pod2}")), &token, WAIT).await;
    assert_eq!(
        hash(&dir2.join("blob")),
        source_hash,
        "member2's copy differs"
    );
    let log = relay.controller.log();
    let first = passes(&log);
    let full = first
        .iter()
        .max_by_key(|p| p.1)
        .copied()
        .expect("a pass in the controller's log");
    let mbps = full.1 as f64 / 1e6 / full.3;
    let direct = pod_network_passes(&log);
    assert_eq!(
        direct,
        if pod_network { first.len() } else { 0 },
        "passes mover to mover over the pod network, of {} (the members share one: {pod_network})",
        first.len()
    );
    println!(
        "figure: move of {} MiB member1 → member2 ({}): edit to Running {took:.1} s; {} passes; the full one sent {:.1} MiB ({:.1} MiB on the wire) in {:.1} s = {mbps:.0} MB/s; cp here {floor:.0} MB/s (ratio {:.2})",
        data_mib(),
        if direct > 0 { "mover to mover over the pod network" } else { "through the API servers" },
        first.len(),
        full.1 as f64 / (1 << 20) as f64,
        full.2 as f64 / (1 << 20) as f64,
        full.3,
        mbps / floor
    );
    // The RelayVolume tells the move.
    let host_pv = pods::host_pv(&ctx.host, &ns, "data").await;
    let rvs: Api<RelayVolume> = Api::all(ctx.host.clone());
    let shown = eventually("the RelayVolume's status.move Moved", WAIT, || async {
        let rv = rvs
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|rv| rv.spec.volume_name == host_pv)?;
        let m = rv.status?.moving?;
        (m.phase == "Moved").then_some(m)
    })
    .await;
    assert_eq!(
        (shown.from.as_str(), shown.to.as_str()),
        ("member1", "member2")
    );
    assert!(
        shown.passes >= 1 && shown.total_bytes >= data_mib() << 20,
        "{shown:?}"
    );
    println!("figure: status.move after the move: {shown:?}");
    // The old copy goes once the pod ran on the new one; the movers go.
    eventually("member1's old claim deleted", WAIT, || async {
        relay_claims(&ctx.member1, &ns)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("no mover left in either member", WAIT, || async {
        (movers_left(&ctx.member1, &ns).await + movers_left(&ctx.member2, &ns).await == 0)
            .then_some(())
    })
    .await;

    // ---- Pre-copied back to member1: the host claim asks for the copy
    // while the pod runs in member2; 10 MiB rewritten after a pass; then
    // the move.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.host.clone(), &ns);
    let label =
        |to: Option<&str>| json!({"metadata": {"labels": {"relay.csi.dev/pre-copy-to": to}}});
    let before = passes(&relay.controller.log()).len();
    let t = Instant::now();
    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(label(Some("member1"))),
        )
        .await
        .expect("label the host claim");
    eventually("a pre-copy pass to member1 done", MOVE_WAIT, || async {
        (passes(&relay.controller.log()).len() > before).then_some(())
    })
    .await;
    let warm = passes(&relay.controller.log());
    println!(
        "figure: pre-copy to member1 asked: first pass done {:.1} s after the label, {:.1} MiB sent",
        t.elapsed().as_secs_f64(),
        warm.last().map_or(0, |p| p.1) as f64 / (1 << 20) as f64
    );
    rewrite_10_mib(&dir2.join("blob"));
    let changed_hash = hash(&dir2.join("blob"));
    let before = passes(&relay.controller.log()).len();
    ctx.move_to(&ns, KOSMOS1).await;
    ctx.old_pod_released(&ns, &ctx.member2).await;
    let gone = Instant::now();
    let pod1 = pods::one_running(&ctx.member1, &ns, "app=global", None, MOVE_WAIT).await;
    let cutover = gone.elapsed().as_secs_f64();
    let dir1 = data_dir(&ctx.member1, &ns).await;
    pods::file_says(&dir1.join(format!("seen-{pod1}")), &token, WAIT).await;
    assert_eq!(
        hash(&dir1.join("blob")),
        changed_hash,
        "member1's pre-copied copy differs"
    );
    let last: Vec<_> = passes(&relay.controller.log())
        .into_iter()
        .skip(before)
        .collect();
    let final_pass = last.iter().rev().find(|p| p.4).copied();
    println!(
        "figure: pre-copied move member2 → member1, 10 MiB rewritten after the last pass: cutover (old pod gone → new pod Running) {cutover:.1} s; {} pass(es) after the edit, the verified one sent {:.1} MiB ({:.1} MiB on the wire) in {:.1} s",
        last.len(),
        final_pass.map_or(0, |p| p.1) as f64 / (1 << 20) as f64,
        final_pass.map_or(0, |p| p.2) as f64 / (1 << 20) as f64,
        final_pass.map_or(0.0, |p| p.3)
    );
    claims
        .patch("data", &PatchParams::default(), &Patch::Merge(label(None)))
        .await
        .expect("unlabel the host claim");
    eventually("member2's copy deleted after the move", WAIT, || async {
        relay_claims(&ctx.member2, &ns)
            .await
            .is_empty()
            .then_some(())
    })
    .await;

    // ---- To member2 again (its copy was deleted: a full copy), a mover
    // and then the controller SIGKILLed during the copy.
    rewrite_10_mib(&dir1.join("blob"));
    let changed_hash = hash(&dir1.join("blob"));
    let before = passes(&relay.controller.log()).len();
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS2).await;
    let source = eventually("member1's source mover running", MOVE_WAIT, || async {
        mover_pid(&uuid, "source")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed = nix_kill(source);
    println!(
        "figure: crash move: source mover (pid {source}) SIGKILLed {:.1} s after the edit: {killed}",
        t.elapsed().as_secs_f64()
    );
    eventually("the source mover back", MOVE_WAIT, || async {
        mover_pid(&uuid, "source").filter(|p| *p != source)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    relay.crash_controller().await;
    println!(
        "figure: crash move: controller SIGKILLed and restarted {:.1} s after the edit",
        t.elapsed().as_secs_f64()
    );
    let (pod2, took) = moved(ctx, &ns, &ctx.member1, &ctx.member2, t).await;
    let dir2 = data_dir(&ctx.member2, &ns).await;
    pods::file_says(&dir2.join(format!("seen-{pod2}")), &token, WAIT).await;
    assert_eq!(
        hash(&dir2.join("blob")),
        changed_hash,
        "member2's copy after the crashes differs"
    );
    let after: Vec<_> = passes(&relay.controller.log())
        .into_iter()
        .skip(before)
        .collect();
    println!(
        "figure: crash move member1 → member2, a mover and the controller SIGKILLed: edit to Running {took:.1} s; its finished passes sent {:.1} MiB in {} pass(es) (a pass the kills cut short logs nothing)",
        after.iter().map(|p| p.1).sum::<u64>() as f64 / (1 << 20) as f64,
        after.len()
    );
    eventually("one claim in use: member1's copy deleted", WAIT, || async {
        relay_claims(&ctx.member1, &ns)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    eventually("no mover left after the crashes", WAIT, || async {
        (movers_left(&ctx.member1, &ns).await + movers_left(&ctx.member2, &ns).await == 0)
            .then_some(())
    })
    .await;

    // ---- Delete: nothing left anywhere.
    ctx.delete_and_check_nothing_left(&ns, [dir1, dir2]).await;
    let _ = classes.delete(CLASS, &DeleteParams::default()).await;

    // ---- Block volumes and a member too small, on CSI storage.
    if std::env::var("RELAY_MOVE_BLOCK").as_deref() == Ok("skip") {
        crate::common::skip("block moves and the member too small: RELAY_MOVE_BLOCK=skip");
    } else {
        crate::mobility_block_e2e::run(kosmos, ctx, &|| relay.controller.log()).await;
    }
    drop(relay);
}

/// On a failure, what the controller said last (its warnings and moves).
struct LogOnFailure(PathBuf);

impl Drop for LogOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let log = std::fs::read_to_string(&self.0).unwrap_or_default();
        let said: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("move"))
            .collect();
        eprintln!(
            "--- the controller's last warnings and moves ({}):",
            self.0.display()
        );
        for l in &said[said.len().saturating_sub(40)..] {
            eprintln!("{}", &l[..l.len().min(600)]);
        }
    }
}

/// 10 MiB of `file` rewritten with random data, as the app would.
fn rewrite_10_mib(file: &Path) {
    let out = std::process::Command::new("dd")
        .args([
            "if=/dev/urandom",
            "bs=1M",
            "count=10",
            "seek=100",
            "conv=notrunc,fsync",
        ])
        .arg(format!("of={}", file.display()))
        .output()
        .expect("dd");
    assert!(
        out.status.success(),
        "dd: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGKILL of `pid`: what it said.
fn nix_kill(pid: i32) -> String {
    match nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    ) {
        Ok(()) => "killed".into(),
        Err(e) => format!("kill failed: {e}"),
    }
}
