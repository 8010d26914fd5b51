//! What the member cluster itself reports about relay volumes: the only
//! source of state for pods that run there (a pod on a virtual node), where
//! no ControllerPublishVolume or node call ever reaches the relay. The rules
//! are in [`member_view`](crate::k8s::member_view).
//!
//! The member is a production cluster, mostly full of objects that are none
//! of the relay's business, so only what concerns relay claims is watched
//! and kept, in slim form ([`watched`](crate::k8s::watched)):
//! - the relay's claims, by label, cluster-wide;
//! - the PVs they are bound to, read once by name when a claim binds, a
//!   few at a time, the next as one ends (no
//!   watch: what the states read of a PV does not change once bound);
//! - VolumeAttachments and Nodes, cluster-wide (nodes for
//!   `status.volumesInUse`; an attachment or node keeps a few names);
//! - pods, only in namespaces that hold relay claims: one watch per such
//!   namespace, started and stopped as claims come and go (past
//!   [`NAMESPACE_WATCHES`] namespaces, one cluster-wide watch instead);
//!   pods that use no claim are dropped as they arrive.
//!
//! Each change marks the volumes it concerns; at most once per [`SETTLE`]
//! those volumes' states are computed and what changed is applied to their
//! RelayVolumes' status with this member's own field manager. A write that
//! fails is retried for that volume, later each time.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::k8s::cluster::Cluster;
use crate::k8s::member_view::{Attachment, BoundVolume, Claim, Dirty, Key, MemberView, PodUse};
use crate::k8s::naming;
use crate::k8s::relay_volume::{
    controller_status_body, object_name, view_key, RelayNodeStatus, RelayVolume, View,
};
use crate::k8s::watched::{AttachmentObject, ClaimObject, NodeObject, PodObject, VolumeObject};
use crate::k8s::{CALL_TIMEOUT, FIELD_MANAGER};

/// How long changes are gathered before the volumes they concern are
/// computed and written.
pub const SETTLE: Duration = Duration::from_millis(500);
/// Writes (and PV reads) in flight at once.
const PARALLEL: usize = 8;
/// Namespaces whose pods are watched one by one; past that, one watch
/// over all namespaces.
const NAMESPACE_WATCHES: usize = 32;
/// The scope of the cluster-wide pod watch (no namespace is named "").
const ALL_NAMESPACES: &str = "";
/// The longest wait before a failed write or read is tried again.
const MAX_RETRY: Duration = Duration::from_secs(30);
/// How long writes wait for a new pod watch's first listing: a volume
/// computed from its claim without its pods would be written a lower state
/// and then its own again (at a controller's start, every volume).
const LIST_GRACE: Duration = Duration::from_secs(30);

/// The entry key of a member node in `status.nodes`: `<member>/<node>`,
/// which no host node name can be (a name has no '/').
pub fn entry_key(member: &str, node: &str) -> String {
    format!("{member}/{node}")
}

/// A watch's news, already reduced to what the view keeps.
enum Sync<R> {
    /// Added or changed; `None`: deleted, or no longer of interest.
    Set(Key, Option<R>),
    /// The watch listed everything again: what is not here is gone.
    Replace(Vec<(Key, R)>),
}

enum Change {
    Claims(Sync<Claim>),
    Attachments(Sync<Attachment>),
    Nodes(Sync<BTreeSet<String>>),
    /// From the pod watch of `namespace` (all: [`ALL_NAMESPACES`])
    /// numbered `watch`.
    Pods {
        namespace: String,
        watch: u64,
        sync: Sync<PodUse>,
    },
    /// What reading a PV found.
    Volume {
        name: String,
        read: Result<Option<BoundVolume>, String>,
    },
}

/// A watched kind and what the view keeps of it.
trait Slim:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static
{
    type Kept: Send + 'static;
    fn keep(self) -> Option<Self::Kept>;
}

