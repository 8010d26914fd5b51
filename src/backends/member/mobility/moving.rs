//! The moves in progress: one task per volume that copies it from its
//! member to the one a pod of it now runs in, pass after pass, until a
//! pass verifies while nothing could write the source. Nothing here is the
//! record of a move: its objects are named from the volume (the target's
//! data claim, the movers, their Secret), so a restarted controller finds
//! them and starts passing again (a pass sends only what the target
//! lacks). The switch of home is the caller's, under the volume's lock,
//! and is recorded before the new member's access claim is made.
//!
//! Whether a verified pass may serve: it started while the source member
//! had no access claim (no pod there could write), and no publish in that
//! member happened since it started (`interrupt` counts them: such a
//! publish makes the access claim under the same volume lock the switch
//! takes).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::Notify;

use super::attachments;
use super::channel::{self, Channel, End, KEY_LEN};
use super::import;
use super::mover::{Role, PORT};
use super::mover_pod::{self, PodPlan};
use super::pass::{self, PassReport, PullError};
use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::MemberVolume;
use crate::k8s::port_forward::{self, PortStream};
use crate::k8s::relay_move::{Step, COPYING, RETRYING, VERIFIED};
use crate::k8s::relay_volume::RelayMoveStatus;
use crate::rt::move_stall;

/// Pause between passes while the source may still change (a pre-copy).
const LIVE_PASS_PAUSE: Duration = Duration::from_secs(5);
const RETRY_MIN: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long the movers may take to start before the attempt is retried.
const MOVER_START: Duration = Duration::from_secs(120);

/// Everything a move's task needs, fixed when it starts.
#[derive(Clone)]
pub struct Plan {
    pub volume_id: String,
    pub uuid: String,
    pub from: Cluster,
    pub to: Cluster,
    /// The data claim in each member (the same name and namespace).
    pub data: MemberVolume,
    /// The access claim pods use in the source member.
    pub access: MemberVolume,
    pub target_claim: PersistentVolumeClaim,
    pub image: String,
    pub block: bool,
    /// Which way the passes' bytes may go.
    pub path: MoverPath,
    /// Where to tell the host's attacher that the move is done.
    pub host: Option<(Cluster, String)>,
    /// The host claim (namespace, name), where the move's steps are shown
    /// as Events.
    pub host_claim: Option<(String, String)>,
}

/// Which way a move's bytes go between its two movers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MoverPath {
    /// Mover to mover on the pod network where the members' pod networks
    /// reach each other (Kosmos ClusterLink, Liqo, Submariner): the target
    /// mover tries the source mover's pod IP first, and the move goes
    /// through the API servers when no session opens within 5 s.
    #[default]
    Auto,
    /// Always through the members' API servers (port-forwards to each
    /// mover's loopback); the source mover listens on its loopback only.
    Api,
}

/// How the last pass went, as people read it.
pub const VIA_POD_NETWORK: &str = "mover to mover over the pod network";
pub const VIA_API_SERVERS: &str = "through the API servers";

#[derive(Debug, Clone, Default)]
pub struct Status {
    pub to: String,
    pub phase: &'static str,
    /// `VIA_POD_NETWORK` or `VIA_API_SERVERS`, once a pass ran.
    pub via: &'static str,
    pub passes: u32,
    pub done: u64,
    pub total: u64,
    pub sent: u64,
    pub last: Option<PassReport>,
    pub error: Option<String>,
    /// The epoch of the pass that verified while the source was quiet.
    verified: Option<u64>,
}

struct Move {
    to: String,
    status: Mutex<Status>,
    epoch: AtomicU64,
    verified: Notify,
    /// The movers' key, once this process made their Secrets.
    key: Mutex<Option<[u8; KEY_LEN]>>,
    /// Whether a publish wants the move (else only a pre-copy does).
    published: AtomicBool,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    started: Instant,
}

