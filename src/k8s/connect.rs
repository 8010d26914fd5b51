//! `--member NAME=KUBECONFIG` and `--host-kubeconfig`: parsing, and clients
//! with bounded connect/read/write timeouts. Building a client does not
//! contact the cluster, so start-up never waits on an unreachable member.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::k8s::cluster::Cluster;
use crate::k8s::naming;
use crate::k8s::CALL_TIMEOUT;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberArg {
    pub name: String,
    pub kubeconfig: PathBuf,
}

/// clap value parser for `--member NAME=KUBECONFIG`.
pub fn parse_member(value: &str) -> Result<MemberArg, String> {
    let (name, path) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?} is not NAME=KUBECONFIG"))?;
    naming::check_member_name(name)?;
    if path.is_empty() {
        return Err(format!("member {name:?} has an empty kubeconfig path"));
    }
    Ok(MemberArg {
        name: name.to_string(),
        kubeconfig: PathBuf::from(path),
    })
}

fn bounded(mut config: kube::Config) -> kube::Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = Some(CALL_TIMEOUT);
    config.write_timeout = Some(CALL_TIMEOUT);
    // Count the read timeout from the request, not from when a pooled
    // connection went idle.
    config.reset_reader_on_write = true;
    // The API servers' audit logs and request metrics name their callers by
    // it: an operator can tell the relay's requests from the sidecars'
    // (kube sends none of its own), and one replica's from another's.
    config
        .headers
        .push((http::header::USER_AGENT, user_agent()));
    config
}

/// The pod this process runs in: `POD_NAME`, else `HOSTNAME` (a pod's
/// hostname is its name, and the identity the sidecars elect with).
pub fn pod_name() -> Option<String> {
    ["POD_NAME", "HOSTNAME"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.is_empty()))
}

/// Who this process is, in the leader Lease and its user agent: its pod
/// and a tag drawn at start. Not the pid: in a container it is 1 after
/// every restart, and two lives of one pod must not pass for one holder.
pub fn process_identity() -> &'static str {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let pod = pod_name().unwrap_or_else(|| format!("pid{}", std::process::id()));
        let tag = uuid::Uuid::new_v4().simple().to_string();
        format!("{pod}_{}", &tag[..8])
    })
}

/// `csi-relay/VERSION (IDENTITY)`: an audit log tells replicas, and two
/// lives of one replica, apart.
fn user_agent() -> http::HeaderValue {
    let me = format!("{USER_AGENT} ({})", process_identity());
    http::HeaderValue::from_str(&me).unwrap_or(http::HeaderValue::from_static(USER_AGENT))
}

/// What every request of the relay says it comes from.
pub const USER_AGENT: &str = concat!("csi-relay/", env!("CARGO_PKG_VERSION"));

async fn from_kubeconfig(path: &Path) -> Result<kube::Config, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    let options = kube::config::KubeConfigOptions::default();
    match tokio::time::timeout(
        CALL_TIMEOUT,
        kube::Config::from_custom_kubeconfig(kubeconfig, &options),
    )
    .await
    {
        Err(_) => Err(format!(
            "kubeconfig {}: loading it took longer than {CALL_TIMEOUT:?}",
            path.display()
        )),
        Ok(r) => r.map_err(|e| format!("kubeconfig {}: {e}", path.display())),
    }
}

/// How long a watch may stay silent: longer than the server-side timeout
/// kube's watchers ask for (290 s), so an idle watch ends cleanly on the
/// server's side and is resumed, instead of being cut as a failed call.
pub const WATCH_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(330);

/// A host-cluster client for long-lived watches (the virtual-node
/// registrar's): connect and write bounded, reads bounded by
/// [`WATCH_READ_TIMEOUT`] instead of the 10 s of a call.
pub async fn connect_host_for_watches(path: Option<&Path>) -> Result<kube::Client, String> {
    let config = match path {
        Some(p) => from_kubeconfig(p).await?,
        None => kube::Config::incluster().map_err(|e| {
            format!("no --host-kubeconfig given and no in-cluster configuration: {e}")
        })?,
    };
    let mut config = bounded(config);
    config.read_timeout = Some(WATCH_READ_TIMEOUT);
    fenced(config, "host cluster (watches)")
}

fn client(config: kube::Config, what: &str) -> Result<kube::Client, String> {
    fenced(bounded(config), what)
}

