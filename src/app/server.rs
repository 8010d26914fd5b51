//! Start-up and shutdown: open the store, build the backend, reconcile the
//! node, serve gRPC on the endpoint until SIGTERM/SIGINT, clean the socket.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::transport::Server;

use crate::app::cli::{BackendKind, ServeArgs};
use crate::backends::member::backend::MemberBackend;
use crate::backends::{local::LocalBackend, Backend};
use crate::csi::{
    controller_server::ControllerServer, group_controller_server::GroupControllerServer,
    identity_server::IdentityServer, node_server::NodeServer,
};
use crate::domain::settings::DriverConfig;
use crate::grpc::endpoint::Endpoint;
use crate::grpc::{
    controller_service::ControllerService, group_controller_service::GroupControllerService,
    identity_service::IdentityService, node_service::NodeService,
};
use crate::k8s::cluster::Cluster;
use crate::k8s::connect::{connect_host, connect_member};
use crate::k8s::mirror::RelayMirror;
use crate::k8s::relay_volume::{rebuild, RelayVolumeObserver, Role};
use crate::ops::driver::Driver;
use crate::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid setting: {0}")]
    Config(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Driver(#[from] crate::domain::error::CsiError),
    #[error("{0}")]
    Store(#[from] crate::store::StoreError),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Calls of the local backend on blocking threads at once.
const LOCAL_CALLS_IN_FLIGHT: usize = 32;
/// First wait before a failed node reconciliation runs again; doubled per
/// failure up to the ceiling.
const RECONCILE_RETRY_BASE: std::time::Duration = std::time::Duration::from_secs(1);
const RECONCILE_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Earlier builds kept unpublished targets in `spare/` to rename into
/// the next target; a target now serves one publication only. What they
/// left is removed if it is an empty directory, and left alone (with a
/// warning) otherwise.
fn remove_old_spares(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if let Err(e) = std::fs::remove_dir(&path) {
            tracing::warn!(path = %path.display(), error = %e, "a spare target left by an earlier version is not an empty directory; left alone");
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StartError + 'a {
    move |source| StartError::Io {
        what,
        path: path.display().to_string(),
        source,
    }
}

/// The CSI spec's rule for plugin names (what csi-sanity checks too).
fn valid_driver_name(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() >= 2
        && b.len() <= 63
        && b[0].is_ascii_alphabetic()
        && b[b.len() - 1].is_ascii_alphabetic()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(c))
}

/// Controller work that only a leader may do, started once leading.
pub type LeaderWork =
    Box<dyn FnOnce(Driver) -> Pin<Box<dyn Future<Output = Result<(), StartError>> + Send>> + Send>;

/// Builds the driver (store, backend, settings) from the command line, its
/// controller work started at once.
pub async fn build(args: &ServeArgs) -> Result<Driver, StartError> {
    let (driver, work) = build_parts(args).await?;
    if let Some(work) = work {
        work(driver.clone()).await?;
    }
    Ok(driver)
}

/// Like [`build`], also returning the controller work that waits for
/// leadership (rebuild from RelayVolumes, member watches, the summary).
pub async fn build_parts(args: &ServeArgs) -> Result<(Driver, Option<LeaderWork>), StartError> {
    if !valid_driver_name(&args.driver_name) {
        return Err(StartError::Config(format!(
            "--driver-name {:?} must be 2-63 characters of [A-Za-z0-9.-_], starting and ending with a letter",
            args.driver_name
        )));
    }
    if let Some(member) = &args.node_member {
        crate::k8s::naming::check_member_name(member)
            .map_err(|e| StartError::Config(format!("--node-member: {e}")))?;
    }
    if args.node_id.is_empty() || args.node_id.len() > crate::domain::validate::MAX_ID_LEN {
        return Err(StartError::Config("--node-id must be 1-128 bytes".into()));
    }
    std::fs::create_dir_all(&args.state_dir)
        .map_err(io("create state directory", &args.state_dir))?;
    if args.leader_election && args.mode.controller() && args.backend == BackendKind::Member {
        // Replicas take turns: another may have led since this store was
        // written, so what it holds may be stale. Everything acknowledged is
        // in the host's RelayVolumes, which a replica reads when it leads.
        Store::discard(&args.state_dir).map_err(io("discard the store in", &args.state_dir))?;
    }
    let store = Store::open(&args.state_dir)?;
    let (backend, host): (Arc<dyn Backend>, Option<Cluster>) = match args.backend {
        BackendKind::Local => {
            // Default: what is free now plus what is already ours, fixed
            // for this run, so an admission never depends on how much of
            // the volumes' sparse data has been written yet.
            let capacity = match args.capacity {
                Some(c) => c,
                None => crate::backends::local::free_bytes(&args.state_dir)?
                    .saturating_add(store.allocated_bytes()?),
            };
            let local =
                LocalBackend::new(&args.state_dir, &args.node_id, &args.peer_nodes, capacity)?
                    .with_mount_default(args.default_mount_backing);
            (Arc::new(local), None)
        }
        BackendKind::Member => {
            let (member, host) = member_backend(args).await?;
            (Arc::new(member), Some(host))
        }
    };
    let capacity = backend.total_capacity().await?;
    let config = DriverConfig {
        driver_name: args.driver_name.clone(),
        node_id: args.node_id.clone(),
        mode: args.mode,
        max_volumes_per_node: args.max_volumes_per_node,
        capacity,
        max_volume_size: args.max_volume_size.unwrap_or(capacity),
        mutable_parameters: args
            .mutable_parameters
            .iter()
            .filter(|s| !s.is_empty())
            .cloned()
            .collect(),
        state_dir: std::fs::canonicalize(&args.state_dir)
            .map_err(io("resolve state directory", &args.state_dir))?,
        node_member: args.node_member.clone(),
        stale_provisioning_after: std::time::Duration::from_secs(args.stale_provisioning_after),
        csi_spec: args.csi_spec,
    };
    let mut driver = Driver::new(config, store, backend).with_plugins_dir(args.plugins_dir.clone());
    if driver.backend.kind() == "local" {
        // Local calls are bound by the cores and the disk: more in flight
        // only add threads (see `rt::offload::limit_calls`). Member calls mostly
        // wait on remote API servers, and stay unbounded.
        crate::rt::offload::limit_calls(LOCAL_CALLS_IN_FLIGHT);
    }
    let mut work: Option<LeaderWork> = None;
    if let Some(host) = host {
        let role = Role::for_mode(args.mode, &args.node_id);
        let mut mirror: Option<Arc<RelayMirror>> = None;
        let writer = RelayVolumeObserver::new(host.clone(), role);
        if args.mode.controller() {
            let watches =
                crate::k8s::connect::connect_host_for_watches(args.host_kubeconfig.as_deref())
                    .await
                    .map_err(StartError::Config)?;
            let (view, start_summary) = crate::k8s::relay_summary::watch(watches);
            let seen = view.clone();
            let controller_writer = writer.clone().with_view(view);
            let controller_copy = Arc::new(RelayMirror::new(
                controller_writer.clone(),
                crate::grpc::status::code_name,
            ));
            mirror = Some(controller_copy.clone());
            let mut member_watches = Vec::new();
            for m in &args.members {
                let client = crate::k8s::connect::connect_member_for_watches(m)
                    .await
                    .map_err(StartError::Config)?;
                member_watches.push((m.name.clone(), client));
            }
            let mut fences = Vec::new();
            for f in &args.fence_members {
                fences.push(
                    connect_member(f)
                        .await
                        .map_err(StartError::Config)?
                        .unmetered(),
                );
            }
            work = Some(Box::new(move |driver: Driver| {
                Box::pin(async move {
                    // A controller that lost its state directory (an
                    // emptyDir in deploy/) gets its records back before it
                    // answers anything.
                    let rebuilt = rebuild(&host, &driver.store).await?;
                    tracing::info!(
                        restored = rebuilt.restored,
                        lagging = rebuilt.lagging.len(),
                        "volume records rebuilt from RelayVolumes; those that differ from the store are written again by the next call on each"
                    );
                    for id in &rebuilt.lagging {
                        controller_copy.mark(id);
                    }
                    let snapshots = restore_snapshots(&driver).await?;
                    tracing::info!(
                        restored = snapshots,
                        "snapshot and group snapshot records recovered from member VolumeSnapshots and VolumeGroupSnapshots"
                    );
                    start_summary(driver.store.clone(), controller_writer);
                    // After the rebuild: the fence judges pods by the
                    // volumes the store holds.
                    for cluster in fences {
                        crate::backends::member::mobility::lost_member_fence::spawn(
                            cluster,
                            driver.store.clone(),
                        );
                    }
                    // Pods on virtual nodes run in the members: their
                    // state comes from there.
                    for (name, client) in member_watches {
                        crate::k8s::member_problems::spawn(
                            name.clone(),
                            client.clone(),
                            host.clone()
                                .with_timeout(crate::k8s::relay_volume::OBSERVER_TIMEOUT),
                            seen.clone(),
                        );
                        crate::k8s::observation::spawn(
                            name,
                            client,
                            host.clone()
                                .with_timeout(crate::k8s::relay_volume::OBSERVER_TIMEOUT),
                            seen.clone(),
                        );
                    }
                    Ok(())
                })
            }));
        }
        driver = match mirror {
            // The controller's writes wait for their RelayVolume (see
            // `k8s::mirror`); a node plugin's entries follow in the
            // background, since a node's state is rebuilt from its mounts.
            Some(mirror) => driver.with_mirror(mirror),
            None => driver.with_observer(Arc::new(
                crate::rt::observer_queue::ObserverQueue::spawn(Arc::new(writer)),
            )),
        };
    }
    Ok((driver, work))
}

/// The member backend's clusters, from `--member` and `--host-kubeconfig`.
async fn member_backend(args: &ServeArgs) -> Result<(MemberBackend, Cluster), StartError> {
    if let Some(both) = args
        .lost_members
        .iter()
        .find(|lost| args.members.iter().any(|m| &m.name == *lost))
    {
        return Err(StartError::Config(format!(
            "member {both} is given as --member and as --lost-member: a member declared lost is never contacted for its volumes, drop its --member (--fence-member {both}=KUBECONFIG fences it if it comes back)"
        )));
    }
    if let Some(fenced) = args
        .fence_members
        .iter()
        .find(|f| !args.lost_members.contains(&f.name))
    {
        return Err(StartError::Config(format!(
            "--fence-member {} names a member not declared lost: fence only a member given as --lost-member {}",
            fenced.name, fenced.name
        )));
    }
    if args.members.is_empty() && args.lost_members.is_empty() && args.mode.controller() {
        return Err(StartError::Config(
            "--backend member needs at least one --member NAME=KUBECONFIG".into(),
        ));
    }
    let mut clusters = Vec::new();
    for m in &args.members {
        if clusters.iter().any(|c: &Cluster| c.name() == m.name) {
            return Err(StartError::Config(format!(
                "--member {} is given twice",
                m.name
            )));
        }
        clusters.push(connect_member(m).await.map_err(StartError::Config)?);
    }
    let host = connect_host(args.host_kubeconfig.as_deref())
        .await
        .map_err(StartError::Config)?;
    let backend = MemberBackend::new(clusters, Some(host.clone()), &args.driver_name)
        .with_virtual_nodes(args.virtual_node_selector.clone())
        .with_lost_members(args.lost_members.iter().cloned())
        .with_mover_image(args.mover_image.clone())
        .with_mover_path(args.mover_path);
    Ok((backend, host))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
            }
        }
        _ => {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await
        }
    }
}

