//! The RelayVolume CRD: installed, and with every field this build writes
//! (an older schema prunes the fields it lacks from every object written).

use std::collections::BTreeSet;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::CustomResourceExt;
use serde_json::Value;

use super::report::Finding;
use crate::k8s::cluster::Cluster;
use crate::k8s::relay_volume::{RelayVolume, FORMAT, VERSION};

const NAME: &str = "relayvolumes.relay.csi.dev";
const FIX: &str = "csi-relay crd | kubectl apply -f -   (with this build's binary)";

/// The property paths of a version's schema (`spec.record`, ...).
fn paths(schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (key, sub) in props {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        out.insert(path.clone());
        paths(sub, &path, out);
        if let Some(items) = sub.get("items") {
            paths(items, &path, out);
        }
    }
}

fn schema_paths(crd: &CustomResourceDefinition) -> Option<BTreeSet<String>> {
    let version = crd.spec.versions.iter().find(|v| v.name == VERSION)?;
    let schema =
        serde_json::to_value(version.schema.as_ref()?.open_api_v3_schema.as_ref()?).ok()?;
    let mut out = BTreeSet::new();
    paths(&schema, "", &mut out);
    Some(out)
}

pub async fn check(host: &Cluster) -> Vec<Finding> {
    let api = Api::<CustomResourceDefinition>::all(host.client());
    let installed = match host
        .fetch(
            &format!("get CustomResourceDefinition {NAME}"),
            api.get(NAME),
        )
        .await
    {
        Ok(Some(crd)) => crd,
        Ok(None) => {
            return vec![Finding::problem(
                "crd",
                NAME,
                "not installed: the controller cannot start, and no volume is recorded",
                FIX,
            )]
        }
        Err(e) => return vec![Finding::unchecked("crd", NAME, e.to_string())],
    };
    let wanted = schema_paths(&RelayVolume::crd()).unwrap_or_default();
    let Some(have) = schema_paths(&installed) else {
        return vec![Finding::problem(
            "crd",
            NAME,
            format!("installed without version {VERSION} or its schema"),
            FIX,
        )];
    };
    let missing: Vec<&String> = wanted.difference(&have).collect();
    if missing.is_empty() {
        let extra: Vec<&String> = have.difference(&wanted).collect();
        if extra.is_empty() {
            vec![Finding::ok(
                "crd",
                NAME,
                format!("installed, {VERSION}, the schema this build writes (RelayVolume format {FORMAT})"),
            )]
        } else {
            vec![Finding::info(
                "crd",
                NAME,
                format!("installed by a newer build: fields this build does not write: {extra:?}"),
            )]
        }
    } else {
        vec![Finding::problem(
            "crd",
            NAME,
            format!(
                "older than this build: the API server drops the fields {missing:?} from every RelayVolume it writes"
            ),
            FIX,
        )]
    }
}
