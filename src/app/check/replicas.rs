//! The controller's replicas: how many run and where, which one leads and
//! since when it renewed, and a sidecar that leads beside a relay that
//! stands by (its calls are refused until the leader moves its Lease).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::report::{Clusters, Finding};
use crate::app::leader::{holder_pod, lease_name, sidecar_lease_names};

const KIND: &str = "controller";

/// The sidecars, in the order of [`sidecar_lease_names`].
const SIDECARS: [&str; 4] = [
    "external-provisioner",
    "external-attacher",
    "external-resizer",
    "external-snapshotter",
];

pub async fn check(c: &Clusters, driver: &str, namespace: &str, selector: &str) -> Vec<Finding> {
    let leases: Api<Lease> = Api::namespaced(c.host.client(), namespace);
    let name = lease_name(driver);
    let relay = match c
        .host
        .run("get the leader Lease", leases.get_opt(&name))
        .await
    {
        Ok(l) => l,
        Err(e) => return vec![Finding::unchecked(KIND, namespace, e.to_string())],
    };
    let mut sidecars = Vec::new();
    for lease in sidecar_lease_names(driver) {
        if let Ok(Some(l)) = c
            .host
            .run("get a sidecar Lease", leases.get_opt(&lease))
            .await
        {
            sidecars.push(l);
        }
    }
    let pods = match controller_pods(c, namespace, selector).await {
        Ok(p) => p,
        Err(e) => return vec![Finding::unchecked(KIND, namespace, e)],
    };
    judge(
        driver,
        namespace,
        relay.as_ref(),
        &sidecars,
        &pods,
        k8s_openapi::jiff::Timestamp::now(),
    )
}