const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

fn stopping(stop: &tokio::sync::watch::Receiver<bool>) -> impl std::future::Future<Output = ()> {
    let mut stop = stop.clone();
    async move {
        let _ = stop.wait_for(|s| *s).await;
    }
}

/// Graceful shutdown waits for open connections, which a CO may hold
/// forever; after a grace period the process exits regardless.
async fn until_shutdown<E>(
    stop: &tokio::sync::watch::Receiver<bool>,
    serving: impl std::future::Future<Output = Result<(), E>>,
) -> Result<(), E> {
    tokio::select! {
        r = serving => r,
        _ = async { stopping(stop).await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("calls still open after {SHUTDOWN_GRACE:?}; exiting anyway");
            Ok(())
        }
    }
}

/// Restores the snapshot records the store lacks from what the backend's
/// storage describes. Returns how many.
async fn restore_snapshots(driver: &Driver) -> Result<usize, StartError> {
    let mut restored = 0;
    for snap in driver.backend.recover_snapshots().await? {
        let (id, name) = (snap.id.clone(), snap.name.clone());
        let known = driver
            .db(move |s| Ok(s.snapshot(&id)?.is_some() || s.snapshot_by_name(&name)?.is_some()))
            .await?;
        if known {
            continue;
        }
        let record = snap.clone();
        driver.db(move |s| s.put_snapshot(&record)).await?;
        tracing::info!(snapshot_id = %snap.id, name = %snap.name, "snapshot record recovered from the member");
        restored += 1;
    }
    // Groups: their snapshots first, so a group in the store always finds
    // its snapshots; a start cut short in between recovers the group again
    // at the next start.
    for (group, snaps) in driver.backend.recover_groups().await? {
        let (id, name) = (group.id.clone(), group.name.clone());
        let known = driver
            .db(move |s| Ok(s.group(&id)?.is_some() || s.group_by_name(&name)?.is_some()))
            .await?;
        if known {
            continue;
        }
        let record = group.clone();
        driver
            .db(move |s| {
                for snap in &snaps {
                    if s.snapshot(&snap.id)?.is_none() {
                        s.put_snapshot(snap)?;
                    }
                }
                s.put_group(&record)
            })
            .await?;
        tracing::info!(group_snapshot_id = %group.id, name = %group.name, "group snapshot record recovered from the member");
        restored += 1;
    }
    Ok(restored)
}

