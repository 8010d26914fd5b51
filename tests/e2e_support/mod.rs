//! What the end-to-end tests against real control planes share: the
//! RELAY_E2E_* environment, clients, waiting, the RelayVolume CRD.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use csi_relay::member::relay_volume::RelayVolume;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};

pub struct Env {
    pub host_kubeconfig: String,
    pub member_kubeconfig: String,
    pub storage_class: String,
    pub namespace: String,
    /// The member CSI driver's name and its node plugin socket on this
    /// machine, when its volumes are staged through it.
    pub member_plugin: Option<(String, String)>,
}

pub fn env() -> Option<Env> {
    Some(Env {
        host_kubeconfig: std::env::var("RELAY_E2E_HOST_KUBECONFIG").ok()?,
        member_kubeconfig: std::env::var("RELAY_E2E_MEMBER_KUBECONFIG").ok()?,
        storage_class: std::env::var("RELAY_E2E_MEMBER_STORAGE_CLASS").ok()?,
        namespace: std::env::var("RELAY_E2E_MEMBER_NAMESPACE").unwrap_or_else(|_| "default".into()),
        member_plugin: std::env::var("RELAY_E2E_MEMBER_CSI_DRIVER")
            .ok()
            .zip(std::env::var("RELAY_E2E_MEMBER_PLUGIN_SOCK").ok()),
    })
}

pub async fn client(path: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn install_crd(host: &Client) {
    Api::<CustomResourceDefinition>::all(host.clone())
        .patch(
            "relayvolumes.relay.csi.dev",
            &PatchParams::apply("csi-relay-e2e").force(),
            &Patch::Apply(RelayVolume::crd()),
        )
        .await
        .expect("install RelayVolume CRD");
}

/// The RelayVolume's PHASE column.
pub fn phase(rv: &RelayVolume) -> Option<String> {
    rv.status.as_ref().and_then(|s| s.phase.clone())
}

/// Waits until the RelayVolume `name` shows `want` as its phase.
pub async fn wait_phase(host: &Client, name: &str, want: &str) {
    let relay: Api<RelayVolume> = Api::all(host.clone());
    eventually(
        &format!("RelayVolume {name} phase {want}"),
        Duration::from_secs(30),
        || {
            let (relay, name) = (relay.clone(), name.to_string());
            async move {
                let rv = relay.get_opt(&name).await.ok()??;
                (phase(&rv).as_deref() == Some(want)).then_some(())
            }
        },
    )
    .await
}
