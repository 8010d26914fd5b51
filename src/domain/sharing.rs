//! Global storage: which members reach one volume's storage, and where.
//!
//! A class with `sharedWith` says its member storage is one system that
//! every member listed reaches on its own (a Ceph cluster, a filer, a
//! distributed filesystem mounted on every node of those members). The
//! volume is provisioned once, in one of them; another gets an import (a
//! PV naming the same data) where a pod of it runs. What "the same data"
//! means per source type is argued in docs/members.md: the same CSI driver
//! and handle, the same NFS server and path, or a hostPath/local directory
//! at the same place under each member's mount of the shared filesystem
//! (`sharedPaths`, when the members mount it at different paths).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::domain::params::VolumeParams;

/// Longest `sharedWith`/`sharedPaths` value taken: StorageClass parameters
/// are editable objects, and these lists name a handful of members.
const MAX_LIST: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharing {
    members: BTreeSet<String>,
    /// Where each member's nodes mount the shared filesystem; empty: the
    /// same path everywhere.
    mounts: BTreeMap<String, PathBuf>,
    /// A class whose members share nothing (`movableBetween`): each
    /// member's StorageClass; the data moves between them. Empty for
    /// shared storage.
    classes: BTreeMap<String, String>,
}

impl Sharing {
    /// The sharing a class declares; None for a volume of one member. The
    /// error names the parameter, the value and why.
    pub fn of(params: &VolumeParams) -> Result<Option<Sharing>, String> {
        if let Some(list) = &params.movable_between {
            return Self::movable(params, list).map(Some);
        }
        if params.moved_data_retention.is_some() {
            return Err("movedDataRetention is set without movableBetween".into());
        }
        let Some(list) = &params.shared_with else {
            return match &params.shared_paths {
                Some(_) => Err("sharedPaths is set without sharedWith: name the members that share the storage in sharedWith".into()),
                None => Ok(None),
            };
        };
        if list.len() > MAX_LIST {
            return Err(format!(
                "sharedWith is {} bytes long, more than {MAX_LIST}",
                list.len()
            ));
        }
        let mut members = BTreeSet::new();
        for m in list.split(',').map(str::trim) {
            if m.is_empty() {
                return Err(format!("sharedWith {list:?} has an empty member name"));
            }
            if !members.insert(m.to_string()) {
                return Err(format!("sharedWith {list:?} names member {m:?} twice"));
            }
        }
        if members.len() < 2 {
            return Err(format!(
                "sharedWith {list:?} names one member; storage is shared by two or more (drop the parameter for storage of one member)"
            ));
        }
        let mut mounts = BTreeMap::new();
        if let Some(paths) = &params.shared_paths {
            if paths.len() > MAX_LIST {
                return Err(format!(
                    "sharedPaths is {} bytes long, more than {MAX_LIST}",
                    paths.len()
                ));
            }
            for pair in paths.split(',').map(str::trim) {
                let Some((m, p)) = pair.split_once('=') else {
                    return Err(format!("sharedPaths entry {pair:?} is not member=/path"));
                };
                let (m, p) = (m.trim(), p.trim());
                if !members.contains(m) {
                    return Err(format!(
                        "sharedPaths names member {m:?}, which sharedWith {list:?} does not list"
                    ));
                }
                let path = clean_absolute(p).ok_or_else(|| {
                    format!("sharedPaths: {p:?} of member {m} is not a plain absolute path other than / (no . or .. components)")
                })?;
                if mounts.insert(m.to_string(), path).is_some() {
                    return Err(format!("sharedPaths names member {m:?} twice"));
                }
            }
            if let Some(missing) = members.iter().find(|m| !mounts.contains_key(*m)) {
                return Err(format!(
                    "sharedPaths gives no path for member {missing:?}: name every member of sharedWith, or none (the same path everywhere)"
                ));
            }
        }
        Ok(Some(Sharing {
            members,
            mounts,
            classes: BTreeMap::new(),
        }))
    }

    fn movable(params: &VolumeParams, list: &str) -> Result<Sharing, String> {
        if params.shared_with.is_some() || params.shared_paths.is_some() {
            return Err("movableBetween and sharedWith/sharedPaths exclude each other: members either share the storage or the data moves between them".into());
        }
        if list.len() > MAX_LIST {
            return Err(format!(
                "movableBetween is {} bytes long, more than {MAX_LIST}",
                list.len()
            ));
        }
        let mut classes = BTreeMap::new();
        for pair in list.split(',').map(str::trim) {
            let Some((m, c)) = pair.split_once('=').map(|(m, c)| (m.trim(), c.trim())) else {
                return Err(format!(
                    "movableBetween entry {pair:?} is not member=storageclass"
                ));
            };
            if m.is_empty() || c.is_empty() {
                return Err(format!(
                    "movableBetween entry {pair:?} has an empty member or class name"
                ));
            }
            if classes.insert(m.to_string(), c.to_string()).is_some() {
                return Err(format!("movableBetween {list:?} names member {m:?} twice"));
            }
        }
        if classes.len() < 2 {
            return Err(format!("movableBetween {list:?} names fewer than two members: a volume moves between two or more"));
        }
        if params.member_storage_class.is_some() {
            return Err(
                "memberStorageClass is set with movableBetween, which names each member's class"
                    .into(),
            );
        }
        Ok(Sharing {
            members: classes.keys().cloned().collect(),
            mounts: BTreeMap::new(),
            classes,
        })
    }

    /// Whether the members share nothing and the data moves.
    pub fn moves(&self) -> bool {
        !self.classes.is_empty()
    }

    /// The StorageClass a movable volume's claim gets in `member`.
    pub fn class_in(&self, member: &str) -> Option<&str> {
        self.classes.get(member).map(String::as_str)
    }

