//! A move's member objects: the key's Secret and the mover pod, one of
//! each in both members, named from the volume (a retry or a restarted
//! controller finds them) and carrying the relay's labels (its admission
//! policy lets it make nothing else).
//!
//! The pod runs the relay's own image as `csi-relay mover`. It mounts the
//! volume's data claim, read-only on the source, and the Secret; it gets no
//! service account token, listens on its loopback only, and keeps just the
//! capabilities that copying owners, modes, devices and file capabilities
//! needs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Secret,
    SecretVolumeSource, SecurityContext, Volume as PodVolume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

use super::channel::KEY_LEN;
use super::mover::{Role, PORT};
use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming;

/// The label telling a mover's objects (with the relay's own labels).
pub const MOVER_LABEL: &str = "relay.csi.dev/mover";
const KEY_FILE: &str = "key";
const KEY_DIR: &str = "/run/relay-mover";
const DATA_DIR: &str = "/data";
const DEVICE: &str = "/dev/relay-volume";

pub fn secret_name(uuid: &str) -> String {
    format!("relay-{uuid}-mover")
}

pub fn pod_name(uuid: &str, role: Role) -> String {
    format!("relay-{uuid}-mover-{}", role.as_str())
}

fn labels(uuid: &str, role: Option<Role>) -> BTreeMap<String, String> {
    let mut l = naming::labels(uuid);
    l.insert(
        MOVER_LABEL.into(),
        role.map_or("key", Role::as_str).to_string(),
    );
    l
}

/// What a mover pod needs to be made.
#[derive(Clone)]
pub struct PodPlan<'a> {
    pub uuid: &'a str,
    pub move_id: &'a str,
    pub namespace: &'a str,
    pub claim: &'a str,
    pub role: Role,
    pub image: &'a str,
    pub block: bool,
    /// Where it must run: next to the pod using the volume there, for a
    /// claim one node at a time may mount.
    pub node: Option<String>,
    /// Listens on the pod network too (a source the target mover may
    /// reach there), not only on its loopback.
    pub pod_network: bool,
}