fn key_of<K: kube::Resource>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl Slim for ClaimObject {
    type Kept = Claim;
    fn keep(self) -> Option<Claim> {
        let volume_id = self
            .metadata
            .annotations?
            .remove(naming::VOLUME_ID_ANNOTATION)?;
        Some(Claim {
            volume_id,
            uid: self.metadata.uid,
            volume_name: self
                .spec
                .and_then(|s| s.volume_name)
                .filter(|n| !n.is_empty()),
        })
    }
}

impl Slim for AttachmentObject {
    type Kept = Attachment;
    fn keep(self) -> Option<Attachment> {
        Some(Attachment {
            pv: self.spec.source.persistent_volume_name,
            node: self.spec.node_name,
            attached: self.status.is_some_and(|s| s.attached),
        })
    }
}

impl Slim for NodeObject {
    type Kept = BTreeSet<String>;
    fn keep(self) -> Option<BTreeSet<String>> {
        Some(
            self.status
                .map(|s| s.volumes_in_use.into_iter().collect())
                .unwrap_or_default(),
        )
    }
}

impl Slim for PodObject {
    type Kept = PodUse;
    fn keep(self) -> Option<PodUse> {
        let spec = self.spec?;
        let claims: Vec<String> = spec
            .volumes
            .into_iter()
            .filter_map(|v| v.persistent_volume_claim.map(|c| c.claim_name))
            .collect();
        if claims.is_empty() {
            return None;
        }
        let running = self.metadata.deletion_timestamp.is_none()
            && self.status.and_then(|s| s.phase).as_deref() == Some("Running");
        Some(PodUse {
            node: spec.node_name.filter(|n| !n.is_empty()),
            running,
            claims,
        })
    }
}

/// How kubelet names a CSI volume in `status.volumesInUse`.
fn bound_volume(pv: VolumeObject) -> BoundVolume {
    let spec = pv.spec.unwrap_or_default();
    BoundVolume {
        claim: spec.claim_ref.map(|r| {
            (
                (r.namespace.unwrap_or_default(), r.name.unwrap_or_default()),
                r.uid,
            )
        }),
        in_use: spec
            .csi
            .map(|c| format!("kubernetes.io/csi/{}^{}", c.driver, c.volume_handle)),
    }
}

/// Runs a watch and sends what it sees, slimmed, as `wrap` makes it a
/// change. A relisting is gathered and sent whole, so the view can drop
/// what disappeared meanwhile. Ends when the receiver is gone.
fn forward<K: Slim>(
    api: Api<K>,
    config: watcher::Config,
    tx: mpsc::Sender<Change>,
    wrap: impl Fn(Sync<K::Kept>) -> Change + Send + 'static,
) -> AbortHandle {
    tokio::spawn(async move {
        let mut stream = Box::pin(watcher::watcher(api, config).default_backoff());
        let mut listing: Vec<(Key, K::Kept)> = Vec::new();
        while let Some(event) = stream.next().await {
            let sync = match event {
                Ok(Event::Init) => {
                    listing = Vec::new();
                    continue;
                }
                Ok(Event::InitApply(obj)) => {
                    let key = key_of(&obj);
                    listing.extend(obj.keep().map(|kept| (key, kept)));
                    continue;
                }
                Ok(Event::InitDone) => Sync::Replace(std::mem::take(&mut listing)),
                Ok(Event::Apply(obj)) => {
                    let key = key_of(&obj);
                    Sync::Set(key, obj.keep())
                }
                Ok(Event::Delete(obj)) => Sync::Set(key_of(&obj), None),
                Err(e) => {
                    tracing::debug!(error = %e, kind = %K::kind(&()), "member watch interrupted; resuming");
                    continue;
                }
            };
            if tx.send(wrap(sync)).await.is_err() {
                return;
            }
        }
    })
    .abort_handle()
}

