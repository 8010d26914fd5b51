//! CSI Node service: delegates to `crate::ops::node`.

use tonic::{Request, Response, Status};

use crate::csi::{self, node_server::Node, node_service_capability::rpc::Type};
use crate::grpc::observe::rpc;
use crate::ops::driver::Driver;
use crate::ops::node::{expand, publish, stage, stats};
use crate::rt::bounded::{off_workers, NODE_CALL_LIMIT};

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

#[async_trait::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Reply<csi::NodeStageVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        let d = self.driver.clone();
        rpc("NodeStageVolume", &id, async {
            d.require_node_ready()?;
            off_workers("NodeStageVolume", NODE_CALL_LIMIT, async move {
                stage::stage(&d, req).await
            })
            .await
        })
        .await
    }

    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Reply<csi::NodeUnstageVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        let d = self.driver.clone();
        rpc("NodeUnstageVolume", &id, async {
            d.require_node_ready()?;
            off_workers("NodeUnstageVolume", NODE_CALL_LIMIT, async move {
                stage::unstage(&d, req).await
            })
            .await
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Reply<csi::NodePublishVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        let d = self.driver.clone();
        rpc("NodePublishVolume", &id, async {
            d.require_node_ready()?;
            off_workers("NodePublishVolume", NODE_CALL_LIMIT, async move {
                publish::publish(&d, req).await
            })
            .await
        })
        .await
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Reply<csi::NodeUnpublishVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        let d = self.driver.clone();
        rpc("NodeUnpublishVolume", &id, async {
            d.require_node_ready()?;
            off_workers("NodeUnpublishVolume", NODE_CALL_LIMIT, async move {
                publish::unpublish(&d, req).await
            })
            .await
        })
        .await
    }

    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Reply<csi::NodeGetVolumeStatsResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        let d = self.driver.clone();
        rpc("NodeGetVolumeStats", &id, async {
            d.require_node_ready()?;
            off_workers("NodeGetVolumeStats", NODE_CALL_LIMIT, async move {
                stats::stats(&d, req).await
            })
            .await
        })
        .await
    }

    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Reply<csi::NodeExpandVolumeResponse> {
        let req = r.into_inner();
        let id = req.volume_id.clone();
        let d = self.driver.clone();
        rpc("NodeExpandVolume", &id, async {
            d.require_node_ready()?;
            off_workers("NodeExpandVolume", NODE_CALL_LIMIT, async move {
                expand::expand(&d, req).await
            })
            .await
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
