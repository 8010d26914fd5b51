//! Classes whose volumes move between members that share no storage
//! (`movableBetween`): every member listed is configured and has the class
//! the list names for it, the relay's identity there holds the movers'
//! rights (`deploy/member/mobility`), and the controller runs with a
//! `--mover-image`. Each is what a move needs before its first byte: a
//! member without the class refuses the target claim, one without the
//! rights refuses the movers, and a controller without the image refuses
//! the move outright. All are found here rather than when a pod waits.

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;

use super::report::{Clusters, Finding};
use crate::domain::sharing::Sharing;
use crate::k8s::cluster::Cluster;

/// The rights a move uses in every member (what `deploy/member/mobility`
/// grants): (resource, subresource, verb).
const MOVER_RIGHTS: &[(&str, Option<&str>, &str)] = &[
    ("pods", None, "create"),
    ("pods", None, "get"),
    ("pods", None, "delete"),
    ("pods", Some("portforward"), "create"),
    ("secrets", None, "create"),
    ("secrets", None, "delete"),
];

/// What the controller pods run with: the image of `--mover-image` (or
/// `CSI_RELAY_MOVER_IMAGE`), read from their csi-relay container; `None`
/// when no pod sets it; an error when the pods cannot be read.
pub async fn mover_image(
    c: &Clusters,
    namespace: &str,
    selector: &str,
) -> Result<Option<String>, String> {
    let pods = super::replicas::controller_pods(c, namespace, selector).await?;
    Ok(image_of(&pods))
}

fn image_of(pods: &[Pod]) -> Option<String> {
    pods.iter()
        .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
        .filter(|c| c.name == "csi-relay")
        .find_map(container_image)
}

fn container_image(c: &Container) -> Option<String> {
    let args: Vec<&str> = c
        .command
        .iter()
        .chain(c.args.iter())
        .flatten()
        .map(String::as_str)
        .collect();
    let from_args = args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--mover-image=")
            .map(str::to_string)
            .or_else(|| (*a == "--mover-image").then(|| args.get(i + 1).map(|v| v.to_string()))?)
    });
    let from_env = || {
        c.env
            .iter()
            .flatten()
            .find(|e| e.name == "CSI_RELAY_MOVER_IMAGE")
            .and_then(|e| e.value.clone())
    };
    from_args.or_else(from_env).filter(|i| !i.is_empty())
}

/// The finding of a movable class: the first thing a move of its volumes
/// would lack, or what it moves between.
pub async fn check(
    clusters: &Clusters,
    subject: &str,
    sharing: &Sharing,
    mover: &Result<Option<String>, String>,
) -> Finding {
    let members: Vec<&str> = sharing.members().collect();
    let image = match mover {
        Ok(Some(image)) => image.clone(),
        Ok(None) => {
            return Finding::problem(
                "class",
                subject,
                "its volumes cannot move: no controller pod runs with --mover-image (CSI_RELAY_MOVER_IMAGE), so a pod of one on another member waits, refused",
                "give the controller --mover-image with this release's csi-relay image, as the members pull it",
            )
        }
        Err(e) => {
            return Finding::unchecked(
                "class",
                subject,
                format!("the controller pods, for their --mover-image: {e}"),
            )
        }
    };
    for m in &members {
        if clusters.lost.iter().any(|l| l == m) {
            continue;
        }
        let cluster = match clusters.member(m) {
            None => {
                return Finding::problem(
                    "class",
                    subject,
                    format!("movableBetween names member {m:?}, which is not configured (--member): CreateVolume refuses the class"),
                    format!("add --member {m}=KUBECONFIG to the controller, or remove {m} from movableBetween"),
                )
            }
            Some(Err(e)) => return Finding::unchecked("class", subject, e.clone()),
            Some(Ok(c)) => c,
        };
        let class = sharing.class_in(m).unwrap_or_default();
        let api = Api::<StorageClass>::all(cluster.client());
        match cluster
            .fetch(&format!("get StorageClass {class}"), api.get(class))
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Finding::problem(
                    "class",
                    subject,
                    format!("movableBetween gives member {m} the StorageClass {class:?}, which it does not have: a volume made or moved there is refused"),
                    format!("create StorageClass {class} in member {m}, or fix its entry in movableBetween"),
                )
            }
            Err(e) => return Finding::unchecked("class", subject, e.to_string()),
        }
        let mut lacking = Vec::new();
        for (resource, subresource, verb) in MOVER_RIGHTS {
            match holds(cluster, resource, *subresource, verb).await {
                Ok(true) => {}
                Ok(false) => lacking.push(format!(
                    "{verb} {resource}{}",
                    subresource.map(|s| format!("/{s}")).unwrap_or_default()
                )),
                Err(e) => return Finding::unchecked("class", subject, e),
            }
        }
        if !lacking.is_empty() {
            return Finding::problem(
                "class",
                subject,
                format!(
                    "member {m}: the relay's identity lacks the movers' rights ({}): a move there is refused when it makes its movers",
                    lacking.join(", ")
                ),
                format!("install the component mobility/ of deploy/member in member {m} (chart value mobility.enabled)"),
            );
        }
    }
    Finding::ok(
        "class",
        subject,
        format!(
            "volumes move between {} (each has its class and the movers' rights; movers run {image})",
            members.join(", ")
        ),
    )
}