/// Housekeeping and the virtual-node registrar: controller work of the one
/// controller (the leader, with `--leader-election`).
async fn start_controller_background(
    args: &ServeArgs,
    driver: &Driver,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> Result<(), StartError> {
    if driver.config.mode.controller() {
        crate::ops::housekeeping::spawn(
            driver.clone(),
            std::time::Duration::from_secs(args.housekeeping_interval),
        );
    }
    if driver.config.mode.controller() && args.mover_image.is_some() {
        let host = connect_host(args.host_kubeconfig.as_deref())
            .await
            .map_err(StartError::Config)?;
        crate::ops::pre_copy::spawn(driver.clone(), host);
    }
    if args.virtual_node_registrar {
        let host = connect_host(args.host_kubeconfig.as_deref())
            .await
            .map_err(StartError::Config)?;
        let watches =
            crate::k8s::connect::connect_host_for_watches(args.host_kubeconfig.as_deref())
                .await
                .map_err(StartError::Config)?;
        let mut config = crate::k8s::registrar::RegistrarConfig::new(args.driver_name.clone());
        config.selector = args.virtual_node_selector.clone();
        config.member_label = args.virtual_node_member_label.clone();
        config.attach_managed = args.virtual_node_attach;
        config.member_annotation =
            Some(args.virtual_node_member_annotation.clone()).filter(|key| !key.is_empty());
        // With one member cluster, every virtual node stands for it.
        if let [only] = args.members.as_slice() {
            config.default_member = Some(only.name.clone());
        }
        config
            .validate()
            .map_err(|e| StartError::Config(format!("virtual-node registrar: {e}")))?;
        let until = stopping(stop);
        tokio::spawn(async move {
            if let Err(e) =
                crate::k8s::registrar::run_until(host.client(), watches, config, until).await
            {
                tracing::error!(error = %e, "virtual-node registrar stopped");
            }
        });
    }
    Ok(())
}

/// A bound endpoint, served until the stop signal; a unix socket's file is
/// removed when serving ends.
enum Listener {
    Unix(std::path::PathBuf, tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    async fn bind(endpoint: &Endpoint) -> Result<Self, StartError> {
        match endpoint {
            Endpoint::Unix(path) => {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(io("create socket directory", parent))?;
                }
                // A socket left by a killed predecessor would make bind fail.
                match std::fs::remove_file(path) {
                    Ok(()) => tracing::info!(socket = %path.display(), "removed stale socket"),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io("remove stale socket", path)(e)),
                }
                let listener =
                    tokio::net::UnixListener::bind(path).map_err(io("listen on", path))?;
                Ok(Listener::Unix(path.clone(), listener))
            }
            Endpoint::Tcp(addr) => tokio::net::TcpListener::bind(addr)
                .await
                .map(Listener::Tcp)
                .map_err(|source| StartError::Io {
                    what: "listen on",
                    path: addr.to_string(),
                    source,
                }),
        }
    }

    async fn serve(
        self,
        router: tonic::transport::server::Router,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<(), StartError> {
        match self {
            Listener::Unix(path, listener) => {
                let result = until_shutdown(
                    stop,
                    router.serve_with_incoming_shutdown(
                        UnixListenerStream::new(listener).map(|conn| {
                            conn.map(crate::grpc::authority_filter::AuthorityFilter::new)
                        }),
                        stopping(stop),
                    ),
                )
                .await;
                let _ = std::fs::remove_file(&path);
                Ok(result?)
            }
            Listener::Tcp(listener) => Ok(until_shutdown(
                stop,
                router
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopping(stop)),
            )
            .await?),
        }
    }
}

