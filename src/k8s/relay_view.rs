//! What the controller keeps of each watched RelayVolume: only what its
//! readers read. The catch-up reads the name, the version it writes onto,
//! the volume id and the status; the member observer the status entries;
//! the member's warnings the host claim and LAST-ERROR. Whole objects
//! (an `ObjectMeta` and a spec of mostly empty fields, about 700 bytes
//! before any string) cost 1 KiB per volume more at 10,000 volumes
//! (`bench/member-scale.sh`); the record, labels and managedFields, which
//! the store or nobody reads, more still.

use std::borrow::Cow;

use kube::runtime::reflector::{self, Lookup, Store};
use kube::runtime::watcher;
use kube::Resource;

use crate::k8s::relay_volume::{RelayVolume, RelayVolumeStatus};

/// A watched RelayVolume, as the controller keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub name: String,
    pub resource_version: Option<String>,
    pub volume_id: String,
    /// namespace/name of the host claim.
    pub host_pvc: Option<String>,
    pub status: Option<RelayVolumeStatus>,
}

/// The RelayVolumes as watched, by name.
pub type View = Store<Seen>;

impl From<RelayVolume> for Seen {
    fn from(rv: RelayVolume) -> Self {
        Seen {
            name: rv.metadata.name.unwrap_or_default(),
            resource_version: rv.metadata.resource_version,
            volume_id: rv.spec.volume_id,
            host_pvc: rv.spec.host_pvc,
            status: rv.status,
        }
    }
}

/// `event`, its objects kept as `Seen`.
pub fn seen_event(event: watcher::Event<RelayVolume>) -> watcher::Event<Seen> {
    match event {
        watcher::Event::Apply(rv) => watcher::Event::Apply(rv.into()),
        watcher::Event::Delete(rv) => watcher::Event::Delete(rv.into()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(rv) => watcher::Event::InitApply(rv.into()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// `rv` applied, as the watch tells it.
#[cfg(test)]
pub fn applied(rv: RelayVolume) -> watcher::Event<Seen> {
    watcher::Event::Apply(rv.into())
}

/// The name `Seen` is found by in a `View`.
pub fn key(name: &str) -> reflector::ObjectRef<Seen> {
    reflector::ObjectRef::new(name)
}

/// An empty view and what fills it (the watch, or a test).
pub fn view() -> (View, reflector::store::Writer<Seen>) {
    reflector::store()
}

// Kept in a reflector's store as RelayVolumes are: same kind, same key.
impl Lookup for Seen {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        <RelayVolume as Resource>::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        <RelayVolume as Resource>::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        <RelayVolume as Resource>::version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        <RelayVolume as Resource>::plural(&())
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        None
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.resource_version.as_deref().map(Cow::Borrowed)
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::k8s::relay_volume::{RelayNodeStatus, RelayVolumeSpec};

    fn object() -> RelayVolume {
        let mut rv = RelayVolume::new(
            "rv-1",
            RelayVolumeSpec {
                volume_id: "m-east-1".into(),
                volume_name: "pvc-1".into(),
                capacity_bytes: 1,
                member: Some("east".into()),
                member_pvc: Some("relay/relay-1".into()),
                host_pvc: Some("apps/data".into()),
                record: "{\"id\":\"m-east-1\"}".into(),
                format_version: 1,
                leader_term: Some(3),
            },
        );
        rv.metadata.resource_version = Some("7".into());
        rv.metadata.uid = Some("4f1c".into());
        rv.status = Some(RelayVolumeStatus {
            phase: Some("PUBLISHED".into()),
            node_summary: Some("east/n1".into()),
            last_error: Some("member says no".into()),
            nodes: Some(vec![RelayNodeStatus {
                node: "east/n1".into(),
                member: Some("east".into()),
                phase: Some("PUBLISHED".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        rv
    }

    // What the readers read is kept, and the store finds it by name as it
    // found the object; a delete takes it out.
    #[test]
    fn keeps_what_the_readers_read_under_the_objects_name() {
        let rv = object();
        let seen = Seen::from(rv.clone());
        assert_eq!(seen.name, "rv-1");
        assert_eq!(seen.resource_version.as_deref(), Some("7"));
        assert_eq!(seen.volume_id, "m-east-1");
        assert_eq!(seen.host_pvc.as_deref(), Some("apps/data"));
        assert_eq!(seen.status, rv.status);

        let (reader, mut writer) = view();
        writer.apply_watcher_event(&seen_event(watcher::Event::Apply(rv.clone())));
        assert_eq!(reader.get(&key("rv-1")).as_deref(), Some(&seen));
        assert_eq!(key("rv-1"), reflector::ObjectRef::<Seen>::from_obj(&seen));
        writer.apply_watcher_event(&seen_event(watcher::Event::Delete(rv)));
        assert!(reader.get(&key("rv-1")).is_none());
    }

    // A relist replaces the whole view, as it does for whole objects.
    #[test]
    fn a_relist_replaces_the_view() {
        let (reader, mut writer) = view();
        writer.apply_watcher_event(&seen_event(watcher::Event::Apply(object())));
        let mut other = object();
        other.metadata.name = Some("rv-2".into());
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(other),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&seen_event(event));
        }
        assert!(reader.get(&key("rv-1")).is_none());
        assert!(reader.get(&key("rv-2")).is_some());
    }
}
