//! What one member cluster shows of the relay's volumes, indexed so that a
//! change to one member object names the volumes it concerns and a
//! volume's state is computed from a few lookups (no scan of the member).
//!
//! Per member node that has anything to do with a relay claim:
//! - NODE_READY: the bound PV is attached there (a VolumeAttachment with
//!   `status.attached`), or a pod using the claim is scheduled there;
//! - VOL_READY: the node's `status.volumesInUse` lists it (kubelet's
//!   global mount is done);
//! - PUBLISHED: a pod using the claim runs there.
//!
//! Only what those rules read is kept: the relay's claims, the PVs they are
//! bound to, every attachment's (PV, node, attached), every node's in-use
//! list, and the pods that use a claim, in the namespaces of relay claims.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::domain::volume::Phase;
use crate::k8s::name_set::NameSet;

/// An object's namespace (empty for cluster-scoped kinds) and name.
pub type Key = (String, String);

/// A relay claim in the member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub volume_id: String,
    pub uid: Option<String>,
    /// `spec.volumeName`: the PV it is bound to.
    pub volume_name: Option<String>,
}

/// The PV a relay claim is bound to, as far as the states need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundVolume {
    /// `spec.claimRef`: namespace, name, uid.
    pub claim: Option<(Key, Option<String>)>,
    /// How kubelet names it in `status.volumesInUse`.
    pub in_use: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub pv: Option<String>,
    pub node: String,
    pub attached: bool,
}

/// A pod that uses claims (pods with none are not kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUse {
    pub node: Option<String>,
    pub running: bool,
    pub claims: Vec<String>,
}

/// One member node's state for one relay volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberNodeState {
    pub node: String,
    pub phase: Phase,
    /// namespace/name of the member pods using the claim there.
    pub pods: Vec<String>,
}

/// Volume ids whose state may have changed.
pub type Dirty = BTreeSet<String>;

#[derive(Default)]
pub struct MemberView {
    claims: HashMap<Key, Claim>,
    /// Every relay claim of a volume in this member: a gated volume has
    /// its data claim and, while a node of the member is attached, its
    /// access claim, which the pods use.
    by_id: HashMap<String, BTreeSet<Key>>,
    by_pv: HashMap<String, Key>,
    namespaces: BTreeMap<String, usize>,
    /// PVs some claim is bound to, and not yet read.
    unresolved: BTreeSet<String>,
    pvs: HashMap<String, BoundVolume>,
    by_in_use: HashMap<String, String>,
    attachments: HashMap<String, Attachment>,
    attached_to: HashMap<String, NameSet>,
    nodes: HashMap<String, BTreeSet<String>>,
    listed_by: HashMap<String, NameSet>,
    pods: HashMap<Key, PodUse>,
    users: HashMap<Key, NameSet>,
}

fn unindex(index: &mut HashMap<String, NameSet>, key: &str, value: &str) {
    if let Some(set) = index.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            index.remove(key);
        }
    }
}

fn cluster_keys<'a>(names: impl Iterator<Item = &'a String>) -> Vec<Key> {
    names.map(|n| (String::new(), n.clone())).collect()
}

impl MemberView {
    fn touch_claim(&self, key: &Key, dirty: &mut Dirty) {
        if let Some(c) = self.claims.get(key) {
            dirty.insert(c.volume_id.clone());
        }
    }

    fn touch_pv(&self, pv: &str, dirty: &mut Dirty) {
        if let Some(key) = self.by_pv.get(pv) {
            self.touch_claim(key, dirty);
        }
    }

    fn touch_in_use(&self, name: &str, dirty: &mut Dirty) {
        if let Some(pv) = self.by_in_use.get(name) {
            self.touch_pv(pv, dirty);
        }
    }

    /// The namespaces that hold relay claims: where pods are watched.
    pub fn namespaces(&self) -> impl Iterator<Item = &String> {
        self.namespaces.keys()
    }