/// The controller's pods: `selector` in `namespace`.
pub async fn controller_pods(
    c: &Clusters,
    namespace: &str,
    selector: &str,
) -> Result<Vec<Pod>, String> {
    let pods: Api<Pod> = Api::namespaced(c.host.client(), namespace);
    c.host
        .run(
            "list the controller pods",
            pods.list(&ListParams::default().labels(selector)),
        )
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

fn spec_holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// What the Leases and pods say, as report lines.
pub fn judge(
    driver: &str,
    namespace: &str,
    relay: Option<&Lease>,
    sidecars: &[Lease],
    pods: &[Pod],
    now: k8s_openapi::jiff::Timestamp,
) -> Vec<Finding> {
    let subject = format!("{namespace}/{}", lease_name(driver));
    let Some(relay) = relay else {
        return vec![Finding::info(
            KIND,
            subject,
            "no leader Lease: the controller runs without --leader-election (one replica), or has not started",
        )];
    };
    let running: Vec<(String, String)> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                p.spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default(),
            )
        })
        .collect();
    let where_: Vec<String> = running.iter().map(|(p, n)| format!("{p} on {n}")).collect();
    let mut out = Vec::new();
    let Some(holder) = spec_holder(relay) else {
        out.push(Finding::problem(
            KIND,
            subject,
            format!("no replica holds the leader Lease ({} running: {}): no controller call is served", running.len(), where_.join(", ")),
            "see the csi-relay container's log of each controller pod (kubectl -n NS logs POD -c csi-relay)",
        ));
        return out;
    };
    let leader = holder_pod(holder);
    let spec = relay.spec.clone().unwrap_or_default();
    let age = spec
        .renew_time
        .as_ref()
        .map(|t| now.duration_since(t.0).as_secs_f64());
    let duration = f64::from(spec.lease_duration_seconds.unwrap_or(0));
    if let Some(age) = age.filter(|a| *a > duration) {
        out.push(Finding::problem(
            KIND,
            subject.clone(),
            format!("the leader Lease of {leader} was last renewed {age:.0} s ago, past its {duration:.0} s: its replica is gone, frozen or cut off, and writes nothing; a standby takes over"),
            "if no standby takes over within a minute, see the controller pods (kubectl -n NS get pods -o wide) and their csi-relay logs",
        ));
    }
    if !running.iter().any(|(p, _)| p == leader) {
        out.push(Finding::problem(
            KIND,
            subject.clone(),
            format!(
                "the leader Lease names {leader}, which is not a running pod of {namespace} ({})",
                where_.join(", ")
            ),
            "if it stays, see the controller pods and their csi-relay logs",
        ));
    }
    let renewed = age.map_or("never renewed".to_string(), |a| {
        format!("renewed {a:.0} s ago")
    });
    out.push(Finding::ok(
        KIND,
        subject.clone(),
        format!(
            "{} replica(s) running ({}); {leader} leads (Lease {renewed})",
            running.len(),
            where_.join(", ")
        ),
    ));
    if running.len() < 2 {
        out.push(Finding::info(
            KIND,
            subject.clone(),
            "one replica: if its node is lost, no claim is provisioned, attached or deleted until Kubernetes starts it elsewhere (minutes)",
        ));
    } else {
        let mut nodes: Vec<&str> = running.iter().map(|(_, n)| n.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        if nodes.len() < running.len() {
            out.push(Finding::info(
                KIND,
                subject.clone(),
                format!(
                    "replicas share a node ({}): losing it takes more than one",
                    where_.join(", ")
                ),
            ));
        }
    }
    // The provisioner elects under an identity of its own making: which pod
    // it is in cannot be read from its Lease. The others elect by pod name.
    let names = sidecar_lease_names(driver);
    for lease in sidecars {
        let lname = lease.metadata.name.as_deref().unwrap_or_default();
        let Some(i) = names.iter().position(|n| n == lname) else {
            continue;
        };
        if i == 0 {
            continue;
        }
        if let Some(h) = spec_holder(lease).filter(|h| *h != leader) {
            out.push(Finding::problem(
                KIND,
                format!("{namespace}/{lname}"),
                format!("{} leads in pod {h}, not beside the leading relay ({leader}): the calls it makes are refused", SIDECARS[i]),
                "the leader moves it within seconds; if it stays, see the leader's csi-relay log (\"moved a sidecar's Lease\")",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(name: &str, holder: &str, renewed_secs_ago: i64) -> Lease {
        let now = k8s_openapi::jiff::Timestamp::from_second(1_000_000).unwrap_or_default();
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(10),
                renew_time: Some(MicroTime(
                    now - k8s_openapi::jiff::SignedDuration::from_secs(renewed_secs_ago),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    fn pod(name: &str, node: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": "Running"}
        }))
        .unwrap_or_default()
    }

    fn now() -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::from_second(1_000_000).unwrap_or_default()
    }

    #[test]
    fn two_replicas_one_leading_with_its_sidecars_is_ok() {
        let relay = lease("relay-csi-dev-controller", "ctl-a_0a1b2c3d", 1);
        let sidecars = [
            lease("relay-csi-dev", "1795845816456-2403-relay-csi-dev", 1),
            lease("external-attacher-leader-relay-csi-dev", "ctl-a", 1),
        ];
        let got = judge(
            "relay.csi.dev",
            "csi-relay",
            Some(&relay),
            &sidecars,
            &[pod("ctl-a", "n1"), pod("ctl-b", "n2")],
            now(),
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].message.contains("2 replica(s) running (ctl-a on n1, ctl-b on n2); ctl-a leads (Lease renewed 1 s ago)"), "{got:?}");
    }

    #[test]
    fn a_sidecar_leading_beside_a_standby_a_stale_lease_and_one_node_are_named() {
        let relay = lease("relay-csi-dev-controller", "ctl-a_0a1b2c3d", 30);
        let sidecars = [lease("external-resizer-relay-csi-dev", "ctl-b", 1)];
        let got = judge(
            "relay.csi.dev",
            "csi-relay",
            Some(&relay),
            &sidecars,
            &[pod("ctl-a", "n1"), pod("ctl-b", "n1")],
            now(),
        );
        let text: Vec<String> = got.iter().map(|f| f.message.clone()).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("last renewed 30 s ago, past its 10 s")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.contains(
                "external-resizer leads in pod ctl-b, not beside the leading relay (ctl-a)"
            )),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.contains("replicas share a node")),
            "{text:?}"
        );
        let problems = got
            .iter()
            .filter(|f| f.status == super::super::report::Status::Problem)
            .count();
        assert_eq!(problems, 2, "{got:?}");
    }

    #[test]
    fn no_holder_or_no_lease_is_said() {
        let mut free = lease("relay-csi-dev-controller", "", 1);
        if let Some(s) = free.spec.as_mut() {
            s.holder_identity = None;
        }
        let got = judge(
            "relay.csi.dev",
            "csi-relay",
            Some(&free),
            &[],
            &[pod("ctl-a", "n1")],
            now(),
        );
        assert!(
            got[0].message.contains("no replica holds the leader Lease"),
            "{got:?}"
        );
        let got = judge("relay.csi.dev", "csi-relay", None, &[], &[], now());
        assert!(
            got[0].message.contains("without --leader-election"),
            "{got:?}"
        );
    }
}
