//! The `csi.volume.kubernetes.io/nodeid` node annotation, in kubelet's
//! format: one JSON object mapping each CSI driver name to its node id,
//! `{"driver-a":"id-a","driver-b":"id-b"}` (kubelet writes it with Go's
//! `json.Marshal` of a `map[string]string`: compact, keys sorted, which is
//! what a `BTreeMap` serializes to). Several drivers share the one value, so
//! it is always merged, never overwritten.

use std::collections::BTreeMap;

pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";

/// What the annotation holds today.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Existing {
    /// No annotation, or an empty one (kubelet reads both as no driver).
    Absent,
    Drivers(BTreeMap<String, String>),
    /// Not a JSON object of strings: kubelet and external-attacher cannot
    /// read it either.
    Malformed {
        value: String,
        error: String,
    },
}

pub fn parse(value: Option<&str>) -> Existing {
    match value {
        None | Some("") => Existing::Absent,
        Some(value) => match serde_json::from_str::<BTreeMap<String, String>>(value) {
            Ok(drivers) => Existing::Drivers(drivers),
            Err(e) => Existing::Malformed {
                value: value.to_string(),
                error: e.to_string(),
            },
        },
    }
}

fn render(drivers: &BTreeMap<String, String>) -> String {
    // A map of strings always serializes; the fallback is unreachable.
    serde_json::to_string(drivers).unwrap_or_else(|_| "{}".into())
}

/// The value with `driver` → `node_id` merged in, keeping every other
/// driver's entry. A malformed value is replaced (nobody can read it, and
/// kubelet itself would refuse to register any driver on top of it).
pub fn with_driver(existing: &Existing, driver: &str, node_id: &str) -> String {
    let mut drivers = match existing {
        Existing::Drivers(drivers) => drivers.clone(),
        Existing::Absent | Existing::Malformed { .. } => BTreeMap::new(),
    };
    drivers.insert(driver.to_string(), node_id.to_string());
    render(&drivers)
}

/// The value once `driver` is gone: `None` when no driver is left (the
/// annotation is then removed, as kubelet does), the value unchanged when it
/// is malformed (not ours to discard when we are leaving).
pub fn without_driver(existing: &Existing, driver: &str) -> Option<String> {
    match existing {
        Existing::Absent => None,
        Existing::Malformed { value, .. } => Some(value.clone()),
        Existing::Drivers(drivers) => {
            let mut drivers = drivers.clone();
            drivers.remove(driver);
            (!drivers.is_empty()).then(|| render(&drivers))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_other_drivers_in_kubelet_format() {
        let existing = parse(Some(r#"{"ebs.csi.aws.com":"i-0abc","z.csi":"n1"}"#));
        assert_eq!(
            with_driver(&existing, "relay.csi.dev", "vn-1"),
            r#"{"ebs.csi.aws.com":"i-0abc","relay.csi.dev":"vn-1","z.csi":"n1"}"#
        );
        assert_eq!(
            with_driver(&parse(None), "relay.csi.dev", "vn-1"),
            r#"{"relay.csi.dev":"vn-1"}"#
        );
        assert_eq!(
            with_driver(&parse(Some("")), "relay.csi.dev", "vn-1"),
            r#"{"relay.csi.dev":"vn-1"}"#
        );
        // A stale id of ours is replaced.
        let stale = parse(Some(r#"{"relay.csi.dev":"old"}"#));
        assert_eq!(
            with_driver(&stale, "relay.csi.dev", "vn-1"),
            r#"{"relay.csi.dev":"vn-1"}"#
        );
    }

    #[test]
    fn a_malformed_value_is_replaced_when_registering() {
        for bad in ["not json", r#"{"a":1}"#, r#"["relay.csi.dev"]"#, "{"] {
            let existing = parse(Some(bad));
            assert!(
                matches!(&existing, Existing::Malformed { value, .. } if value == bad),
                "{bad}: {existing:?}"
            );
            assert_eq!(
                with_driver(&existing, "relay.csi.dev", "vn-1"),
                r#"{"relay.csi.dev":"vn-1"}"#
            );
        }
    }

    #[test]
    fn removing_keeps_other_drivers_and_drops_an_emptied_annotation() {
        let both = parse(Some(
            r#"{"ebs.csi.aws.com":"i-0abc","relay.csi.dev":"vn-1"}"#,
        ));
        assert_eq!(
            without_driver(&both, "relay.csi.dev").as_deref(),
            Some(r#"{"ebs.csi.aws.com":"i-0abc"}"#)
        );
        let ours = parse(Some(r#"{"relay.csi.dev":"vn-1"}"#));
        assert_eq!(without_driver(&ours, "relay.csi.dev"), None);
        assert_eq!(without_driver(&parse(None), "relay.csi.dev"), None);
        let bad = parse(Some("not json"));
        assert_eq!(
            without_driver(&bad, "relay.csi.dev").as_deref(),
            Some("not json")
        );
    }
}