    /// PVs relay claims are bound to that were not read yet.
    pub fn unresolved(&self) -> impl ExactSizeIterator<Item = &String> {
        self.unresolved.iter()
    }

    pub fn claim_count(&self) -> usize {
        self.claims.len()
    }

    pub fn set_claim(&mut self, key: Key, claim: Option<Claim>, dirty: &mut Dirty) {
        if let Some(old) = self.claims.remove(&key) {
            dirty.insert(old.volume_id.clone());
            if let Some(keys) = self.by_id.get_mut(&old.volume_id) {
                keys.remove(&key);
                if keys.is_empty() {
                    self.by_id.remove(&old.volume_id);
                }
            }
            // The same claim still bound to the same PV (any other update
            // of it): what was read of the PV still holds.
            let same_binding = claim
                .as_ref()
                .is_some_and(|new| new.volume_name == old.volume_name && new.uid == old.uid);
            if let Some(pv) = old.volume_name.as_ref().filter(|_| !same_binding) {
                if self.by_pv.get(pv) == Some(&key) {
                    self.by_pv.remove(pv);
                    self.unresolved.remove(pv);
                    if let Some(gone) = self.pvs.remove(pv) {
                        if let Some(name) = gone.in_use {
                            self.by_in_use.remove(&name);
                        }
                    }
                }
            }
            if let Some(n) = self.namespaces.get_mut(&key.0) {
                *n -= 1;
                if *n == 0 {
                    self.namespaces.remove(&key.0);
                }
            }
        }
        let Some(claim) = claim else {
            return;
        };
        dirty.insert(claim.volume_id.clone());
        self.by_id
            .entry(claim.volume_id.clone())
            .or_default()
            .insert(key.clone());
        if let Some(pv) = &claim.volume_name {
            self.by_pv.insert(pv.clone(), key.clone());
            if !self.pvs.contains_key(pv) {
                self.unresolved.insert(pv.clone());
            }
        }
        *self.namespaces.entry(key.0.clone()).or_default() += 1;
        self.claims.insert(key, claim);
    }

    /// What reading PV `name` found. Ignored when no claim is bound to it
    /// (any more). Returns whether it is settled: `false` when it does not
    /// exist (yet) or is not (yet) bound to that claim, to be read again
    /// later (what the states read of a PV changes no more once it is).
    pub fn set_pv(&mut self, name: &str, pv: Option<BoundVolume>, dirty: &mut Dirty) -> bool {
        let Some(key) = self.by_pv.get(name) else {
            return true;
        };
        let claim_uid = self.claims.get(key).and_then(|c| c.uid.as_ref());
        let settled = pv.as_ref().is_some_and(|pv| {
            pv.claim.as_ref().is_some_and(|(bound, uid)| {
                bound == key
                    && match (uid, claim_uid) {
                        (Some(a), Some(b)) => a == b,
                        _ => true,
                    }
            })
        });
        if let Some(old) = self.pvs.remove(name) {
            if let Some(in_use) = old.in_use {
                self.by_in_use.remove(&in_use);
            }
        }
        if let Some(pv) = pv {
            if let Some(in_use) = &pv.in_use {
                self.by_in_use.insert(in_use.clone(), name.to_string());
            }
            self.pvs.insert(name.to_string(), pv);
        }
        if settled {
            self.unresolved.remove(name);
        } else {
            self.unresolved.insert(name.to_string());
        }
        self.touch_pv(name, dirty);
        settled
    }

    pub fn set_attachment(&mut self, name: &str, va: Option<Attachment>, dirty: &mut Dirty) {
        if let Some(old) = self.attachments.remove(name) {
            if let Some(pv) = &old.pv {
                unindex(&mut self.attached_to, pv, name);
                self.touch_pv(pv, dirty);
            }
        }
        let Some(va) = va else {
            return;
        };
        if let Some(pv) = &va.pv {
            self.attached_to.entry(pv.clone()).or_default().insert(name);
            self.touch_pv(pv, dirty);
        }
        self.attachments.insert(name.to_string(), va);
    }