/// Applies a watch's news of one kind: `held` lists what the view keeps
/// of the watch's scope, `set` changes one object (`None`: gone).
fn sync_into<R>(
    view: &mut MemberView,
    dirty: &mut Dirty,
    sync: Sync<R>,
    held: impl Fn(&MemberView) -> Vec<Key>,
    set: impl Fn(&mut MemberView, Key, Option<R>, &mut Dirty),
) {
    match sync {
        Sync::Set(key, kept) => set(view, key, kept, dirty),
        Sync::Replace(all) => {
            let listed: BTreeSet<Key> = all.iter().map(|(key, _)| key.clone()).collect();
            for key in held(view) {
                if !listed.contains(&key) {
                    set(view, key, None, dirty);
                }
            }
            for (key, kept) in all {
                set(view, key, Some(kept), dirty);
            }
        }
    }
}

/// When to try something again after `failures` failures in a row.
fn retry_after(failures: u32) -> Duration {
    crate::rt::backoff::doubling(failures, SETTLE * 2, MAX_RETRY)
}

/// Something to do again later, and how often it failed.
#[derive(Default)]
struct Retries(HashMap<String, (Instant, u32)>);

impl Retries {
    fn failed(&mut self, what: &str) {
        let failures = self.0.get(what).map_or(0, |(_, n)| *n) + 1;
        self.0.insert(
            what.to_string(),
            (Instant::now() + retry_after(failures), failures),
        );
    }

    fn waiting(&self, what: &str, now: Instant) -> bool {
        self.0.get(what).is_some_and(|(at, _)| *at > now)
    }

    fn succeeded(&mut self, what: &str) {
        self.0.remove(what);
    }
}

/// Watches `member` (through `watch_client`, whose read timeout suits
/// watches) and keeps the RelayVolumes in `host` up to date, until the
/// process ends.
/// `seen`: the controller's view of the RelayVolumes, so what they already
/// hold is not written again (a new controller would otherwise rewrite
/// every volume's entries).
pub fn spawn(member: String, watch_client: kube::Client, host: Cluster, seen: View) {
    let (tx, rx) = mpsc::channel(1024);
    let relay_only =
        watcher::Config::default().labels(&format!("{}={}", naming::MANAGED_BY, naming::MANAGER));
    forward::<ClaimObject>(
        Api::all(watch_client.clone()),
        relay_only,
        tx.clone(),
        Change::Claims,
    );
    forward::<AttachmentObject>(
        Api::all(watch_client.clone()),
        watcher::Config::default(),
        tx.clone(),
        Change::Attachments,
    );
    forward::<NodeObject>(
        Api::all(watch_client.clone()),
        watcher::Config::default(),
        tx.clone(),
        Change::Nodes,
    );
    let mut observer = Observer::new(member, watch_client, host, tx);
    observer.seen = Some(seen);
    tokio::spawn(observer.run(rx));
}

struct Observer {
    member: String,
    client: kube::Client,
    host: Cluster,
    tx: mpsc::Sender<Change>,
    view: MemberView,
    dirty: Dirty,
    /// The status entries last written per volume id, as their JSON
    /// (`written_form`): one string instead of about ten per volume.
    written: HashMap<String, Box<str>>,
    /// The RelayVolumes as the controller watches them.
    seen: Option<View>,
    /// Whether `seen` has listed: an object it lacks is then new.
    seen_listed: bool,
    /// Pod watches (by scope) that have not listed yet, since when.
    unlisted: HashMap<String, Instant>,
    /// Namespace → the number of its pod watch, and the watch.
    pod_watches: HashMap<String, (u64, AbortHandle)>,
    next_watch: u64,
    /// PVs being read.
    reading: BTreeSet<String>,
    pv_retries: Retries,
    write_retries: Retries,
}

