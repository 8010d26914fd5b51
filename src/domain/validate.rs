//! Checks on the raw request fields every RPC shares: ids, names, paths,
//! string maps. Everything in a request is untrusted.

use std::collections::HashMap;
use std::path::{Component, Path};

use crate::domain::error::{CsiError, CsiResult};

/// The CSI spec's size limit for ids and names.
pub const MAX_ID_LEN: usize = 128;
/// The CSI spec's size limit for a map (keys + values).
pub const MAX_MAP_BYTES: usize = 4096;
/// Linux PATH_MAX.
pub const MAX_PATH_LEN: usize = 4096;

/// A required id or name: non-empty, at most 128 bytes, no control chars.
pub fn id<'a>(value: &'a str, field: &'static str) -> CsiResult<&'a str> {
    if value.is_empty() {
        return Err(CsiError::Missing(field));
    }
    if value.len() > MAX_ID_LEN {
        return Err(CsiError::invalid(
            field,
            format!("{} bytes long, at most {MAX_ID_LEN} allowed", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(CsiError::invalid(field, "contains control characters"));
    }
    Ok(value)
}

/// An absolute path the CO owns (staging or target path): no `..`, no NUL,
/// bounded length. Returned in normal form (no `.`, `//` or trailing `/`) so
/// that two spellings of one path are one record.
pub fn path(value: &str, field: &'static str) -> CsiResult<String> {
    if value.is_empty() {
        return Err(CsiError::Missing(field));
    }
    if value.len() > MAX_PATH_LEN {
        return Err(CsiError::invalid(
            field,
            format!("longer than {MAX_PATH_LEN} bytes"),
        ));
    }
    if value.contains('\0') {
        return Err(CsiError::invalid(field, "contains a NUL byte"));
    }
    let p = Path::new(value);
    if !p.is_absolute() {
        return Err(CsiError::invalid(
            field,
            format!("{value:?} is not an absolute path"),
        ));
    }
    if p.components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(CsiError::invalid(
            field,
            format!("{value:?} contains '.' or '..' components"),
        ));
    }
    if p.parent().is_none() {
        return Err(CsiError::invalid(
            field,
            "the filesystem root cannot be used",
        ));
    }
    Ok(p.components()
        .collect::<std::path::PathBuf>()
        .to_string_lossy()
        .into_owned())
}

/// A string map (parameters, contexts) within the spec's size limit.
pub fn map(value: &HashMap<String, String>, field: &'static str) -> CsiResult<()> {
    let bytes: usize = value.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_MAP_BYTES {
        return Err(CsiError::invalid(
            field,
            format!("{bytes} bytes of keys and values, at most {MAX_MAP_BYTES} allowed"),
        ));
    }
    Ok(())
}

/// Secrets are checked for size only; their content is never echoed.
pub fn secrets(value: &HashMap<String, String>) -> CsiResult<()> {
    map(value, "secrets")
}

/// A DNS-1123 label: what Kubernetes names namespaces and label-like
/// names with.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// A DNS-1123 subdomain: what Kubernetes names most objects with; each
/// part also a DNS label of 63 bytes at most (stricter than Kubernetes,
/// and what the names the relay makes are held to).
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// An object name exactly as Kubernetes takes it (IsDNS1123Subdomain: no
/// bound on a part): for names another controller chose, such as the
/// `snapshot-<64 hex>` VolumeSnapshots of a VolumeGroupSnapshot.
pub fn is_object_name(s: &str) -> bool {
    let part = |p: &str| {
        let b = p.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    s.len() <= 253 && s.split('.').all(part)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_what_kubernetes_takes() {
        let group_member = format!("snapshot-{}", "0a".repeat(32));
        assert!(is_object_name(&group_member) && !is_dns_subdomain(&group_member));
        assert!(is_object_name("a.b-c.d"));
        for bad in ["", "A", "-a", "a-", "a..b", "a_b", "a/b", &"a".repeat(254)] {
            assert!(!is_object_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn ids_are_bounded_and_required() {
        assert!(matches!(
            id("", "volume_id"),
            Err(CsiError::Missing("volume_id"))
        ));
        assert!(id(&"a".repeat(128), "name").is_ok());
        assert!(id(&"a".repeat(129), "name").is_err());
        assert!(id("a\nb", "name").is_err());
        assert!(
            id("../../etc", "volume_id").is_ok(),
            "ids are opaque: lookups, never paths"
        );
    }

    #[test]
    fn paths_must_be_absolute_and_normalised() {
        assert!(path("/var/lib/kubelet/x", "target_path").is_ok());
        assert!(path("relative/x", "target_path").is_err());
        assert!(path("/a/../etc", "target_path").is_err());
        assert!(
            path("/a/./b", "target_path").is_ok(),
            "Path drops interior '.' components"
        );
        assert!(path("/", "target_path").is_err());
        assert!(path(&format!("/{}", "a".repeat(5000)), "target_path").is_err());
    }

    #[test]
    fn maps_are_bounded() {
        let mut m = HashMap::new();
        m.insert("k".to_string(), "v".repeat(5000));
        assert!(map(&m, "parameters").is_err());
    }
}