#[derive(Default)]
pub struct Moves {
    map: Mutex<HashMap<String, Arc<Move>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Moves {
    /// The move of `volume_id` to `to`, started unless running already; a
    /// move of it elsewhere is stopped first.
    pub fn ensure(&self, plan: Plan) {
        self.start(plan, true);
    }

    /// The move of `volume_id` to `plan.to` asked ahead (a pre-copy): the
    /// same passes, but only a publish makes it wanted for the switch, and
    /// `stop_pre_copy` ends it until then.
    pub fn ensure_pre_copy(&self, plan: Plan) {
        self.start(plan, false);
    }

    /// Ends a move nothing but a pre-copy wanted; whether it did.
    pub fn stop_pre_copy(&self, volume_id: &str) -> bool {
        let mut map = lock(&self.map);
        let Some(m) = map.get(volume_id) else {
            return false;
        };
        if m.published.load(Ordering::SeqCst) {
            return false;
        }
        if let Some(t) = lock(&m.task).take() {
            t.abort();
        }
        map.remove(volume_id);
        move_stall::settled(volume_id);
        true
    }

    fn start(&self, plan: Plan, published: bool) {
        let to = plan.to.name().to_string();
        let mut map = lock(&self.map);
        if let Some(m) = map.get(&plan.volume_id) {
            let alive = lock(&m.task).as_ref().is_some_and(|t| !t.is_finished());
            if m.to == to && alive {
                if published {
                    m.published.store(true, Ordering::SeqCst);
                }
                return;
            }
            if let Some(t) = lock(&m.task).take() {
                t.abort();
            }
        }
        let m = Arc::new(Move {
            to: to.clone(),
            status: Mutex::new(Status {
                to,
                phase: "Preparing",
                ..Default::default()
            }),
            epoch: AtomicU64::new(0),
            verified: Notify::new(),
            key: Mutex::new(None),
            published: AtomicBool::new(published),
            task: Mutex::new(None),
            started: Instant::now(),
        });
        move_stall::progressed(&plan.volume_id);
        let task = tokio::spawn(run(plan.clone(), m.clone()));
        *lock(&m.task) = Some(task);
        map.insert(plan.volume_id, m);
    }

    pub fn status(&self, volume_id: &str) -> Option<Status> {
        let map = lock(&self.map);
        map.get(volume_id).map(|m| lock(&m.status).clone())
    }

    /// A pod of the volume is published in its own member again: a move
    /// only a publish elsewhere wanted is no longer wanted, and stops; the
    /// member it was going to, and its last status. A pre-copy stays (its
    /// label still asks; a later move sends only what changed).
    pub fn abandon(&self, volume_id: &str) -> Option<(String, Status)> {
        let mut map = lock(&self.map);
        let m = map.get(volume_id)?;
        if !m.published.load(Ordering::SeqCst) {
            return None;
        }
        if let Some(t) = lock(&m.task).take() {
            t.abort();
        }
        let status = lock(&m.status).clone();
        let to = m.to.clone();
        map.remove(volume_id);
        move_stall::settled(volume_id);
        Some((to, status))
    }

    /// A publish in the volume's own member: no pass that began before
    /// it may serve.
    pub fn interrupt(&self, volume_id: &str) {
        if let Some(m) = lock(&self.map).get(volume_id) {
            m.epoch.fetch_add(1, Ordering::SeqCst);
            lock(&m.status).verified = None;
        }
    }

    /// Whether the move to `to` has a pass that may serve.
    pub fn verified(&self, volume_id: &str, to: &str) -> bool {
        let map = lock(&self.map);
        map.get(volume_id).is_some_and(|m| {
            m.to == to && lock(&m.status).verified == Some(m.epoch.load(Ordering::SeqCst))
        })
    }

    /// Waits at most `budget` for the move to verify.
    pub async fn wait_verified(&self, volume_id: &str, to: &str, budget: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let m = lock(&self.map).get(volume_id).cloned();
            let Some(m) = m else { return false };
            let notified = m.verified.notified();
            if self.verified(volume_id, to) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.verified(volume_id, to);
            }
        }
    }

    /// The move is over (switched, or the volume is gone): its task stops;
    /// the seconds it took.
    pub fn finish(&self, volume_id: &str) -> Option<f64> {
        move_stall::settled(volume_id);
        let m = lock(&self.map).remove(volume_id)?;
        if let Some(t) = lock(&m.task).take() {
            t.abort();
        }
        Some(m.started.elapsed().as_secs_f64())
    }
}