impl Observer {
    fn new(member: String, client: kube::Client, host: Cluster, tx: mpsc::Sender<Change>) -> Self {
        Observer {
            member,
            client,
            host,
            tx,
            view: MemberView::default(),
            dirty: Dirty::new(),
            written: HashMap::new(),
            seen: None,
            seen_listed: false,
            unlisted: HashMap::new(),
            pod_watches: HashMap::new(),
            next_watch: 0,
            reading: BTreeSet::new(),
            pv_retries: Retries::default(),
            write_retries: Retries::default(),
        }
    }

    async fn run(mut self, mut rx: mpsc::Receiver<Change>) {
        // What the objects hold is compared before anything is written.
        if let Some(seen) = &self.seen {
            self.seen_listed = tokio::time::timeout(LIST_GRACE, seen.wait_until_ready())
                .await
                .is_ok_and(|ready| ready.is_ok());
        }
        let mut tick = tokio::time::interval(SETTLE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = rx.recv() => match change {
                    Some(change) => self.apply(change),
                    None => return,
                },
                _ = tick.tick() => {
                    crate::rt::metrics::member_claims(
                        &self.member,
                        self.view.claim_count(),
                        self.view.unresolved().len(),
                    );
                    self.read_pvs();
                    self.write().await;
                }
            }
        }
    }

    fn apply(&mut self, change: Change) {
        let dirty = &mut self.dirty;
        let view = &mut self.view;
        match change {
            Change::Claims(sync) => {
                sync_into(
                    view,
                    dirty,
                    sync,
                    MemberView::claim_keys,
                    |v, key, claim, d| v.set_claim(key, claim, d),
                );
                self.follow_namespaces();
                self.read_pvs();
            }
            Change::Attachments(sync) => sync_into(
                view,
                dirty,
                sync,
                MemberView::attachment_keys,
                |v, (_, name), va, d| v.set_attachment(&name, va, d),
            ),
            Change::Nodes(sync) => sync_into(
                view,
                dirty,
                sync,
                MemberView::node_keys,
                |v, (_, name), in_use, d| v.set_node(&name, in_use, d),
            ),
            Change::Pods {
                namespace,
                watch,
                sync,
            } => {
                // A stopped watch's last news is stale.
                if self.pod_watches.get(&namespace).map(|(n, _)| *n) == Some(watch) {
                    if matches!(sync, Sync::Replace(_)) {
                        self.unlisted.remove(&namespace);
                    }
                    sync_into(
                        view,
                        dirty,
                        sync,
                        |v| v.pod_keys_in(&namespace),
                        |v, key, pod, d| v.set_pod(key, pod, d),
                    );
                }
            }
            Change::Volume { name, read } => {
                self.reading.remove(&name);
                match read {
                    Ok(pv) => {
                        if view.set_pv(&name, pv, dirty) {
                            self.pv_retries.succeeded(&name);
                        } else {
                            self.pv_retries.failed(&name);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(pv = %name, member = %self.member, error = %e, "member PV not read; will retry");
                        self.pv_retries.failed(&name);
                    }
                }
                // The next read starts as one ends, not at the next tick:
                // a new controller reads every bound claim's PV, which at
                // 8 per tick took 10 minutes for 10,000.
                self.read_pvs();
            }
        }
    }

    /// Starts a pod watch in each namespace that now holds relay claims,
    /// and stops those of namespaces that no longer do. Past
    /// [`NAMESPACE_WATCHES`] namespaces one cluster-wide watch replaces
    /// them (each watch is a connection to the member's API server), until
    /// the count falls to half that again.
    fn follow_namespaces(&mut self) {
        let wanted: BTreeSet<String> = self.view.namespaces().cloned().collect();
        let limit = if self.pod_watches.contains_key(ALL_NAMESPACES) {
            NAMESPACE_WATCHES / 2
        } else {
            NAMESPACE_WATCHES
        };
        let cluster_wide = wanted.len() > limit;
        let scopes: BTreeSet<String> = if cluster_wide {
            [ALL_NAMESPACES.to_string()].into()
        } else {
            wanted.clone()
        };
        let stopped: Vec<String> = self
            .pod_watches
            .keys()
            .filter(|scope| !scopes.contains(*scope))
            .cloned()
            .collect();
        for scope in stopped {
            if let Some((_, watch)) = self.pod_watches.remove(&scope) {
                watch.abort();
            }
            self.unlisted.remove(&scope);
            // Pods of namespaces still wanted stay until their new watch
            // lists them again.
            for key in self.view.pod_keys_in(&scope) {
                if !wanted.contains(&key.0) {
                    self.view.set_pod(key, None, &mut self.dirty);
                }
            }
            tracing::debug!(member = %self.member, namespace = %scope, "pod watch stopped");
        }
        for scope in scopes {
            if self.pod_watches.contains_key(&scope) {
                continue;
            }
            self.next_watch += 1;
            let watch = self.next_watch;
            let api = if scope == ALL_NAMESPACES {
                Api::all(self.client.clone())
            } else {
                Api::namespaced(self.client.clone(), &scope)
            };
            let namespace = scope.clone();
            let handle = forward::<PodObject>(
                api,
                watcher::Config::default(),
                self.tx.clone(),
                move |sync| Change::Pods {
                    namespace: namespace.clone(),
                    watch,
                    sync,
                },
            );
            tracing::debug!(member = %self.member, namespace = %scope, "pod watch started");
            self.unlisted.insert(scope.clone(), Instant::now());
            self.pod_watches.insert(scope, (watch, handle));
        }
    }

    /// Reads the PVs that claims are bound to and that are not known yet.
    fn read_pvs(&mut self) {
        let now = Instant::now();
        let wanted: Vec<String> = self
            .view
            .unresolved()
            .filter(|n| !self.reading.contains(*n) && !self.pv_retries.waiting(n, now))
            .take(PARALLEL.saturating_sub(self.reading.len()))
            .cloned()
            .collect();
        for name in wanted {
            self.reading.insert(name.clone());
            let api: Api<VolumeObject> = Api::all(self.client.clone());
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let read = match tokio::time::timeout(CALL_TIMEOUT, api.get_opt(&name)).await {
                    Ok(Ok(pv)) => Ok(pv.map(bound_volume)),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
                };
                let _ = tx.send(Change::Volume { name, read }).await;
            });
        }
    }

    /// Computes the marked volumes and applies the states that changed.
    async fn write(&mut self) {
        if self.dirty.is_empty() {
            return;
        }
        let now = Instant::now();
        if self
            .unlisted
            .values()
            .any(|since| now < *since + LIST_GRACE)
        {
            return;
        }
        let (later, due): (Dirty, Dirty) = std::mem::take(&mut self.dirty)
            .into_iter()
            .partition(|id| self.write_retries.waiting(id, now));
        self.dirty = later;
        let member = self.member.as_str();
        let mut writes = Vec::new();
        for id in due {
            let states = self.view.state_of(&id);
            let claimed = states.is_some();
            let entries: Vec<RelayNodeStatus> = match states {
                Some(states) => states
                    .into_iter()
                    .map(|s| RelayNodeStatus {
                        node: entry_key(member, &s.node),
                        member: Some(member.to_string()),
                        phase: Some(s.phase.as_str().to_string()),
                        pods: Some(s.pods),
                        ..Default::default()
                    })
                    .collect(),
                // Its claim went away: clear what was written, once.
                None if self.written.contains_key(&id) => Vec::new(),
                None => continue,
            };
            let form = written_form(&entries);
            if !self.written.contains_key(&id)
                && claimed
                && self.held(&id) == Some(sorted(&entries))
            {
                self.written.insert(id, form);
                continue;
            }
            if self.written.get(&id) == Some(&form) {
                continue;
            }
            writes.push((id, entries, form, claimed));
        }
        // Member names are at most 40 characters: well within the API's 128.
        let manager = format!("{FIELD_MANAGER}-member-{member}");
        let host = &self.host;
        let results: Vec<(String, Box<str>, bool, bool)> =
            futures::stream::iter(writes.into_iter().map(|(id, entries, form, claimed)| {
                let manager = manager.as_str();
                async move {
                    let landed = report(host, member, manager, &id, &entries).await;
                    (id, form, claimed, landed)
                }
            }))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        for (id, form, claimed, landed) in results {
            if !landed {
                self.write_retries.failed(&id);
                self.dirty.insert(id);
                continue;
            }
            self.write_retries.succeeded(&id);
            if !claimed {
                self.written.remove(&id);
            } else {
                self.written.insert(id, form);
            }
        }
    }
}

