//! CSI Node service: delegates to `crate::node`.

use tonic::{Request, Response, Status};

use crate::csi::{self, node_server::Node, node_service_capability::rpc::Type};
use crate::driver::Driver;
use crate::node::{expand, publish, stage, stats};
use crate::observe::rpc;

pub struct NodeService {
    driver: Driver,
}

impl NodeService {
    pub fn new(driver: Driver) -> Self {
        NodeService { driver }
    }
}

/// Exactly what this node service implements.
pub const CAPABILITIES: &[Type] = &[
    Type::StageUnstageVolume,
    Type::GetVolumeStats,
    Type::ExpandVolume,
    Type::VolumeCondition,
    Type::SingleNodeMultiWriter,
];

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Reply<csi::NodeStageVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc("NodeStageVolume", &id, async {
            self.driver.require_node_ready()?;
            stage::stage(&self.driver, req).await
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Reply<csi::NodeUnstageVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc("NodeUnstageVolume", &id, async {
            self.driver.require_node_ready()?;
            stage::unstage(&self.driver, req).await
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Reply<csi::NodePublishVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc("NodePublishVolume", &id, async {
            self.driver.require_node_ready()?;
            publish::publish(&self.driver, req).await
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Reply<csi::NodeUnpublishVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc("NodeUnpublishVolume", &id, async {
            self.driver.require_node_ready()?;
            publish::unpublish(&self.driver, req).await
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Reply<csi::NodeGetVolumeStatsResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc("NodeGetVolumeStats", &id, async {
            self.driver.require_node_ready()?;
            stats::stats(&self.driver, req).await
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Reply<csi::NodeExpandVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc("NodeExpandVolume", &id, async {
            self.driver.require_node_ready()?;
            expand::expand(&self.driver, req).await
        })
        .await
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Reply<csi::NodeGetCapabilitiesResponse> {
        use csi::node_service_capability::{Rpc, Type as CapType};
        rpc("NodeGetCapabilities", "", async {
            Ok(csi::NodeGetCapabilitiesResponse {
                capabilities: CAPABILITIES
                    .iter()
                    .map(|t| csi::NodeServiceCapability {
                        r#type: Some(CapType::Rpc(Rpc { r#type: *t as i32 })),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Reply<csi::NodeGetInfoResponse> {
        rpc("NodeGetInfo", "", async {
            let config = &self.driver.config;
            Ok(csi::NodeGetInfoResponse {
                node_id: config.node_id.clone(),
                max_volumes_per_node: config.max_volumes_per_node as i64,
                accessible_topology: Some(csi::Topology {
                    segments: config.node_topology().into_iter().collect(),
                }),
            })
        })
        .await
    }
}