/// Serves until a shutdown signal arrives.
pub async fn serve(args: ServeArgs) -> Result<(), StartError> {
    let election = args.leader_election && args.mode.controller();
    if election {
        // Before any client exists: nothing is written until this replica
        // leads (see `rt::fence`).
        crate::rt::fence::fence().require_lease();
    }
    let (driver, mut work) = build_parts(&args).await?;
    if election {
        driver
            .leading
            .store(false, std::sync::atomic::Ordering::Release);
    } else {
        if let Some(work) = work.take() {
            work(driver.clone()).await?;
        }
        if driver.config.mode.controller() {
            crate::ops::housekeeping::settle_premade(&driver).await?;
            crate::ops::housekeeping::promote_created(&driver).await?;
        }
    }
    if driver.config.mode.node() {
        // Probe is served at once (not ready); node calls wait for this.
        driver
            .node_ready
            .store(false, std::sync::atomic::Ordering::Release);
        let spares = driver.config.state_dir.join("spare");
        let d = driver.clone();
        tokio::spawn(async move {
            let _ = crate::rt::offload::blocking(move || remove_old_spares(&spares)).await;
            // Mounts and mount-table reads: off the async thread, which
            // answers Probe meanwhile. A failed run (the store refusing,
            // say) is retried: the node serves once reconciled, not before.
            crate::rt::backoff::until_ok(
                "node reconciliation",
                RECONCILE_RETRY_BASE,
                RECONCILE_RETRY_MAX,
                || {
                    let work = d.clone();
                    crate::rt::offload::call("node reconciliation", async move {
                        crate::ops::node::reconcile::reconcile(&work).await
                    })
                },
            )
            .await;
            d.node_ready
                .store(true, std::sync::atomic::Ordering::Release);
        });
    }
    let mut router =
        Server::builder().add_service(IdentityServer::new(IdentityService::new(driver.clone())));
    if driver.config.mode.controller() {
        router = router
            .add_service(ControllerServer::new(ControllerService::new(
                driver.clone(),
            )))
            .add_service(GroupControllerServer::new(GroupControllerService::new(
                driver.clone(),
            )));
    }
    if driver.config.mode.node() {
        router = router.add_service(NodeServer::new(NodeService::new(driver.clone())));
    }
    tracing::info!(
        endpoint = %args.endpoint,
        driver = %driver.config.driver_name,
        node = %driver.config.node_id,
        mode = ?driver.config.mode,
        state_dir = %args.state_dir.display(),
        "csi-relay serving"
    );
    let _metrics = match args.metrics_address {
        Some(addr) => Some(
            crate::app::metrics_http::serve(addr)
                .await
                .map_err(|source| StartError::Io {
                    what: "serve metrics on",
                    path: addr.to_string(),
                    source,
                })?,
        ),
        None => None,
    };
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let lease: Arc<tokio::sync::Mutex<Option<crate::app::leader::LeaseHold>>> = Arc::default();
    if election {
        let client = crate::k8s::connect::connect_host_for_lease(args.host_kubeconfig.as_deref())
            .await
            .map_err(StartError::Config)?;
        let (d, args, stop, lease) = (driver.clone(), args.clone(), stop.clone(), lease.clone());
        tokio::spawn(async move {
            let pod = crate::app::leader::pod_name(&d.config.node_id);
            let led = crate::app::leader::lead(
                client.clone(),
                &d.config.driver_name,
                &pod,
                &args.leader_election_namespace,
                crate::app::leader::Timing::for_lease(args.leader_election_lease_seconds),
            )
            .await;
            let started = async {
                *lease.lock().await = Some(led.map_err(StartError::Config)?);
                if let Some(work) = work {
                    work(d.clone()).await?;
                }
                crate::ops::housekeeping::settle_premade(&d).await?;
                crate::ops::housekeeping::promote_created(&d).await?;
                start_controller_background(&args, &d, &stop).await?;
                crate::app::leader::hand_over_sidecars(
                    client.clone(),
                    &args.leader_election_namespace,
                    &d.config.driver_name,
                    &pod,
                )
                .await;
                d.leading.store(true, std::sync::atomic::Ordering::Release);
                tracing::info!("leading: controller calls are served");
                crate::app::leader::keep_sidecars_here(
                    client,
                    args.leader_election_namespace.clone(),
                    d.config.driver_name.clone(),
                    pod,
                );
                Ok::<(), StartError>(())
            };
            if let Err(e) = started.await {
                tracing::error!(error = %e, "cannot take up the controller's work; exiting");
                crate::rt::fence::fence().step_down();
                std::process::exit(1);
            }
        });
    } else {
        start_controller_background(&args, &driver, &stop).await?;
    }
    let probe = match &args.probe_endpoint {
        Some(endpoint) => {
            let listener = Listener::bind(endpoint).await?;
            let router = Server::builder().add_service(IdentityServer::new(
                IdentityService::for_liveness(driver.clone()),
            ));
            let stop = stop.clone();
            Some(tokio::spawn(
                async move { listener.serve(router, &stop).await },
            ))
        }
        None => None,
    };
    let result = match Listener::bind(&args.endpoint).await {
        Ok(listener) => listener.serve(router, &stop).await,
        Err(e) => Err(e),
    };
    if let Some(probe) = probe {
        match probe.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the probe endpoint failed"),
            Err(e) => tracing::warn!(error = %e, "the probe endpoint's task failed"),
            Ok(Ok(())) => {}
        }
    }
    result?;
    // Everything into redb itself: the next start replays no log.
    if let Err(e) = driver.store.checkpoint() {
        tracing::error!(error = %e, "cannot make the last store changes durable");
    }
    // A successor need not wait for the Lease to expire.
    if let Some(hold) = lease.lock().await.take() {
        hold.release().await;
    }
    tracing::info!("csi-relay stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(extra: &[&str]) -> ServeArgs {
        use clap::Parser;
        let mut argv = vec!["csi-relay", "serve", "--node-id", "n1"];
        argv.extend(extra);
        match crate::app::cli::Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(crate::app::cli::Command::Serve(a)) => a,
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn member_backend_settings_are_checked_at_start() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let state = state.to_str().unwrap();
        let err = build(&serve_args(&["--state-dir", state, "--backend", "member"]))
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("--member"), "{err}");
        let err = build(&serve_args(&[
            "--state-dir",
            state,
            "--backend",
            "member",
            "--member",
            "east=/nonexistent/kubeconfig",
        ]))
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("/nonexistent/kubeconfig"), "{err}");
        let kubeconfig = tmp.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://192.0.2.1:6443'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        let member = format!("east={}", kubeconfig.display());
        let host = kubeconfig.to_str().unwrap();
        let dup = build(&serve_args(&[
            "--state-dir",
            state,
            "--backend",
            "member",
            "--member",
            &member,
            "--member",
            &member,
            "--host-kubeconfig",
            host,
        ]))
        .await
        .err()
        .unwrap();
        assert!(dup.to_string().contains("twice"), "{dup}");
        // A member is either reached or declared lost, never both.
        let both = build(&serve_args(&[
            "--state-dir",
            state,
            "--backend",
            "member",
            "--member",
            &member,
            "--lost-member",
            "east",
            "--host-kubeconfig",
            host,
        ]))
        .await
        .err()
        .unwrap();
        assert!(
            both.to_string().contains("--member and as --lost-member"),
            "{both}"
        );
        // Only a member declared lost is fenced.
        let unfenced = build(&serve_args(&[
            "--state-dir",
            state,
            "--backend",
            "member",
            "--member",
            &member,
            "--fence-member",
            &format!("west={}", kubeconfig.display()),
            "--host-kubeconfig",
            host,
        ]))
        .await
        .err()
        .unwrap();
        assert!(
            unfenced
                .to_string()
                .contains("--fence-member west names a member not declared lost"),
            "{unfenced}"
        );
        let bad = <crate::app::cli::Cli as clap::Parser>::try_parse_from([
            "csi-relay",
            "serve",
            "--node-id",
            "n1",
            "--lost-member",
            "Not_A_Name",
        ]);
        assert!(
            bad.is_err(),
            "a lost member's name is checked like a member's"
        );
        // A node plugin starts without contacting any cluster.
        let d = build(&serve_args(&[
            "--state-dir",
            state,
            "--mode",
            "node",
            "--backend",
            "member",
            "--host-kubeconfig",
            host,
        ]))
        .await
        .unwrap();
        assert_eq!(d.backend.kind(), "member");
        assert_eq!(d.observers.len(), 1);
    }

    #[test]
    fn driver_names_follow_the_spec() {
        assert!(valid_driver_name("relay.csi.dev"));
        assert!(!valid_driver_name("relay.csi.dev1"));
        assert!(!valid_driver_name("-relay"));
        assert!(!valid_driver_name(&"a".repeat(64)));
    }
}