impl Observer {
    /// This member's entries that volume `id`'s RelayVolume holds, by node;
    /// `None` when that is not known. An object the listed view lacks has
    /// none: it is new (its first event not in yet), or not there.
    fn held(&self, id: &str) -> Option<Vec<RelayNodeStatus>> {
        let obj = self.seen.as_ref()?.get(&view_key(&object_name(id)));
        if obj.is_none() && !self.seen_listed {
            return None;
        }
        let mine: Vec<RelayNodeStatus> = obj
            .iter()
            .filter_map(|o| o.status.as_ref())
            .filter_map(|s| s.nodes.as_ref())
            .flatten()
            .filter(|e| e.member.as_deref() == Some(self.member.as_str()))
            .cloned()
            .collect();
        Some(sorted(&mine))
    }
}

/// What `written` keeps of entries: their JSON, equal exactly when they
/// are (the states are computed in node order, so equal entries encode
/// alike). Debug's text stands in if encoding ever failed: as exact, only
/// longer.
fn written_form(entries: &[RelayNodeStatus]) -> Box<str> {
    serde_json::to_string(entries)
        .unwrap_or_else(|_| format!("{entries:?}"))
        .into_boxed_str()
}

fn sorted(entries: &[RelayNodeStatus]) -> Vec<RelayNodeStatus> {
    let mut v = entries.to_vec();
    v.sort_by(|a, b| a.node.cmp(&b.node));
    v
}

