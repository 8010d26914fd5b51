//! CSI Controller service: decodes nothing itself, delegates each RPC to
//! `crate::ops::controller`.

use tonic::{Request, Response, Status};

use crate::csi::{self, controller_server::Controller, controller_service_capability::rpc::Type};
use crate::domain::settings::SpecVersion;
use crate::grpc::observe::rpc;
use crate::grpc::offloaded;
use crate::ops::controller::{capacity, listing, modify, provision, publish, snapshot};
use crate::ops::driver::Driver;

pub struct ControllerService {
    driver: Driver,
}

impl ControllerService {
    pub fn new(driver: Driver) -> Self {
        ControllerService { driver }
    }
}

/// Exactly what this controller implements.
pub const CAPABILITIES: &[Type] = &[
    Type::CreateDeleteVolume,
    Type::PublishUnpublishVolume,
    Type::ListVolumes,
    Type::GetCapacity,
    Type::CreateDeleteSnapshot,
    Type::ListSnapshots,
    Type::CloneVolume,
    Type::PublishReadonly,
    Type::ExpandVolume,
    Type::ListVolumesPublishedNodes,
    Type::VolumeCondition,
    Type::GetVolume,
    Type::SingleNodeMultiWriter,
    Type::ModifyVolume,
    Type::GetSnapshot,
];

/// Capabilities a spec version older than v1.12 does not define.
const SINCE_V1_12: &[Type] = &[Type::GetSnapshot];

type Reply<T> = Result<Response<T>, Status>;

#[async_trait::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        r: Request<csi::CreateVolumeRequest>,
    ) -> Reply<csi::CreateVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let name = req.name.clone();
        offloaded("CreateVolume", &name, &self.driver, |d| async move {
            provision::create_volume(&d, req).await
        })
        .await
    }

    async fn delete_volume(
        &self,
        r: Request<csi::DeleteVolumeRequest>,
    ) -> Reply<csi::DeleteVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        offloaded("DeleteVolume", &id, &self.driver, |d| async move {
            provision::delete_volume(&d, req).await
        })
        .await
    }

    async fn controller_publish_volume(
        &self,
        r: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Reply<csi::ControllerPublishVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        offloaded(
            "ControllerPublishVolume",
            &id,
            &self.driver,
            |d| async move { publish::publish(&d, req).await },
        )
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        r: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Reply<csi::ControllerUnpublishVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        offloaded(
            "ControllerUnpublishVolume",
            &id,
            &self.driver,
            |d| async move { publish::unpublish(&d, req).await },
        )
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        r: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Reply<csi::ValidateVolumeCapabilitiesResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc(
            "ValidateVolumeCapabilities",
            &id,
            listing::validate_capabilities(&self.driver, req),
        )
        .await
    }

    async fn list_volumes(
        &self,
        r: Request<csi::ListVolumesRequest>,
    ) -> Reply<csi::ListVolumesResponse> {
        self.driver.require_leader()?;
        rpc(
            "ListVolumes",
            "",
            listing::list_volumes(&self.driver, r.into_inner()),
        )
        .await
    }

    async fn get_capacity(
        &self,
        r: Request<csi::GetCapacityRequest>,
    ) -> Reply<csi::GetCapacityResponse> {
        self.driver.require_leader()?;
        rpc(
            "GetCapacity",
            "",
            capacity::get_capacity(&self.driver, r.into_inner()),
        )
        .await
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Reply<csi::ControllerGetCapabilitiesResponse> {
        use csi::controller_service_capability::{Rpc, Type as CapType};
        rpc("ControllerGetCapabilities", "", async {
            Ok(csi::ControllerGetCapabilitiesResponse {
                capabilities: CAPABILITIES
                    .iter()
                    .filter(|t| {
                        self.driver.config.csi_spec >= SpecVersion::V1_12
                            || !SINCE_V1_12.contains(t)
                    })
                    .map(|t| csi::ControllerServiceCapability {
                        r#type: Some(CapType::Rpc(Rpc { r#type: *t as i32 })),
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn create_snapshot(
        &self,
        r: Request<csi::CreateSnapshotRequest>,
    ) -> Reply<csi::CreateSnapshotResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let name = req.name.clone();
        offloaded("CreateSnapshot", &name, &self.driver, |d| async move {
            snapshot::create_snapshot(&d, req).await
        })
        .await
    }

    async fn delete_snapshot(
        &self,
        r: Request<csi::DeleteSnapshotRequest>,
    ) -> Reply<csi::DeleteSnapshotResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.snapshot_id.clone();
        offloaded("DeleteSnapshot", &id, &self.driver, |d| async move {
            snapshot::delete_snapshot(&d, req).await
        })
        .await
    }

    async fn get_snapshot(
        &self,
        r: Request<csi::GetSnapshotRequest>,
    ) -> Reply<csi::GetSnapshotResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.snapshot_id.clone();
        rpc(
            "GetSnapshot",
            &id,
            snapshot::get_snapshot(&self.driver, req),
        )
        .await
    }

    async fn list_snapshots(
        &self,
        r: Request<csi::ListSnapshotsRequest>,
    ) -> Reply<csi::ListSnapshotsResponse> {
        self.driver.require_leader()?;
        rpc(
            "ListSnapshots",
            "",
            snapshot::list_snapshots(&self.driver, r.into_inner()),
        )
        .await
    }

    async fn controller_expand_volume(
        &self,
        r: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Reply<csi::ControllerExpandVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        offloaded(
            "ControllerExpandVolume",
            &id,
            &self.driver,
            |d| async move { provision::expand_volume(&d, req).await },
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        r: Request<csi::ControllerGetVolumeRequest>,
    ) -> Reply<csi::ControllerGetVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        rpc(
            "ControllerGetVolume",
            &id,
            listing::get_volume(&self.driver, req),
        )
        .await
    }

    async fn controller_modify_volume(
        &self,
        r: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Reply<csi::ControllerModifyVolumeResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.volume_id.clone();
        offloaded(
            "ControllerModifyVolume",
            &id,
            &self.driver,
            |d| async move { modify::modify_volume(&d, req).await },
        )
        .await
    }
}