/// Every client of the process writes only through the write fence (see
/// `rt::fence`): with `--leader-election`, only while its Lease is fresh.
fn fenced(config: kube::Config, what: &str) -> Result<kube::Client, String> {
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|e| format!("{what}: {e}"))?;
    Ok(builder
        .with_layer(&crate::rt::fence::FenceLayer::new(crate::rt::fence::fence()))
        .build())
}

/// A host client outside the fence, for the leader Lease itself: renewing
/// it is what opens the fence.
pub async fn connect_host_for_lease(path: Option<&Path>) -> Result<kube::Client, String> {
    let config = match path {
        Some(p) => from_kubeconfig(p).await?,
        None => kube::Config::incluster().map_err(|e| {
            format!("no --host-kubeconfig given and no in-cluster configuration: {e}")
        })?,
    };
    kube::Client::try_from(bounded(config)).map_err(|e| format!("host cluster (Lease): {e}"))
}

/// A client for member cluster `arg.name`.
/// A member-cluster client for the watches of member-side observation.
pub async fn connect_member_for_watches(arg: &MemberArg) -> Result<kube::Client, String> {
    let config = from_kubeconfig(&arg.kubeconfig)
        .await
        .map_err(|e| format!("member {}: {e}", arg.name))?;
    let mut config = bounded(config);
    config.read_timeout = Some(WATCH_READ_TIMEOUT);
    fenced(config, &format!("member {} (watches)", arg.name))
}

pub async fn connect_member(arg: &MemberArg) -> Result<Cluster, String> {
    let config = from_kubeconfig(&arg.kubeconfig)
        .await
        .map_err(|e| format!("member {}: {e}", arg.name))?;
    let mut long = bounded(config.clone());
    long.read_timeout = Some(WATCH_READ_TIMEOUT);
    let streams = fenced(long, &format!("member {} (streams)", arg.name))?;
    let client = client(config, &format!("member {}", arg.name))?;
    Ok(Cluster::member(&arg.name, client).with_streams(streams))
}

/// A client for the host cluster: `path`, or the in-cluster service account.
pub async fn connect_host(path: Option<&Path>) -> Result<Cluster, String> {
    let config = match path {
        Some(p) => from_kubeconfig(p).await?,
        None => kube::Config::incluster().map_err(|e| {
            format!("no --host-kubeconfig given and no in-cluster configuration: {e}")
        })?,
    };
    Ok(Cluster::host(client(config, "host cluster")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_names_the_relay_as_its_user_agent() {
        let config = bounded(kube::Config::new("https://127.0.0.1:1".parse().unwrap()));
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(name, _)| name == http::header::USER_AGENT)
            .map(|(_, value)| value.to_str().unwrap_or_default().to_string())
            .collect();
        assert_eq!(agents.len(), 1);
        let prefix = format!("csi-relay/{} (", env!("CARGO_PKG_VERSION"));
        assert!(agents[0].starts_with(&prefix), "{agents:?}");
        assert!(
            agents[0].ends_with(&format!("{})", process_identity())),
            "{agents:?}"
        );
    }

    #[test]
    fn member_flags_parse_and_validate() {
        let m = parse_member("east=/etc/kube/east").unwrap();
        assert_eq!(m.name, "east");
        assert_eq!(m.kubeconfig, PathBuf::from("/etc/kube/east"));
        // The path may contain '='; the first one separates.
        assert_eq!(
            parse_member("a=/x=y").unwrap().kubeconfig,
            PathBuf::from("/x=y")
        );
        for bad in [
            "east",
            "=/x",
            "East=/x",
            "e_st=/x",
            "-east=/x",
            "east=",
            &format!("{}=/x", "a".repeat(41)),
        ] {
            assert!(parse_member(bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn kubeconfig_problems_name_the_member_and_file() {
        let err = connect_member(&MemberArg {
            name: "east".into(),
            kubeconfig: "/nonexistent/kubeconfig".into(),
        })
        .await
        .unwrap_err();
        assert!(err.contains("member east"), "{err}");
        assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    }

    #[tokio::test]
    async fn clients_get_bounded_timeouts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://192.0.2.1:6443'}\nusers:\n- name: u\n  user: {token: abc}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
        )
        .unwrap();
        let config = from_kubeconfig(&path).await.unwrap();
        let config = bounded(config);
        assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT));
        assert_eq!(config.read_timeout, Some(CALL_TIMEOUT));
        assert_eq!(config.write_timeout, Some(CALL_TIMEOUT));
        let cluster = connect_member(&MemberArg {
            name: "east".into(),
            kubeconfig: path,
        })
        .await
        .unwrap();
        assert_eq!(cluster.label(), "member cluster east");
    }
}
