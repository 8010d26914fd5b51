//! Member namespaces: created on demand when the StorageClass asks for it
//! (`createMemberNamespace`), never deleted (other workloads may live there).

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};

use crate::domain::error::CsiResult;
use crate::k8s::cluster::Cluster;
use crate::k8s::naming;

/// Creates `name` in the member unless it exists.
pub async fn ensure(cluster: &Cluster, name: &str) -> CsiResult<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some([(naming::MANAGED_BY.to_string(), naming::MANAGER.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let api = Api::<Namespace>::all(cluster.client());
    if cluster
        .create(
            &format!("create Namespace {name}"),
            api.create(&PostParams::default(), &ns),
        )
        .await?
        .is_some()
    {
        tracing::info!(member = %cluster.name(), namespace = name, "member namespace created");
    }
    Ok(())
}