/// Applies one volume's member entries; whether they landed.
async fn report(
    host: &Cluster,
    member: &str,
    manager: &str,
    id: &str,
    entries: &[RelayNodeStatus],
) -> bool {
    let name = object_name(id);
    let body = controller_status_body(
        &name,
        serde_json::json!({ "nodes": entries }),
        crate::rt::fence::fence().term(),
    );
    // The answer is not read: parsed untyped, an object this build could
    // not read whole still counts as written.
    let api =
        Api::<DynamicObject>::all_with(host.client(), &ApiResource::erase::<RelayVolume>(&()));
    let params = PatchParams::apply(manager).force();
    let result = host
        .fetch(
            &format!("apply RelayVolume {name} member status"),
            api.patch_status(&name, &params, &Patch::Apply(&body)),
        )
        .await;
    match result {
        Ok(Some(_)) => {
            tracing::debug!(volume_id = %id, member, "member-side state reported");
            true
        }
        // No RelayVolume (yet): the controller's first apply comes.
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(volume_id = %id, member, error = %e, "member-side state not reported; will retry");
            false
        }
    }
}

#[cfg(test)]
#[path = "observation_tests.rs"]
mod observation_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_keys_cannot_collide_with_host_nodes() {
        assert_eq!(entry_key("east", "n1"), "east/n1");
        assert!(!naming::is_dns_subdomain(&entry_key("east", "n1")));
    }

    #[test]
    fn retries_back_off_up_to_a_bound() {
        assert_eq!(retry_after(1), SETTLE * 2);
        assert_eq!(retry_after(2), SETTLE * 4);
        assert_eq!(retry_after(40), MAX_RETRY);
        let mut r = Retries::default();
        let now = Instant::now();
        assert!(!r.waiting("v", now));
        r.failed("v");
        assert!(r.waiting("v", now));
        r.succeeded("v");
        assert!(!r.waiting("v", now));
    }
}
