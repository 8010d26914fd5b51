//! CSI GroupController service (volume group snapshots).

use tonic::{Request, Response, Status};

use crate::csi::{
    self, group_controller_server::GroupController, group_controller_service_capability::rpc::Type,
};
use crate::grpc::observe::rpc;
use crate::grpc::offloaded;
use crate::ops::controller::group_snapshot;
use crate::ops::driver::Driver;

pub struct GroupControllerService {
    driver: Driver,
}

impl GroupControllerService {
    pub fn new(driver: Driver) -> Self {
        GroupControllerService { driver }
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[async_trait::async_trait]
impl GroupController for GroupControllerService {
    async fn group_controller_get_capabilities(
        &self,
        _: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Reply<csi::GroupControllerGetCapabilitiesResponse> {
        use csi::group_controller_service_capability::{Rpc, Type as CapType};
        rpc("GroupControllerGetCapabilities", "", async {
            Ok(csi::GroupControllerGetCapabilitiesResponse {
                capabilities: vec![csi::GroupControllerServiceCapability {
                    r#type: Some(CapType::Rpc(Rpc {
                        r#type: Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                    })),
                }],
            })
        })
        .await
    }

    async fn create_volume_group_snapshot(
        &self,
        r: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Reply<csi::CreateVolumeGroupSnapshotResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let name = req.name.clone();
        offloaded(
            "CreateVolumeGroupSnapshot",
            &name,
            &self.driver,
            |d| async move { group_snapshot::create(&d, req).await },
        )
        .await
    }

    async fn delete_volume_group_snapshot(
        &self,
        r: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Reply<csi::DeleteVolumeGroupSnapshotResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.group_snapshot_id.clone();
        offloaded(
            "DeleteVolumeGroupSnapshot",
            &id,
            &self.driver,
            |d| async move { group_snapshot::delete(&d, req).await },
        )
        .await
    }

    async fn get_volume_group_snapshot(
        &self,
        r: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Reply<csi::GetVolumeGroupSnapshotResponse> {
        self.driver.require_leader()?;
        let req = r.into_inner();
        let id = req.group_snapshot_id.clone();
        rpc(
            "GetVolumeGroupSnapshot",
            &id,
            group_snapshot::get(&self.driver, req),
        )
        .await
    }
}
