//! The sidecars' feature gates against the host's Kubernetes version: a
//! gate that a sidecar turns on by default although its README says it
//! needs a newer Kubernetes than the API server's. Such a sidecar runs, and
//! what the gate changes fails quietly: external-resizer v1.13+ with
//! RecoverVolumeExpansionFailure on before 1.32 writes a claim status the
//! API server drops, so an offline expansion never shows
//! FileSystemResizePending. The gates are read from the controller pods'
//! own containers, so the finding is about what runs, not what was meant.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::report::{Clusters, Finding};

const KIND: &str = "gates";

/// A gate a sidecar turns on by default from one release on, and the
/// Kubernetes it needs (from the sidecar's README).
struct Needs {
    container: &'static str,
    gate: &'static str,
    /// The first release (vX.Y.Z) whose default is on.
    on_by_default_from: (u64, u64, u64),
    kubernetes: (u64, u64),
}

const NEEDS: &[Needs] = &[Needs {
    container: "csi-resizer",
    gate: "RecoverVolumeExpansionFailure",
    on_by_default_from: (1, 13, 0),
    kubernetes: (1, 32),
}];

pub async fn check(c: &Clusters, namespace: &str, selector: &str) -> Vec<Finding> {
    let subject = "host cluster";
    let version = match c
        .host
        .run(
            "read the API server's version",
            c.host.client().apiserver_version(),
        )
        .await
    {
        Ok(v) => v,
        Err(e) => return vec![Finding::unchecked(KIND, subject, e.to_string())],
    };
    let Some(kubernetes) = major_minor(&version.major, &version.minor) else {
        return vec![Finding::unchecked(
            KIND,
            subject,
            format!(
                "the API server reports version {:?}.{:?}, not numbers",
                version.major, version.minor
            ),
        )];
    };
    let pods = match super::replicas::controller_pods(c, namespace, selector).await {
        Ok(p) => p,
        Err(e) => return vec![Finding::unchecked(KIND, subject, e)],
    };
    judge(&version.git_version, kubernetes, namespace, &pods)
}

/// "1", "28+" → (1, 28).
fn major_minor(major: &str, minor: &str) -> Option<(u64, u64)> {
    let digits = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u64>()
            .ok()
    };
    Some((digits(major)?, digits(minor)?))
}

/// The release in an image's tag (`…/csi-resizer:v2.2.1` → (2, 2, 1)); a
/// digest or a tag that is no release gives None.
fn release(image: &str) -> Option<(u64, u64, u64)> {
    let name = image.rsplit('/').next()?;
    let (_, tag) = name.split_once(':')?;
    let tag = tag.split('@').next()?.strip_prefix('v')?;
    let mut parts = tag.splitn(3, '.').map(|p| {
        p.split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse::<u64>().ok())
    });
    Some((parts.next()??, parts.next()??, parts.next()??))
}

/// Whether `gate` is on in a container: its last `--feature-gates` that
/// names it, else the release's default (a release that cannot be read
/// from the image counts as a recent one: on).
fn gate_on(c: &Container, need: &Needs) -> bool {
    let mut on = c
        .image
        .as_deref()
        .and_then(release)
        .is_none_or(|r| r >= need.on_by_default_from);
    for arg in c.args.iter().flatten() {
        let Some(gates) = arg
            .strip_prefix("--feature-gates=")
            .or_else(|| arg.strip_prefix("-feature-gates="))
        else {
            continue;
        };
        for pair in gates.split(',') {
            if let Some((name, value)) = pair.split_once('=') {
                if name.trim() == need.gate {
                    on = value.trim().eq_ignore_ascii_case("true");
                }
            }
        }
    }
    on
}