pub fn pod_manifest(p: &PodPlan<'_>) -> Pod {
    let source = p.role == Role::Source;
    let mut args = vec![
        "mover".to_string(),
        format!("--role={}", p.role.as_str()),
        format!("--move-id={}", p.move_id),
        format!("--key-file={KEY_DIR}/{KEY_FILE}"),
        format!("--port={PORT}"),
    ];
    if p.pod_network {
        args.push("--listen=0.0.0.0".into());
    }
    let (mounts, devices) = if p.block {
        args.push(format!("--path={DEVICE}"));
        args.push("--block".into());
        (
            vec![],
            Some(vec![VolumeDevice {
                name: "data".into(),
                device_path: DEVICE.into(),
            }]),
        )
    } else {
        args.push(format!("--path={DATA_DIR}"));
        (
            vec![VolumeMount {
                name: "data".into(),
                mount_path: DATA_DIR.into(),
                read_only: Some(source),
                ..Default::default()
            }],
            None,
        )
    };
    let mut mounts = mounts;
    mounts.push(VolumeMount {
        name: "key".into(),
        mount_path: KEY_DIR.into(),
        read_only: Some(true),
        ..Default::default()
    });
    // Reading every file (source) or setting owners, modes, set-id bits,
    // devices and file capabilities (target) as the source had them. All
    // are in Pod Security's baseline list, and the member's admission
    // policy holds the relay's pods to that list (deploy/member/mobility/).
    let caps: &[&str] = if source {
        &["DAC_OVERRIDE"]
    } else {
        &[
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "FSETID",
            "MKNOD",
            "SETFCAP",
        ]
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(p.uuid, p.role)),
            namespace: Some(p.namespace.to_string()),
            labels: Some(labels(p.uuid, Some(p.role))),
            ..Default::default()
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Always".into()),
            termination_grace_period_seconds: Some(0),
            node_name: p.node.clone(),
            containers: vec![Container {
                name: "mover".into(),
                image: Some(p.image.to_string()),
                image_pull_policy: Some("IfNotPresent".into()),
                command: Some(vec!["csi-relay".into()]),
                args: Some(args),
                volume_mounts: Some(mounts),
                volume_devices: devices,
                security_context: Some(SecurityContext {
                    run_as_user: Some(0),
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    privileged: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        add: Some(caps.iter().map(|c| c.to_string()).collect()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            volumes: Some(vec![
                PodVolume {
                    name: "data".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: p.claim.to_string(),
                        read_only: Some(source),
                    }),
                    ..Default::default()
                },
                PodVolume {
                    name: "key".into(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret_name(p.uuid)),
                        default_mode: Some(0o400),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        status: None,
    }
}

pub fn secret_manifest(uuid: &str, namespace: &str, key: &[u8; KEY_LEN]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(uuid)),
            namespace: Some(namespace.to_string()),
            labels: Some(labels(uuid, None)),
            ..Default::default()
        },
        string_data: Some([(KEY_FILE.to_string(), hex::encode(key))].into()),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

pub async fn create_secret(
    c: &Cluster,
    uuid: &str,
    namespace: &str,
    key: &[u8; KEY_LEN],
) -> CsiResult<()> {
    let api = Api::<Secret>::namespaced(c.client(), namespace);
    let name = secret_name(uuid);
    c.create(
        &format!("create Secret {namespace}/{name}"),
        api.create(
            &PostParams::default(),
            &secret_manifest(uuid, namespace, key),
        ),
    )
    .await?;
    Ok(())
}

pub async fn create_pod(c: &Cluster, plan: &PodPlan<'_>) -> CsiResult<()> {
    let api = Api::<Pod>::namespaced(c.client(), plan.namespace);
    let pod = pod_manifest(plan);
    let name = pod_name(plan.uuid, plan.role);
    c.create(
        &format!("create Pod {}/{name}", plan.namespace),
        api.create(&PostParams::default(), &pod),
    )
    .await?;
    Ok(())
}

pub async fn get_pod(c: &Cluster, namespace: &str, name: &str) -> CsiResult<Option<Pod>> {
    let api = Api::<Pod>::namespaced(c.client(), namespace);
    Ok(
        c.fetch(&format!("get Pod {namespace}/{name}"), api.get(name))
            .await?,
    )
}

/// Whether the pod is ours, Running, with its container ready to serve;
/// Err with what it waits for otherwise (its events say why).
pub fn running(pod: &Pod, uuid: &str) -> Result<(), String> {
    let ours = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(naming::VOLUME_UUID_LABEL))
        .is_some_and(|u| u == uuid);
    if !ours {
        return Err("a pod of that name is not this volume's mover".into());
    }
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let started = status
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        });
    if phase == "Running" && started {
        return Ok(());
    }
    let waiting = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
        .map(|w| {
            format!(
                " ({}: {})",
                w.reason.clone().unwrap_or_default(),
                w.message.clone().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    Err(format!("is {phase}{waiting}"))
}

/// Removes a move's pods and Secret from `c`; gone already is fine. Waits
/// (bounded) until the pods are gone, so a new key meets new pods.
pub async fn remove_all(c: &Cluster, uuid: &str, namespace: &str) -> CsiResult<()> {
    let pods = Api::<Pod>::namespaced(c.client(), namespace);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for role in [Role::Source, Role::Target] {
        let name = pod_name(uuid, role);
        if let Some(pod) = get_pod(c, namespace, &name).await? {
            if running(&pod, uuid).is_err_and(|w| w.contains("not this volume's")) {
                continue;
            }
            c.remove(
                &format!("delete Pod {namespace}/{name}"),
                pods.delete(&name, &now),
            )
            .await?;
        }
    }
    let secrets = Api::<Secret>::namespaced(c.client(), namespace);
    let name = secret_name(uuid);
    c.remove(
        &format!("delete Secret {namespace}/{name}"),
        secrets.delete(&name, &DeleteParams::default()),
    )
    .await?;
    for _ in 0..60 {
        let mut left = false;
        for role in [Role::Source, Role::Target] {
            left |= get_pod(c, namespace, &pod_name(uuid, role))
                .await?
                .is_some_and(|p| {
                    running(&p, uuid).is_ok() || p.metadata.deletion_timestamp.is_some()
                });
        }
        if !left {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(CsiError::Unavailable(format!(
        "{}: the movers of volume {uuid} in namespace {namespace} are still going after 30 s",
        c.label()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_mover_reads_only_and_holds_little() {
        let plan = PodPlan {
            uuid: "0a1b",
            move_id: "0a1b-east",
            namespace: "apps",
            claim: "relay-0a1b",
            role: Role::Source,
            image: "csi-relay:0.1.0",
            block: false,
            node: None,
            pod_network: false,
        };
        let pod = pod_manifest(&plan);
        let listens_on = |pod: &Pod| {
            pod.spec.as_ref().expect("spec").containers[0]
                .args
                .iter()
                .flatten()
                .find(|a| a.starts_with("--listen="))
                .cloned()
        };
        // Its loopback only, unless the pod network may reach it.
        assert_eq!(listens_on(&pod), None);
        assert_eq!(
            listens_on(&pod_manifest(&PodPlan {
                pod_network: true,
                ..plan.clone()
            })),
            Some("--listen=0.0.0.0".to_string())
        );
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = &spec.containers[0];
        assert!(c
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.read_only == Some(true)));
        let sc = c.security_context.as_ref().expect("sc");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        let caps = sc.capabilities.as_ref().expect("caps");
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(!caps
            .add
            .iter()
            .flatten()
            .any(|c| c == "SYS_ADMIN" || c == "CHOWN"));
        assert_eq!(
            spec.volumes
                .iter()
                .flatten()
                .find_map(|v| v.persistent_volume_claim.as_ref())
                .map(|c| (c.claim_name.as_str(), c.read_only)),
            Some(("relay-0a1b", Some(true)))
        );
        let target = pod_manifest(&PodPlan {
            role: Role::Target,
            block: true,
            ..plan
        });
        let c = &target.spec.as_ref().expect("spec").containers[0];
        assert!(c.args.iter().flatten().any(|a| a == "--block"));
        assert_eq!(
            c.volume_devices.as_ref().map(|d| d[0].device_path.as_str()),
            Some(DEVICE)
        );
        assert_eq!(pod_name("0a1b", Role::Target), "relay-0a1b-mover-target");
        assert!(pod_name(&"f".repeat(32), Role::Source).len() <= 63);
    }
}