    /// A node's `status.volumesInUse` (`None`: the node is gone).
    pub fn set_node(&mut self, name: &str, in_use: Option<BTreeSet<String>>, dirty: &mut Dirty) {
        let old = self.nodes.remove(name).unwrap_or_default();
        let new = in_use.unwrap_or_default();
        for gone in old.difference(&new) {
            unindex(&mut self.listed_by, gone, name);
            self.touch_in_use(gone, dirty);
        }
        for added in new.difference(&old) {
            self.listed_by
                .entry(added.clone())
                .or_default()
                .insert(name);
            self.touch_in_use(added, dirty);
        }
        if !new.is_empty() {
            self.nodes.insert(name.to_string(), new);
        }
    }

    pub fn set_pod(&mut self, key: Key, pod: Option<PodUse>, dirty: &mut Dirty) {
        let (namespace, name) = &key;
        if let Some(old) = self.pods.remove(&key) {
            for claim in &old.claims {
                let claim = (namespace.clone(), claim.clone());
                if let Some(set) = self.users.get_mut(&claim) {
                    set.remove(name);
                    if set.is_empty() {
                        self.users.remove(&claim);
                    }
                }
                self.touch_claim(&claim, dirty);
            }
        }
        let Some(pod) = pod.filter(|p| !p.claims.is_empty()) else {
            return;
        };
        for claim in &pod.claims {
            let claim = (namespace.clone(), claim.clone());
            self.users.entry(claim.clone()).or_default().insert(name);
            self.touch_claim(&claim, dirty);
        }
        self.pods.insert(key, pod);
    }

    /// The keys of each kind, for a watch that listed its objects again:
    /// those not in the new listing are gone.
    pub fn claim_keys(&self) -> Vec<Key> {
        self.claims.keys().cloned().collect()
    }

    /// Cluster-scoped kinds: no namespace.
    pub fn attachment_keys(&self) -> Vec<Key> {
        cluster_keys(self.attachments.keys())
    }

    pub fn node_keys(&self) -> Vec<Key> {
        cluster_keys(self.nodes.keys())
    }

    /// The pods kept in `namespace` ("": in all).
    pub fn pod_keys_in(&self, namespace: &str) -> Vec<Key> {
        self.pods
            .keys()
            .filter(|(ns, _)| namespace.is_empty() || ns == namespace)
            .cloned()
            .collect()
    }

    /// The member nodes' states of volume `id`; `None` when no relay claim
    /// in this member carries it.
    pub fn state_of(&self, id: &str) -> Option<Vec<MemberNodeState>> {
        let keys = self.by_id.get(id)?;
        let mut raised: Vec<(&str, Phase, Option<String>)> = Vec::new();
        for key in keys {
            self.raise(key, &mut raised);
        }
        let mut states: BTreeMap<&str, (Phase, BTreeSet<String>)> = BTreeMap::new();
        for (node, phase, pod) in raised {
            let entry = states.entry(node).or_insert((phase, BTreeSet::new()));
            entry.0 = entry.0.max(phase);
            entry.1.extend(pod);
        }
        Some(
            states
                .into_iter()
                .map(|(node, (phase, pods))| MemberNodeState {
                    node: node.to_string(),
                    phase,
                    pods: pods.into_iter().collect(),
                })
                .collect(),
        )
    }