async fn holds(
    cluster: &Cluster,
    resource: &str,
    subresource: Option<&str>,
    verb: &str,
) -> Result<bool, String> {
    let right = super::access::Right {
        group: String::new(),
        resource: match subresource {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        },
        verb: verb.to_string(),
        name: "*".into(),
        namespace: "*".into(),
    };
    super::access::holds(cluster, &right).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::report::Status;
    use super::*;
    use crate::domain::params;
    use crate::k8s::testing::{self, MockApi};

    fn sharing() -> Sharing {
        let map = [(
            "movableBetween".to_string(),
            "east=fast,west=local".to_string(),
        )]
        .into_iter()
        .collect();
        let p = params::decode(&map, "parameters").unwrap();
        Sharing::of(&p).unwrap().unwrap()
    }

    fn clusters(east: Cluster, west: Cluster) -> Clusters {
        let (host, _host_api) = testing::host();
        Clusters {
            host,
            members: vec![("east".into(), Ok(east)), ("west".into(), Ok(west))],
            lost: vec![],
            host_nodes: Ok(vec![]),
        }
    }

    fn pod(args: &[&str], env: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "csi-relay-controller-1"},
            "spec": {"containers": [
                {"name": "csi-provisioner", "args": ["--mover-image=not-this"]},
                {"name": "csi-relay", "args": args,
                 "env": env.map(|v| vec![json!({"name": "CSI_RELAY_MOVER_IMAGE", "value": v})])
                    .unwrap_or_default()}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn the_mover_image_is_read_from_the_relays_container_args_or_env() {
        assert_eq!(
            image_of(&[pod(&["serve", "--mover-image=reg/relay:1"], None)]).as_deref(),
            Some("reg/relay:1")
        );
        assert_eq!(
            image_of(&[pod(&["serve", "--mover-image", "reg/relay:2"], None)]).as_deref(),
            Some("reg/relay:2")
        );
        assert_eq!(
            image_of(&[pod(&["serve"], Some("reg/relay:3"))]).as_deref(),
            Some("reg/relay:3")
        );
        assert_eq!(image_of(&[pod(&["serve"], None)]), None);
        assert_eq!(image_of(&[pod(&["serve", "--mover-image="], None)]), None);
    }

    async fn has_class(api: &mut MockApi, name: &str, found: bool) {
        let call = api
            .expect(
                "GET",
                &format!("/apis/storage.k8s.io/v1/storageclasses/{name}"),
            )
            .await;
        if found {
            call.ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                           "metadata": {"name": name}, "provisioner": "x"}),
            );
        } else {
            call.not_found();
        }
    }

    async fn reviews(api: &mut MockApi, deny: Option<(&str, &str)>) {
        for _ in MOVER_RIGHTS {
            let call = api
                .expect(
                    "POST",
                    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                )
                .await;
            let attrs = call.body["spec"]["resourceAttributes"].clone();
            let resource = match attrs["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", attrs["resource"].as_str().unwrap_or_default()),
                None => attrs["resource"].as_str().unwrap_or_default().to_string(),
            };
            let verb = attrs["verb"].as_str().unwrap_or_default().to_string();
            let allowed = deny != Some((resource.as_str(), verb.as_str()));
            let mut body = call.body.clone();
            body["status"] = json!({"allowed": allowed});
            call.reply(201, body);
        }
    }

    #[tokio::test]
    async fn a_class_whose_members_have_the_class_and_rights_moves() {
        let (east, mut east_api) = testing::member("east");
        let (west, mut west_api) = testing::member("west");
        let c = clusters(east, west);
        let mover = Ok(Some("reg/relay:1".to_string()));
        let sharing = sharing();
        let (finding, (), ()) = tokio::join!(
            check(&c, "StorageClass m", &sharing, &mover),
            async {
                has_class(&mut east_api, "fast", true).await;
                reviews(&mut east_api, None).await;
            },
            async {
                has_class(&mut west_api, "local", true).await;
                reviews(&mut west_api, None).await;
            }
        );
        assert_eq!(finding.status, Status::Ok, "{finding:?}");
        assert!(finding.message.contains("east, west"), "{finding:?}");
        assert!(finding.message.contains("reg/relay:1"), "{finding:?}");
    }

    #[tokio::test]
    async fn a_member_without_its_class_or_the_rights_or_no_image_is_a_problem_naming_it() {
        let (east, mut east_api) = testing::member("east");
        let (west, mut west_api) = testing::member("west");
        let c = clusters(east, west);
        let mover = Ok(Some("reg/relay:1".to_string()));
        let sharing = sharing();
        let (finding, (), ()) = tokio::join!(
            check(&c, "StorageClass m", &sharing, &mover),
            async {
                has_class(&mut east_api, "fast", true).await;
                reviews(&mut east_api, None).await;
            },
            has_class(&mut west_api, "local", false)
        );
        assert_eq!(finding.status, Status::Problem, "{finding:?}");
        assert!(finding.message.contains("member west"), "{finding:?}");
        assert!(finding.message.contains("\"local\""), "{finding:?}");

        let (finding, ()) = tokio::join!(check(&c, "StorageClass m", &sharing, &mover), async {
            has_class(&mut east_api, "fast", true).await;
            reviews(&mut east_api, Some(("pods/portforward", "create"))).await;
        });
        assert_eq!(finding.status, Status::Problem, "{finding:?}");
        assert!(
            finding.message.contains("member east")
                && finding.message.contains("create pods/portforward"),
            "{finding:?}"
        );
        assert!(finding.fix.contains("mobility"), "{finding:?}");

        // No image: said before any member is asked.
        let finding = check(&c, "StorageClass m", &sharing, &Ok(None)).await;
        assert_eq!(finding.status, Status::Problem, "{finding:?}");
        assert!(finding.message.contains("--mover-image"), "{finding:?}");
        drop(c);
        east_api.expect_done().await;
        west_api.expect_done().await;
    }
}
