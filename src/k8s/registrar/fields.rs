//! What the registrar owns on an object, read from its `managedFields`.
//!
//! Server-side apply records, per field manager, the fields it set. The
//! registrar uses that record instead of a marker of its own: it tells which
//! labels and CSINode entries *we* put there (and may take away) from the
//! identical ones kubelet or an admin put there (which we leave alone).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;

/// The field manager of every write of the registrar.
pub const FIELD_MANAGER: &str = "csi-relay-registrar";

/// The field sets our manager applied to the main resource.
pub fn ours(managed: Option<&[ManagedFieldsEntry]>) -> Vec<&Value> {
    managed
        .unwrap_or_default()
        .iter()
        .filter(|e| e.manager.as_deref() == Some(FIELD_MANAGER))
        .filter(|e| e.operation.as_deref() == Some("Apply"))
        .filter(|e| e.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|e| e.fields_v1.as_ref().map(|f| &f.0))
        .collect()
}

fn at<'a>(set: &'a Value, path: &[&str]) -> Option<&'a serde_json::Map<String, Value>> {
    path.iter()
        .try_fold(set, |v, step| v.get(*step))
        .and_then(Value::as_object)
}

/// The map keys owned under `path` (`f:metadata` → `f:labels` gives label
/// keys).
pub fn map_keys(sets: &[&Value], path: &[&str]) -> BTreeSet<String> {
    sets.iter()
        .filter_map(|set| at(set, path))
        .flat_map(|m| m.keys())
        .filter_map(|k| k.strip_prefix("f:"))
        .map(str::to_string)
        .collect()
}

/// The `key_field` values of the list-map items owned under `path`
/// (`f:spec` → `f:drivers` by `name` gives driver names).
pub fn list_keys(sets: &[&Value], path: &[&str], key_field: &str) -> BTreeSet<String> {
    sets.iter()
        .filter_map(|set| at(set, path))
        .flat_map(|m| m.keys())
        .filter_map(|k| k.strip_prefix("k:"))
        .filter_map(|k| serde_json::from_str::<Value>(k).ok())
        .filter_map(|k| k.get(key_field).and_then(Value::as_str).map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    fn entry(
        manager: &str,
        operation: &str,
        subresource: Option<&str>,
        fields: Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: subresource.map(str::to_string),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }
    }

    #[test]
    fn only_our_applied_fields_count() {
        let managed = vec![
            entry(
                FIELD_MANAGER,
                "Apply",
                None,
                json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b/c": {}}},
                       "f:spec": {"f:drivers": {
                           "k:{\"name\":\"relay.csi.dev\"}": {".": {}, "f:name": {}},
                           "k:{\"name\": \"other\"}": {},
                           "k:not json": {}}}}),
            ),
            entry(
                "kubelet",
                "Update",
                None,
                json!({"f:metadata": {"f:labels": {"f:k": {}}}}),
            ),
            entry(
                FIELD_MANAGER,
                "Update",
                None,
                json!({"f:metadata": {"f:labels": {"f:u": {}}}}),
            ),
            entry(
                FIELD_MANAGER,
                "Apply",
                Some("status"),
                json!({"f:metadata": {"f:labels": {"f:s": {}}}}),
            ),
        ];
        let sets = ours(Some(&managed));
        assert_eq!(sets.len(), 1);
        assert_eq!(
            map_keys(&sets, &["f:metadata", "f:labels"]),
            BTreeSet::from(["a".to_string(), "b/c".to_string()])
        );
        assert_eq!(
            list_keys(&sets, &["f:spec", "f:drivers"], "name"),
            BTreeSet::from(["relay.csi.dev".to_string(), "other".to_string()])
        );
        assert!(map_keys(&sets, &["f:metadata", "f:annotations"]).is_empty());
        assert!(ours(None).is_empty());
    }
}