    /// What claim `key` says of its member nodes: attached, in use, and the
    /// pods on it.
    fn raise<'a>(&'a self, key: &'a Key, raised: &mut Vec<(&'a str, Phase, Option<String>)>) {
        let Some(claim) = self.claims.get(key) else {
            return;
        };
        // Only a PV that really is bound to this claim counts.
        let pv = claim.volume_name.as_deref().and_then(|name| {
            let pv = self.pvs.get(name)?;
            let ((ns, n), uid) = pv.claim.as_ref()?;
            let uid_matches = match (uid, &claim.uid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            };
            (ns == &key.0 && n == &key.1 && uid_matches).then_some((name, pv))
        });
        if let Some((name, pv)) = pv {
            for va in self.attached_to.get(name).into_iter().flatten() {
                if let Some(a) = self.attachments.get(va).filter(|a| a.attached) {
                    raised.push((&a.node, Phase::NodeReady, None));
                }
            }
            let listing = pv.in_use.as_ref().and_then(|n| self.listed_by.get(n));
            for node in listing.into_iter().flatten() {
                raised.push((node, Phase::VolReady, None));
            }
        }
        for pod_name in self.users.get(key).into_iter().flatten() {
            let pod_key = (key.0.clone(), pod_name.clone());
            let Some(pod) = self.pods.get(&pod_key) else {
                continue;
            };
            let Some(node) = pod.node.as_deref() else {
                continue;
            };
            let phase = if pod.running {
                Phase::Published
            } else {
                Phase::NodeReady
            };
            raised.push((node, phase, Some(format!("{}/{pod_name}", key.0))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_string(), name.to_string())
    }

    fn claim(id: &str, pv: Option<&str>) -> Claim {
        Claim {
            volume_id: id.into(),
            uid: Some(format!("uid-{id}")),
            volume_name: pv.map(Into::into),
        }
    }

    fn bound(ns: &str, name: &str, uid: &str, handle: &str) -> BoundVolume {
        BoundVolume {
            claim: Some((key(ns, name), Some(uid.into()))),
            in_use: Some(format!("kubernetes.io/csi/hostpath.csi.k8s.io^{handle}")),
        }
    }

    fn pod(node: Option<&str>, running: bool, claims: &[&str]) -> PodUse {
        PodUse {
            node: node.map(Into::into),
            running,
            claims: claims.iter().map(|c| c.to_string()).collect(),
        }
    }

    fn states(view: &MemberView, id: &str) -> Vec<(String, Phase, Vec<String>)> {
        view.state_of(id)
            .unwrap()
            .into_iter()
            .map(|s| (s.node, s.phase, s.pods))
            .collect()
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_volume_walks_from_attached_to_published() {
        let mut v = MemberView::default();
        let mut dirty = Dirty::new();
        v.set_claim(
            key("shop", "pvc3"),
            Some(claim("v1", Some("pv-1"))),
            &mut dirty,
        );
        assert_eq!(v.unresolved().collect::<Vec<_>>(), ["pv-1"]);
        v.set_pv(
            "pv-1",
            Some(bound("shop", "pvc3", "uid-v1", "h1")),
            &mut dirty,
        );
        assert_eq!(v.unresolved().count(), 0);
        assert!(states(&v, "v1").is_empty());
        let va = |node: &str, attached: bool| Attachment {
            pv: Some("pv-1".into()),
            node: node.into(),
            attached,
        };
        // An attachment still attaching is nothing yet.
        v.set_attachment("va-n1", Some(va("n1", false)), &mut dirty);
        assert!(states(&v, "v1").is_empty());
        v.set_attachment("va-n1", Some(va("n1", true)), &mut dirty);
        assert_eq!(states(&v, "v1"), [("n1".into(), Phase::NodeReady, vec![])]);
        let in_use = "kubernetes.io/csi/hostpath.csi.k8s.io^h1";
        v.set_node(
            "n1",
            Some(set(&[in_use, "kubernetes.io/csi/other^x"])),
            &mut dirty,
        );
        v.set_pod(
            key("shop", "web-0"),
            Some(pod(Some("n1"), false, &["pvc3"])),
            &mut dirty,
        );
        assert_eq!(
            states(&v, "v1"),
            [("n1".into(), Phase::VolReady, vec!["shop/web-0".to_string()])]
        );
        // Pods of other claims or namespaces do not count.
        v.set_pod(
            key("shop", "x"),
            Some(pod(Some("n2"), true, &["other"])),
            &mut dirty,
        );
        v.set_pod(
            key("elsewhere", "y"),
            Some(pod(Some("n2"), true, &["pvc3"])),
            &mut dirty,
        );
        v.set_pod(
            key("shop", "web-0"),
            Some(pod(Some("n1"), true, &["pvc3"])),
            &mut dirty,
        );
        assert_eq!(
            states(&v, "v1"),
            [(
                "n1".into(),
                Phase::Published,
                vec!["shop/web-0".to_string()]
            )]
        );
        // An unscheduled pod names no node.
        v.set_pod(
            key("shop", "web-1"),
            Some(pod(None, false, &["pvc3"])),
            &mut dirty,
        );
        assert_eq!(states(&v, "v1").len(), 1);
        // And back down: the pod goes, the node stops listing it, the
        // attachment goes.
        v.set_pod(key("shop", "web-0"), None, &mut dirty);
        assert_eq!(states(&v, "v1"), [("n1".into(), Phase::VolReady, vec![])]);
        v.set_node("n1", Some(set(&[])), &mut dirty);
        assert_eq!(states(&v, "v1"), [("n1".into(), Phase::NodeReady, vec![])]);
        v.set_attachment("va-n1", None, &mut dirty);
        assert!(states(&v, "v1").is_empty());
        v.set_claim(key("shop", "pvc3"), None, &mut dirty);
        assert!(v.state_of("v1").is_none());
        assert_eq!(v.namespaces().count(), 0);
    }

    // A gated volume in its origin: the data claim no pod uses, and the
    // access claim the pods use. Each counts; either may come and go, and
    // updates of one never hide the other.
    #[test]
    fn every_claim_of_a_volume_in_a_member_counts() {
        let mut v = MemberView::default();
        let mut dirty = Dirty::new();
        v.set_claim(
            key("shop", "relay-0a1b"),
            Some(claim("v1", Some("pv-data"))),
            &mut dirty,
        );
        v.set_claim(
            key("shop", "data"),
            Some(claim("v1", Some("relay-0a1b-import"))),
            &mut dirty,
        );
        v.set_pod(
            key("shop", "web-0"),
            Some(pod(Some("n1"), true, &["data"])),
            &mut dirty,
        );
        let published = [(
            "n1".to_string(),
            Phase::Published,
            vec!["shop/web-0".to_string()],
        )];
        assert_eq!(states(&v, "v1"), published);
        // The data claim updated after the access claim: still seen.
        v.set_claim(
            key("shop", "relay-0a1b"),
            Some(claim("v1", Some("pv-data"))),
            &mut dirty,
        );
        assert_eq!(states(&v, "v1"), published);
        // The access claim goes (unpublish): the volume stays known, unused.
        v.set_pod(key("shop", "web-0"), None, &mut dirty);
        v.set_claim(key("shop", "data"), None, &mut dirty);
        assert!(states(&v, "v1").is_empty());
        assert_eq!(v.namespaces().count(), 1);
        v.set_claim(key("shop", "relay-0a1b"), None, &mut dirty);
        assert!(v.state_of("v1").is_none());
        assert!(v.by_id.is_empty());
    }

    // Any other update of a bound claim (its status, an annotation) keeps
    // what was read of its PV: no second read, no state lost meanwhile. A
    // claim made again under the same name is another binding.
    #[test]
    fn a_claim_update_keeps_its_pv() {
        let mut v = MemberView::default();
        let mut dirty = Dirty::new();
        v.set_claim(
            key("shop", "pvc3"),
            Some(claim("v1", Some("pv-1"))),
            &mut dirty,
        );
        assert!(v.set_pv(
            "pv-1",
            Some(bound("shop", "pvc3", "uid-v1", "h1")),
            &mut dirty
        ));
        let in_use = "kubernetes.io/csi/hostpath.csi.k8s.io^h1";
        v.set_node("n1", Some(set(&[in_use])), &mut dirty);
        let before = states(&v, "v1");
        assert_eq!(before, [("n1".into(), Phase::VolReady, vec![])]);
        v.set_claim(
            key("shop", "pvc3"),
            Some(claim("v1", Some("pv-1"))),
            &mut dirty,
        );
        assert_eq!(v.unresolved().count(), 0, "not read again");
        assert_eq!(states(&v, "v1"), before);
        let mut again = claim("v1", Some("pv-1"));
        again.uid = Some("uid-of-a-new-claim".into());
        v.set_claim(key("shop", "pvc3"), Some(again), &mut dirty);
        assert_eq!(v.unresolved().collect::<Vec<_>>(), ["pv-1"]);
        assert!(states(&v, "v1").is_empty());
    }

    // A change marks exactly the volumes it concerns.
    #[test]
    fn a_change_marks_only_the_volumes_it_concerns() {
        let mut v = MemberView::default();
        let mut dirty = Dirty::new();
        for i in 0..100 {
            let name = format!("pvc{i}");
            let pv = format!("pv-{i}");
            v.set_claim(
                key("shop", &name),
                Some(claim(&format!("v{i}"), Some(&pv))),
                &mut dirty,
            );
            v.set_pv(
                &pv,
                Some(bound("shop", &name, &format!("uid-v{i}"), &format!("h{i}"))),
                &mut dirty,
            );
        }
        let mut marked = |f: &mut dyn FnMut(&mut MemberView, &mut Dirty)| {
            let mut dirty = Dirty::new();
            f(&mut v, &mut dirty);
            dirty.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(
            marked(&mut |v, d| v.set_pod(
                key("shop", "p"),
                Some(pod(Some("n1"), true, &["pvc7"])),
                d
            )),
            ["v7"]
        );
        assert_eq!(
            marked(&mut |v, d| v.set_pod(
                key("shop", "q"),
                Some(pod(Some("n1"), true, &["nothing"])),
                d
            )),
            Vec::<String>::new()
        );
        assert_eq!(
            marked(&mut |v, d| v.set_attachment(
                "va",
                Some(Attachment {
                    pv: Some("pv-42".into()),
                    node: "n1".into(),
                    attached: true
                }),
                d
            )),
            ["v42"]
        );
        // The attachment moves to another PV: both volumes.
        assert_eq!(
            marked(&mut |v, d| v.set_attachment(
                "va",
                Some(Attachment {
                    pv: Some("pv-43".into()),
                    node: "n1".into(),
                    attached: true
                }),
                d
            )),
            ["v42", "v43"]
        );
        let in_use = |i: u32| format!("kubernetes.io/csi/hostpath.csi.k8s.io^h{i}");
        assert_eq!(
            marked(&mut |v, d| v.set_node(
                "n1",
                Some(set(&[&in_use(3), &in_use(5), "foreign"])),
                d
            )),
            ["v3", "v5"]
        );
        // A heartbeat with the same list marks nothing.
        assert_eq!(
            marked(&mut |v, d| v.set_node(
                "n1",
                Some(set(&[&in_use(5), &in_use(3), "foreign"])),
                d
            )),
            Vec::<String>::new()
        );
        assert_eq!(
            marked(&mut |v, d| v.set_node("n1", Some(set(&[&in_use(5)])), d)),
            ["v3"]
        );
        assert_eq!(marked(&mut |v, d| v.set_node("n1", None, d)), ["v5"]);
    }

    // The member's objects arrive in any order: a claim met after its pods
    // and attachment still sees them, and a PV bound to someone else (a
    // claim of the same name deleted and made again) counts for nothing.
    #[test]
    fn objects_met_in_any_order_meet_in_the_state() {
        let mut v = MemberView::default();
        let mut dirty = Dirty::new();
        v.set_pod(
            key("shop", "web-0"),
            Some(pod(Some("n1"), true, &["pvc3"])),
            &mut dirty,
        );
        v.set_attachment(
            "va",
            Some(Attachment {
                pv: Some("pv-1".into()),
                node: "n2".into(),
                attached: true,
            }),
            &mut dirty,
        );
        assert!(dirty.is_empty(), "nothing relay-made yet: {dirty:?}");
        v.set_claim(
            key("shop", "pvc3"),
            Some(claim("v1", Some("pv-1"))),
            &mut dirty,
        );
        assert_eq!(
            states(&v, "v1"),
            [(
                "n1".into(),
                Phase::Published,
                vec!["shop/web-0".to_string()]
            )]
        );
        assert!(!v.set_pv(
            "pv-1",
            Some(bound("shop", "pvc3", "uid-of-an-older-claim", "h1")),
            &mut dirty,
        ));
        assert_eq!(
            states(&v, "v1").len(),
            1,
            "another claim's PV is not this one's"
        );
        assert_eq!(
            v.unresolved().collect::<Vec<_>>(),
            ["pv-1"],
            "read again later"
        );
        assert!(v.set_pv(
            "pv-1",
            Some(bound("shop", "pvc3", "uid-v1", "h1")),
            &mut dirty,
        ));
        assert_eq!(
            states(&v, "v1"),
            [
                (
                    "n1".into(),
                    Phase::Published,
                    vec!["shop/web-0".to_string()]
                ),
                ("n2".into(), Phase::NodeReady, vec![])
            ]
        );
        // A PV read for a claim that is gone by then is not kept.
        v.set_claim(key("shop", "pvc3"), None, &mut dirty);
        v.set_pv(
            "pv-1",
            Some(bound("shop", "pvc3", "uid-v1", "h1")),
            &mut dirty,
        );
        assert_eq!(v.unresolved().count(), 0);
        assert!(v.pvs.is_empty() && v.by_in_use.is_empty() && v.by_pv.is_empty());
        // A PV that does not exist (yet) stays to be read.
        v.set_claim(
            key("shop", "pvc4"),
            Some(claim("v2", Some("pv-2"))),
            &mut dirty,
        );
        assert!(!v.set_pv("pv-2", None, &mut dirty));
        assert_eq!(v.unresolved().collect::<Vec<_>>(), ["pv-2"]);
    }

    // Pods that use no claim are not kept, and removing everything leaves
    // no index entry behind.
    #[test]
    fn nothing_is_kept_that_concerns_no_volume() {
        let mut v = MemberView::default();
        let mut dirty = Dirty::new();
        v.set_pod(
            key("shop", "plain"),
            Some(pod(Some("n1"), true, &[])),
            &mut dirty,
        );
        assert!(v.pods.is_empty());
        v.set_node("n1", Some(set(&[])), &mut dirty);
        assert!(v.nodes.is_empty());
        v.set_claim(
            key("shop", "pvc3"),
            Some(claim("v1", Some("pv-1"))),
            &mut dirty,
        );
        v.set_pv(
            "pv-1",
            Some(bound("shop", "pvc3", "uid-v1", "h1")),
            &mut dirty,
        );
        v.set_pod(
            key("shop", "web-0"),
            Some(pod(Some("n1"), true, &["pvc3"])),
            &mut dirty,
        );
        v.set_node(
            "n1",
            Some(set(&["kubernetes.io/csi/hostpath.csi.k8s.io^h1"])),
            &mut dirty,
        );
        v.set_attachment(
            "va",
            Some(Attachment {
                pv: Some("pv-1".into()),
                node: "n1".into(),
                attached: true,
            }),
            &mut dirty,
        );
        v.set_pod(key("shop", "web-0"), None, &mut dirty);
        v.set_node("n1", None, &mut dirty);
        v.set_attachment("va", None, &mut dirty);
        v.set_claim(key("shop", "pvc3"), None, &mut dirty);
        assert!(v.claims.is_empty() && v.by_id.is_empty() && v.by_pv.is_empty());
        assert!(v.pvs.is_empty() && v.by_in_use.is_empty() && v.unresolved.is_empty());
        assert!(v.attachments.is_empty() && v.attached_to.is_empty());
        assert!(v.nodes.is_empty() && v.listed_by.is_empty());
        assert!(v.pods.is_empty() && v.users.is_empty() && v.namespaces.is_empty());
    }
}