    pub fn includes(&self, member: &str) -> bool {
        self.members.contains(member)
    }

    pub fn members(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(String::as_str)
    }

    /// Where member `to` reaches the directory member `from` names `path`:
    /// the same place under `to`'s mount. Refused for a path outside
    /// `from`'s mount, which is no data of the shared storage.
    pub fn translate(&self, path: &str, from: &str, to: &str) -> Result<String, String> {
        let clean = clean_absolute(path)
            .ok_or_else(|| format!("path {path:?} is not a plain absolute path"))?;
        let (Some(from_mount), Some(to_mount)) = (self.mounts.get(from), self.mounts.get(to))
        else {
            if self.mounts.is_empty() {
                return Ok(clean.display().to_string());
            }
            return Err(format!(
                "sharedPaths names no path for member {from} or {to}"
            ));
        };
        let rest = clean.strip_prefix(from_mount).map_err(|_| {
            format!(
                "{path:?} is not under {}, where sharedPaths says member {from}'s nodes mount the shared storage: it is not on the shared storage",
                from_mount.display()
            )
        })?;
        if rest.as_os_str().is_empty() {
            return Err(format!(
                "{path:?} is the mount of the shared storage itself in member {from}, not a volume's directory under it"
            ));
        }
        Ok(to_mount.join(rest).display().to_string())
    }
}

/// `p` as an absolute path of plain components, not `/` itself.
fn clean_absolute(p: &str) -> Option<PathBuf> {
    let path = Path::new(p);
    let mut out = PathBuf::from("/");
    let mut parts = 0;
    for c in path.components() {
        match c {
            Component::RootDir if parts == 0 => {}
            Component::Normal(n) => {
                out.push(n);
                parts += 1;
            }
            _ => return None,
        }
    }
    (path.is_absolute() && parts > 0 && !p.contains('\0')).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(with: Option<&str>, paths: Option<&str>) -> VolumeParams {
        VolumeParams {
            shared_with: with.map(str::to_string),
            shared_paths: paths.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn movable_classes_name_a_class_per_member_and_exclude_sharing() {
        let p = |between: &str| VolumeParams {
            movable_between: Some(between.into()),
            ..Default::default()
        };
        let s = Sharing::of(&p("east=fast, west = local")).unwrap().unwrap();
        assert!(s.moves() && s.includes("west"));
        assert_eq!(s.class_in("west"), Some("local"));
        assert_eq!(s.members().collect::<Vec<_>>(), ["east", "west"]);
        for (bad, why) in [
            ("east=fast", "fewer than two"),
            ("east,west", "not member=storageclass"),
            ("east=a,east=b", "twice"),
            ("east=,west=b", "empty"),
        ] {
            let err = Sharing::of(&p(bad)).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let both = VolumeParams {
            shared_with: Some("east,west".into()),
            ..p("east=a,west=b")
        };
        assert!(Sharing::of(&both)
            .unwrap_err()
            .contains("exclude each other"));
        assert!(!Sharing::of(&params(Some("east,west"), None))
            .unwrap()
            .unwrap()
            .moves());
    }

    #[test]
    fn no_sharing_without_shared_with() {
        assert_eq!(Sharing::of(&params(None, None)), Ok(None));
        let err = Sharing::of(&params(None, Some("a=/x"))).unwrap_err();
        assert!(err.contains("without sharedWith"), "{err}");
    }

    #[test]
    fn members_are_listed_once_and_at_least_two() {
        let s = Sharing::of(&params(Some(" east , west"), None))
            .unwrap()
            .unwrap();
        assert_eq!(s.members().collect::<Vec<_>>(), ["east", "west"]);
        assert!(s.includes("west") && !s.includes("north"));
        for (bad, why) in [
            ("east", "names one member"),
            ("east,,west", "empty member"),
            ("east,west,east", "twice"),
        ] {
            let err = Sharing::of(&params(Some(bad), None)).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn paths_name_every_member_with_clean_absolute_paths() {
        let ok = Sharing::of(&params(
            Some("east,west"),
            Some("east=/mnt/a, west=/srv/b/"),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            ok.translate("/mnt/a/vols/pvc-1", "east", "west").unwrap(),
            "/srv/b/vols/pvc-1"
        );
        for (bad, why) in [
            ("east=/mnt/a", "no path for member \"west\""),
            ("east=/mnt/a,west=/mnt/../etc", "plain absolute path"),
            ("east=/mnt/a,west=relative", "plain absolute path"),
            ("east=/mnt/a,west=/", "plain absolute path"),
            ("east=/mnt/a,west=/b,north=/c", "does not list"),
            ("east=/mnt/a,east=/b,west=/c", "twice"),
            ("east:/mnt/a", "member=/path"),
        ] {
            let err = Sharing::of(&params(Some("east,west"), Some(bad))).unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn translation_stays_on_the_shared_storage() {
        let s = Sharing::of(&params(Some("east,west"), Some("east=/mnt/a,west=/srv/b")))
            .unwrap()
            .unwrap();
        for (path, why) in [
            ("/mnt/ab/x", "not under /mnt/a"),
            ("/etc/x", "not under /mnt/a"),
            ("/mnt/a/../../etc", "not a plain absolute path"),
            ("/mnt/a", "mount of the shared storage itself"),
            ("mnt/a/x", "not a plain absolute path"),
        ] {
            let err = s.translate(path, "east", "west").unwrap_err();
            assert!(err.contains(why), "{path}: {err}");
        }
        let same = Sharing::of(&params(Some("east,west"), None))
            .unwrap()
            .unwrap();
        assert_eq!(
            same.translate("/data/x/", "east", "west").unwrap(),
            "/data/x"
        );
        assert!(same.translate("/data/../x", "east", "west").is_err());
    }
}