pub fn judge(
    git_version: &str,
    kubernetes: (u64, u64),
    namespace: &str,
    pods: &[Pod],
) -> Vec<Finding> {
    let subject = "host cluster";
    if pods.is_empty() {
        return vec![Finding::info(
            KIND,
            subject,
            format!("no controller pod in namespace {namespace} to read the sidecars' feature gates from"),
        )];
    }
    let mut out = Vec::new();
    for need in NEEDS.iter().filter(|n| kubernetes < n.kubernetes) {
        for pod in pods {
            let name = pod.metadata.name.as_deref().unwrap_or("?");
            let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
            for c in containers.filter(|c| c.name == need.container && gate_on(c, need)) {
                out.push(Finding::problem(
                    KIND,
                    subject,
                    format!(
                        "{} of pod {namespace}/{name} ({}) runs with feature gate {} on, which needs Kubernetes {}.{}; this API server is {git_version}",
                        need.container,
                        c.image.as_deref().unwrap_or("no image"),
                        need.gate,
                        need.kubernetes.0,
                        need.kubernetes.1,
                    ),
                    format!(
                        "give {} --feature-gates={}=false: the component deploy/kubernetes-1.28-1.31 does it for kubectl apply -k, the chart does it by itself from the cluster's version (helm upgrade)",
                        need.container, need.gate
                    ),
                ));
            }
        }
    }
    if out.is_empty() {
        out.push(Finding::ok(
            KIND,
            subject,
            format!(
                "the sidecars' feature gates fit Kubernetes {git_version} ({} controller pod(s))",
                pods.len()
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::check::report::Status;
    use k8s_openapi::api::core::v1::PodSpec;

    fn pod(image: &str, args: &[&str]) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("csi-relay-controller-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![
                    Container {
                        name: "csi-relay".into(),
                        ..Default::default()
                    },
                    Container {
                        name: "csi-resizer".into(),
                        image: Some(image.into()),
                        args: Some(args.iter().map(|a| a.to_string()).collect()),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const V221: &str = "registry.k8s.io/sig-storage/csi-resizer:v2.2.1";

    #[test]
    fn a_default_on_gate_before_the_kubernetes_it_needs_is_a_problem_naming_pod_gate_and_version() {
        let got = judge(
            "v1.28.0",
            (1, 28),
            "storage",
            &[pod(V221, &["--timeout=60s"])],
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].status, Status::Problem);
        for word in [
            "storage/csi-relay-controller-1",
            "RecoverVolumeExpansionFailure",
            "1.32",
            "v1.28.0",
            "v2.2.1",
        ] {
            assert!(got[0].message.contains(word), "{word}: {}", got[0].message);
        }
        assert!(got[0]
            .fix
            .contains("--feature-gates=RecoverVolumeExpansionFailure=false"));
    }

    #[test]
    fn the_gate_turned_off_a_newer_kubernetes_or_an_older_release_is_fine() {
        let off = pod(
            V221,
            &["--feature-gates=RecoverVolumeExpansionFailure=false"],
        );
        let late = pod(V221, &["--feature-gates=RecoverVolumeExpansionFailure=true,RecoverVolumeExpansionFailure=false"]);
        let old = pod("registry.k8s.io/sig-storage/csi-resizer:v1.10.1", &[]);
        for (kubernetes, p) in [((1, 28), &off), ((1, 31), &late), ((1, 28), &old)] {
            let got = judge("v1.x", kubernetes, "csi-relay", std::slice::from_ref(p));
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].status, Status::Ok, "{:?}", got[0].message);
        }
        let on = pod(V221, &[]);
        let got = judge("v1.32.0", (1, 32), "csi-relay", &[on]);
        assert_eq!(got[0].status, Status::Ok);
        // Turned on by hand on an old release: a problem too.
        let forced = pod(
            "registry.k8s.io/sig-storage/csi-resizer:v1.10.1",
            &["--feature-gates=RecoverVolumeExpansionFailure=true"],
        );
        assert_eq!(
            judge("v1.28.0", (1, 28), "n", &[forced])[0].status,
            Status::Problem
        );
        // An image whose release cannot be read counts as recent.
        let digest = pod("mirror.example.com/resizer@sha256:0123", &[]);
        assert_eq!(
            judge("v1.28.0", (1, 28), "n", &[digest])[0].status,
            Status::Problem
        );
    }

    #[test]
    fn no_controller_pod_is_said_and_versions_parse() {
        let got = judge("v1.28.0", (1, 28), "csi-relay", &[]);
        assert_eq!(got[0].status, Status::Info);
        assert_eq!(major_minor("1", "28+"), Some((1, 28)));
        assert_eq!(major_minor("", "28"), None);
        assert_eq!(release(V221), Some((2, 2, 1)));
        assert_eq!(
            release("localhost:5000/csi-resizer:v1.13.0-rc.1"),
            Some((1, 13, 0))
        );
        assert_eq!(release("csi-resizer:latest"), None);
        assert_eq!(release("csi-resizer"), None);
    }
}