/// "pass 2, 300.0 MiB of 1.0 GiB read, 12.0 MiB sent; last: …".
pub fn describe(s: &Status) -> String {
    let mut out = format!(
        "{}: pass {}, {} of {} read, {} sent",
        s.phase,
        s.passes.max(1),
        mib(s.done),
        mib(s.total),
        mib(s.sent)
    );
    if let Some(last) = &s.last {
        out.push_str(&format!(
            "; last pass {:.1} s, {} sent {}, {}",
            last.seconds,
            mib(last.sent),
            s.via,
            if last.verified {
                "verified"
            } else {
                "source changed during it"
            }
        ));
    }
    if let Some(e) = &s.error {
        out.push_str(&format!("; last error: {e}"));
    }
    out
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

async fn run(plan: Plan, m: Arc<Move>) {
    let mut backoff = RETRY_MIN;
    loop {
        match attempt(&plan, &m).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(volume_id = %plan.volume_id, to = %m.to, error = %e, "move: attempt failed; retrying");
                crate::rt::metrics::move_failure(plan.from.name(), &m.to);
                tell(
                    &plan,
                    &RETRYING,
                    &format!("moving to member cluster {}: {e}; retried", m.to),
                )
                .await;
                set(&m, |s| {
                    s.error = Some(e);
                    s.phase = "Retrying";
                });
                show(&plan, &m, false).await;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

fn set(m: &Move, f: impl FnOnce(&mut Status)) {
    f(&mut lock(&m.status));
}

/// The RelayVolume's `status.move` of a move, from its status.
pub fn move_status(from: &str, s: &Status, last_sync: Option<String>) -> RelayMoveStatus {
    RelayMoveStatus {
        from: from.to_string(),
        to: s.to.clone(),
        phase: s.phase.to_string(),
        passes: s.passes,
        total_bytes: s.total,
        sent_bytes: s.last.as_ref().map_or(s.sent, |l| l.sent),
        last_sync,
        move_seconds: None,
        message: s.error.clone(),
    }
}

/// Shows the move's status on its RelayVolume, when the controller has the
/// host cluster.
async fn show(plan: &Plan, m: &Move, synced: bool) {
    let Some((host, _)) = &plan.host else { return };
    let status = lock(&m.status).clone();
    let last = synced.then(crate::k8s::relay_move::now);
    let shown = move_status(plan.from.name(), &status, last);
    crate::k8s::relay_move::report(host, &plan.volume_id, &shown).await;
}

/// Shows a step of the move as an Event on the host claim.
async fn tell(plan: &Plan, step: &Step, note: &str) {
    if let (Some((host, _)), Some(claim)) = (&plan.host, &plan.host_claim) {
        crate::k8s::relay_move::tell(host, claim, step, note).await;
    }
}

/// One try: the target claim, the Secrets and movers, then passes until
/// one may serve (then it waits to be stopped).
async fn attempt(plan: &Plan, m: &Move) -> Result<(), String> {
    let ns = &plan.data.namespace;
    let e = |e: CsiError| e.to_string();
    ensure_target_claim(plan).await.map_err(e)?;
    // The key lives in this process only: the relay may create and delete
    // its Secrets but never read one back, so a new controller (or a move
    // restarted after a failed attempt that lost it) starts over with a
    // new key, new Secrets and new movers; the next pass still sends only
    // what the target lacks.
    let known = *lock(&m.key);
    let key = match known {
        Some(k) => {
            for c in [&plan.from, &plan.to] {
                mover_pod::create_secret(c, &plan.uuid, ns, &k)
                    .await
                    .map_err(e)?;
            }
            k
        }
        None => {
            let key = channel::new_key();
            for c in [&plan.from, &plan.to] {
                mover_pod::remove_all(c, &plan.uuid, ns).await.map_err(e)?;
                mover_pod::create_secret(c, &plan.uuid, ns, &key)
                    .await
                    .map_err(e)?;
            }
            *lock(&m.key) = Some(key);
            key
        }
    };
    let move_id = move_id(plan);
    set(m, |s| s.phase = "StartingMovers");
    show(plan, m, false).await;
    let started = Instant::now();
    loop {
        let mut waiting = Vec::new();
        for (c, role) in [(&plan.from, Role::Source), (&plan.to, Role::Target)] {
            let name = mover_pod::pod_name(&plan.uuid, role);
            match mover_pod::get_pod(c, ns, &name).await.map_err(e)? {
                Some(p) => {
                    if let Err(w) = mover_pod::running(&p, &plan.uuid) {
                        waiting.push(format!("{}: mover pod {ns}/{name} {w}", c.label()));
                        if role == Role::Target {
                            waiting.extend(target_claim_waits(plan).await);
                        }
                    }
                }
                None => {
                    if let Some(held) = start_mover(plan, c, role, &move_id).await.map_err(e)? {
                        waiting.push(format!(
                            "{}: mover pod {ns}/{name} starts once {held} is gone",
                            c.label()
                        ));
                    } else {
                        waiting.push(format!("{}: mover pod {ns}/{name} created", c.label()));
                    }
                }
            }
        }
        if waiting.is_empty() {
            break;
        }
        if started.elapsed() > MOVER_START {
            return Err(waiting.join("; "));
        }
        set(m, |s| s.error = Some(waiting.join("; ")));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut source = connect(&plan.from, ns, &plan.uuid, Role::Source, &key, &move_id).await?;
    let mut target = connect(&plan.to, ns, &plan.uuid, Role::Target, &key, &move_id).await?;
    // The pod network first, where allowed; the first pass that finds it
    // unreachable sends this attempt's passes through the API servers.
    let mut peer = match plan.path {
        MoverPath::Auto => source_peer(plan).await.map_err(e)?,
        MoverPath::Api => None,
    };
    set(m, |s| {
        s.phase = "Copying";
        s.error = None;
    });
    show(plan, m, false).await;
    let why = match m.published.load(Ordering::SeqCst) {
        true => "a pod of it runs there now",
        false => "a pre-copy asked by label relay.csi.dev/pre-copy-to",
    };
    tell(
        plan,
        &COPYING,
        &format!(
            "copying volume {} from member cluster {} to member cluster {} ({why}); the pod starts once a pass verifies the copy",
            plan.volume_id,
            plan.from.name(),
            m.to
        ),
    )
    .await;
    loop {
        let epoch = m.epoch.load(Ordering::SeqCst);
        let quiet = !source_in_use(plan).await.map_err(e)?;
        move_stall::progressed(&plan.volume_id);
        let mut progress = |done: u64, total: u64, sent: u64| {
            move_stall::progressed(&plan.volume_id);
            set(m, |s| {
                s.done = done;
                s.total = total;
                s.sent = sent;
            })
        };
        set(m, |s| s.passes += 1);
        let report = match peer.as_deref() {
            Some(p) => match pass::pull(&mut target, p, &mut progress).await {
                Ok(report) => report,
                Err(PullError::Unreachable(why)) => {
                    tracing::info!(volume_id = %plan.volume_id, to = %m.to, peer = p, error = %why, "move: the target mover does not reach the source mover on the pod network; the passes go through the API servers");
                    peer = None;
                    pass::run(&mut source, &mut target, &mut progress).await?
                }
                Err(PullError::Failed(e)) => return Err(e),
            },
            None => pass::run(&mut source, &mut target, &mut progress).await?,
        };
        let via = match peer {
            Some(_) => VIA_POD_NETWORK,
            None => VIA_API_SERVERS,
        };
        crate::rt::metrics::move_pass(plan.from.name(), &m.to, report.wire, report.seconds);
        let pod_network = via == VIA_POD_NETWORK;
        tracing::info!(volume_id = %plan.volume_id, to = %m.to, quiet, pod_network, total = report.total, sent = report.sent, wire = report.wire, seconds = report.seconds, verified = report.verified, "move: pass done");
        let serves = report.verified && quiet && m.epoch.load(Ordering::SeqCst) == epoch;
        set(m, |s| {
            s.via = via;
            s.last = Some(report.clone());
            if serves {
                s.verified = Some(epoch);
                s.phase = "Verified";
            } else {
                s.phase = "Syncing";
            }
        });
        show(plan, m, true).await;
        if serves {
            // Waiting for the attach is no stall.
            move_stall::settled(&plan.volume_id);
            // Told before the waiting publish hears of it: the switch
            // that follows ends this task, and with it an Event not yet
            // sent (the move's Events then read Copying, Verified, Moved).
            tell(
                plan,
                &VERIFIED,
                &format!(
                    "pass {} verified the copy in member cluster {} ({} of {} sent in {:.1} s, {via}); the volume switches there at the next attach",
                    lock(&m.status).passes,
                    m.to,
                    mib(report.sent),
                    mib(report.total),
                    report.seconds
                ),
            )
            .await;
            m.verified.notify_waiters();
            if let Some((host, pv)) = &plan.host {
                nudge_attacher(host, pv, plan.to.name()).await;
            }
            // Nothing changes the source until the switch or a publish
            // in its member; the latter asks for a new pass.
            while m.epoch.load(Ordering::SeqCst) == epoch {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            continue;
        }
        tokio::time::sleep(if quiet {
            Duration::from_millis(200)
        } else {
            LIVE_PASS_PAUSE
        })
        .await;
    }
}

fn move_id(plan: &Plan) -> String {
    format!("{}-{}", plan.uuid, plan.to.name())
}

/// The target's data claim, made once (by name) with the relay's marks.
async fn ensure_target_claim(plan: &Plan) -> CsiResult<()> {
    let api = Api::<PersistentVolumeClaim>::namespaced(plan.to.client(), &plan.data.namespace);
    let path = plan.data.pvc_path();
    let found =
        crate::backends::member::pvc::get(&plan.to, &plan.data.namespace, &plan.data.pvc).await?;
    match found {
        Some(c) if crate::backends::member::pvc::belongs_to(&c, &plan.volume_id) => Ok(()),
        Some(_) => Err(CsiError::FailedPrecondition(format!(
            "{}: PersistentVolumeClaim {path} exists and is not volume {}'s; the volume cannot move there",
            plan.to.label(),
            plan.volume_id
        ))),
        None => {
            plan.to
                .create(
                    &format!("create PersistentVolumeClaim {path}"),
                    api.create(&PostParams::default(), &plan.target_claim),
                )
                .await?;
            tracing::info!(volume_id = %plan.volume_id, to = %plan.to.name(), claim = %path, "move: target claim made");
            Ok(())
        }
    }
}

/// Why the target's data claim keeps its mover from starting, when it is
/// not Bound: what its member said of it (its provisioner's last warning:
/// no space, a size its class refuses, no such class).
async fn target_claim_waits(plan: &Plan) -> Option<String> {
    let found = crate::backends::member::pvc::get(&plan.to, &plan.data.namespace, &plan.data.pvc)
        .await
        .ok()??;
    let phase = crate::backends::member::pvc::phase(&found);
    if phase == "Bound" {
        return None;
    }
    let said = crate::backends::member::claim_bound::last_warning(&plan.to, &found).await;
    Some(format!(
        "{}: the copy's PersistentVolumeClaim {} is {phase}{}",
        plan.to.label(),
        plan.data.pvc_path(),
        said.map_or_else(String::new, |s| format!(": the member says {s}"))
    ))
}

/// Creates the mover of `role` in `c`, unless the volume's attachments
/// there are not the mover's to share (`attachments`): with no pod of the
/// volume there, any attachment of its data or import PV is one being
/// detached, or about to be; with one (a pre-copy's source, on that pod's
/// node), only one being detached is. `Some(what holds it)` then, and
/// nothing is created.
async fn start_mover(
    plan: &Plan,
    c: &Cluster,
    role: Role,
    move_id: &str,
) -> CsiResult<Option<String>> {
    let ns = &plan.data.namespace;
    let node = match role {
        Role::Source => node_of_users(c, &plan.access).await?,
        Role::Target => None,
    };
    let data = crate::backends::member::pvc::get(c, ns, &plan.data.pvc).await?;
    let import_pv = import::pv_name(&plan.uuid);
    let mut pvs = vec![import_pv.as_str()];
    pvs.extend(
        data.as_ref()
            .and_then(crate::backends::member::pvc::bound_pv),
    );
    let held = attachments::holding(attachments::of(c, &pvs).await?, node.is_some());
    if !held.is_empty() {
        return Ok(Some(attachments::describe(&held)));
    }
    let p = PodPlan {
        uuid: &plan.uuid,
        move_id,
        namespace: ns,
        claim: &plan.data.pvc,
        role,
        image: &plan.image,
        block: plan.block,
        node,
        pod_network: role == Role::Source && plan.path == MoverPath::Auto,
    };
    mover_pod::create_pod(c, &p).await?;
    Ok(None)
}

/// The source mover's address on its member's pod network, `ip:port`
/// (its pod's IP as the member reports it); `None` before it has one.
async fn source_peer(plan: &Plan) -> CsiResult<Option<String>> {
    let name = mover_pod::pod_name(&plan.uuid, Role::Source);
    let pod = mover_pod::get_pod(&plan.from, &plan.data.namespace, &name).await?;
    let ip = pod
        .and_then(|p| p.status)
        .and_then(|s| s.pod_ip)
        .and_then(|ip| ip.parse::<std::net::IpAddr>().ok());
    Ok(ip.map(|ip| std::net::SocketAddr::new(ip, PORT).to_string()))
}

/// Whether a pod in the source member may write the volume now: its
/// access claim there exists.
async fn source_in_use(plan: &Plan) -> CsiResult<bool> {
    let found =
        crate::backends::member::pvc::get(&plan.from, &plan.access.namespace, &plan.access.pvc)
            .await?;
    Ok(found.is_some_and(|c| {
        crate::backends::member::mobility::import::is_access_claim(
            &c,
            &plan.access,
            &plan.volume_id,
        )
    }))
}

/// The node of a pod using the access claim: a claim one node at a time
/// may mount is read there.
async fn node_of_users(c: &Cluster, access: &MemberVolume) -> CsiResult<Option<String>> {
    let pods: Vec<Pod> = crate::backends::member::mobility::import::pods_using(c, access).await?;
    Ok(pods
        .into_iter()
        .find_map(|p| p.spec.and_then(|s| s.node_name)))
}

/// A session with a mover through a port-forward of its member's API
/// server.
async fn connect(
    c: &Cluster,
    ns: &str,
    uuid: &str,
    role: Role,
    key: &[u8; KEY_LEN],
    move_id: &str,
) -> Result<Channel<PortStream>, String> {
    let name = mover_pod::pod_name(uuid, role);
    let what = format!("{}: port-forward to mover pod {ns}/{name}", c.label());
    let mut last = String::new();
    for _ in 0..10 {
        let opened = port_forward::open(c.stream_client(), ns, &name, PORT);
        let stream = match tokio::time::timeout(Duration::from_secs(10), opened).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                last = format!("{what}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(_) => {
                last = format!("{what}: no answer in 10 s");
                continue;
            }
        };
        match tokio::time::timeout(
            Duration::from_secs(20),
            Channel::open(stream, End::Controller, key, move_id, role.as_str()),
        )
        .await
        {
            Ok(Ok(ch)) => return Ok(ch),
            Ok(Err(e)) => last = format!("{what}: {e}"),
            Err(_) => last = format!("{what}: no handshake in 20 s"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(last)
}

/// The host's VolumeAttachments of the volume's PV on nodes of member `to`
/// get an annotation: the attacher takes the change as a reason to call
/// ControllerPublishVolume now, not at its next back-off.
async fn nudge_attacher(host: &Cluster, pv: &str, to: &str) {
    let api = Api::<VolumeAttachment>::all(host.client());
    let listed = host
        .fetch("list VolumeAttachments", api.list(&Default::default()))
        .await;
    let Ok(Some(list)) = listed else { return };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for va in list.items {
        let ours = va.spec.source.persistent_volume_name.as_deref() == Some(pv);
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        let Some(name) = va.metadata.name.clone().filter(|_| ours && !attached) else {
            continue;
        };
        let patch = serde_json::json!({"metadata": {"annotations": {MOVED_ANNOTATION: format!("{to}@{stamp}")}}});
        let _ = host
            .run(
                &format!("annotate VolumeAttachment {name}"),
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await;
    }
}

/// Set on a VolumeAttachment when the volume's copy to its node's member
/// verified: `member@unix-seconds`.
pub const MOVED_ANNOTATION: &str = "relay.csi.dev/moved";

/// The old member's data claim once the volume served in its new member.
pub fn old_data_claim(data: &MemberVolume, from: &str) -> MemberVolume {
    MemberVolume {
        member: from.to_string(),
        ..data.clone()
    }
}

/// Whether a pod ran on the volume in `to` (its access claim has a
/// running user there).
pub async fn served_in(to: &Cluster, access: &MemberVolume) -> CsiResult<bool> {
    let pods = crate::backends::member::mobility::import::pods_using(to, access).await?;
    Ok(pods
        .iter()
        .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A move to `to` whose task is not running: what `ensure` registers,
    /// without the copy.
    fn registered(moves: &Moves, volume: &str, to: &str) -> Arc<Move> {
        let m = Arc::new(Move {
            to: to.into(),
            status: Mutex::new(Status::default()),
            epoch: AtomicU64::new(0),
            verified: Notify::new(),
            key: Mutex::new(None),
            published: AtomicBool::new(true),
            task: Mutex::new(None),
            started: Instant::now(),
        });
        lock(&moves.map).insert(volume.into(), m.clone());
        m
    }

    /// What a pass that began at `epoch` and verified records.
    fn verified_at(m: &Move, epoch: u64) {
        lock(&m.status).verified = Some(epoch);
        m.verified.notify_waiters();
    }

    #[test]
    fn a_verified_pass_serves_only_its_target_and_only_until_a_publish_at_the_source() {
        let moves = Moves::default();
        let m = registered(&moves, "vol-1", "west");
        assert!(!moves.verified("vol-1", "west"), "nothing verified yet");
        verified_at(&m, 0);
        assert!(moves.verified("vol-1", "west"));
        assert!(!moves.verified("vol-1", "north"), "another member's move");
        assert!(!moves.verified("vol-2", "west"), "another volume");
        // A publish in the old member: the pass no longer serves, nor does
        // one that began before it and reports after.
        moves.interrupt("vol-1");
        assert!(!moves.verified("vol-1", "west"));
        verified_at(&m, 0);
        assert!(!moves.verified("vol-1", "west"), "a pass of the old epoch");
        verified_at(&m, 1);
        assert!(moves.verified("vol-1", "west"), "a pass begun after it");
        assert!(moves.finish("vol-1").is_some());
        assert!(!moves.verified("vol-1", "west"), "finished");
        assert!(moves.finish("vol-1").is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_waits_for_a_pass_about_to_verify_and_not_longer() {
        let moves = Arc::new(Moves::default());
        let m = registered(&moves, "vol-1", "west");
        let waiting = {
            let moves = moves.clone();
            tokio::spawn(async move {
                moves
                    .wait_verified("vol-1", "west", Duration::from_secs(20))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        verified_at(&m, 0);
        assert!(waiting.await.unwrap(), "woken by the pass");
        moves.interrupt("vol-1");
        let t = tokio::time::Instant::now();
        assert!(
            !moves
                .wait_verified("vol-1", "west", Duration::from_secs(20))
                .await
        );
        assert_eq!(t.elapsed(), Duration::from_secs(20));
        assert!(
            !moves
                .wait_verified("vol-2", "west", Duration::from_secs(20))
                .await,
            "no move of that volume"
        );
    }

    #[test]
    fn a_pre_copy_stops_when_no_longer_asked_unless_a_publish_wants_the_move() {
        let moves = Moves::default();
        let m = registered(&moves, "vol-1", "west");
        m.published.store(false, Ordering::SeqCst);
        assert!(moves.stop_pre_copy("vol-1"));
        assert!(moves.status("vol-1").is_none());
        assert!(!moves.stop_pre_copy("vol-1"), "nothing left to stop");
        // A pod landed in west meanwhile: the move goes on.
        registered(&moves, "vol-2", "west");
        assert!(!moves.stop_pre_copy("vol-2"));
        assert!(moves.status("vol-2").is_some());
    }

    #[test]
    fn a_pod_back_home_ends_the_move_a_publish_wanted_but_not_a_pre_copy() {
        let moves = Moves::default();
        let m = registered(&moves, "vol-1", "west");
        lock(&m.status).passes = 3;
        let (to, last) = moves.abandon("vol-1").expect("a move a publish wanted");
        assert_eq!((to.as_str(), last.passes), ("west", 3));
        assert!(moves.status("vol-1").is_none(), "the move is over");
        assert!(!moves.verified("vol-1", "west"));
        assert!(moves.abandon("vol-1").is_none(), "nothing left to end");
        // Only a pre-copy asked: its label still does, the passes go on.
        let m = registered(&moves, "vol-2", "west");
        m.published.store(false, Ordering::SeqCst);
        assert!(moves.abandon("vol-2").is_none());
        assert!(moves.status("vol-2").is_some());
    }

    #[test]
    fn the_progress_reads_as_a_person_would() {
        let s = Status {
            phase: "Copying",
            passes: 2,
            done: 300 << 20,
            total: 1 << 30,
            sent: 12 << 20,
            error: Some("member2: mover pod x is Pending".into()),
            ..Default::default()
        };
        assert_eq!(
            describe(&s),
            "Copying: pass 2, 300.0 MiB of 1024.0 MiB read, 12.0 MiB sent; last error: member2: mover pod x is Pending"
        );
    }
}
