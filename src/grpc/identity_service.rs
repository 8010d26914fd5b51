//! CSI Identity service.

use tonic::{Request, Response, Status};

use crate::csi::{self, identity_server::Identity, plugin_capability};
use crate::domain::error::CsiError;
use crate::grpc::observe::rpc;
use crate::ops::driver::Driver;

pub struct IdentityService {
    driver: Driver,
    liveness: bool,
}

impl IdentityService {
    pub fn new(driver: Driver) -> Self {
        IdentityService {
            driver,
            liveness: false,
        }
    }

    /// The Identity service of `--probe-endpoint`: its Probe says whether
    /// the process is healthy, leading or not, for the liveness probe.
    pub fn for_liveness(driver: Driver) -> Self {
        IdentityService {
            driver,
            liveness: true,
        }
    }
}

fn service(t: plugin_capability::service::Type) -> csi::PluginCapability {
    csi::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

#[async_trait::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        rpc("GetPluginInfo", "", async {
            Ok(csi::GetPluginInfoResponse {
                name: self.driver.config.driver_name.clone(),
                vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                manifest: [(
                    "backend".to_string(),
                    self.driver.backend.kind().to_string(),
                )]
                .into(),
            })
        })
        .await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        use plugin_capability::service::Type;
        rpc("GetPluginCapabilities", "", async {
            let mut capabilities = vec![service(Type::VolumeAccessibilityConstraints)];
            if self.driver.config.mode.controller() {
                capabilities.push(service(Type::ControllerService));
                capabilities.push(service(Type::GroupControllerService));
            }
            capabilities.push(csi::PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: plugin_capability::volume_expansion::Type::Online as i32,
                    },
                )),
            });
            Ok(csi::GetPluginCapabilitiesResponse { capabilities })
        })
        .await
    }

    async fn probe(
        &self,
        _: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        rpc("Probe", "", async {
            let store = self.driver.store.clone();
            self.driver
                .db(move |_| store.healthy())
                .await
                .map_err(|e| CsiError::FailedPrecondition(format!("not ready: {e}")))?;
            self.driver.backend.healthy().await.map_err(|e| {
                CsiError::FailedPrecondition(format!(
                    "not ready: backend {}: {e}",
                    self.driver.backend.kind()
                ))
            })?;
            // Serving, but not ready until the node's reconciliation is done.
            // A controller replica that stands by is not ready either: the
            // stock sidecars wait in their Probe loop before they elect
            // themselves, so only the leader's sidecars lead (see
            // docs/operations.md, "Two controller replicas").
            let ready = self.driver.require_node_ready().is_ok()
                && (self.liveness
                    || self
                        .driver
                        .leading
                        .load(std::sync::atomic::Ordering::Acquire));
            Ok(csi::ProbeResponse { ready: Some(ready) })
        })
        .await
    }
}
