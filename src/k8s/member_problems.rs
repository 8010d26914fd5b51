//! What a member says of a relay claim it does not provision, shown in the
//! host within seconds.
//!
//! A member claim whose class waits for a consumer is made, and the host
//! claim bound, before the member provisions anything: its provisioner
//! starts once the member's scheduler picks a node for the pod, and may
//! then fail (no topology, no capacity). That failure is the member's
//! Warning event on the claim; nothing in the host would say it, and the
//! pod on the virtual node would wait with no word. So each member's
//! Warning events on claims are watched (by field selector, so only those
//! come), and one on a relay claim that is not bound is shown:
//! - as the volume's `status.lastError` (LAST-ERROR, `csi-relay check`'s
//!   volume line), with the field manager the controller's own failure
//!   notes use;
//! - as a Warning Event on the host claim (`kubectl describe pvc`).
//!
//! Once the member claim binds (or goes), the LAST-ERROR it caused is
//! cleared, unless a call has written another since.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::Api;
use kube::runtime::events::{Event as Report, EventType, Recorder, Reporter};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;

use crate::k8s::cluster::Cluster;
use crate::k8s::member_view::Key;
use crate::k8s::naming;
use crate::k8s::relay_volume::{apply_last_error, member_word, object_name, view_key, View};
use crate::k8s::CALL_TIMEOUT;

/// How often the claims behind a shown problem are looked at again.
const RECHECK: Duration = Duration::from_secs(5);
/// Claims found not to be the relay's, remembered so that their warnings
/// cost no read; forgotten all at once past this many.
const FOREIGN_KEPT: usize = 4096;
/// Longest text of the member's own words carried into the host.
pub const MEMBER_WORDS: usize = 512;

/// One Warning event of a member claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub claim: Key,
    pub uid: Option<String>,
    /// `Reason: message`.
    pub said: String,
}

impl Warning {
    fn of(event: &Event) -> Option<Warning> {
        let about = &event.involved_object;
        if about.kind.as_deref() != Some("PersistentVolumeClaim") {
            return None;
        }
        Some(Warning {
            claim: (about.namespace.clone()?, about.name.clone()?),
            uid: about.uid.clone(),
            said: said(event),
        })
    }
}

/// What a member event says, as `Reason: message`, bounded in length.
pub fn said(event: &Event) -> String {
    crate::k8s::shortened(
        format!(
            "{}: {}",
            event.reason.as_deref().unwrap_or("Warning"),
            event.message.as_deref().unwrap_or("").trim()
        ),
        MEMBER_WORDS,
    )
}

/// Watches member `member`'s claim warnings for as long as the controller
/// leads (the task ends with the process).
pub fn spawn(member: String, watch_client: kube::Client, host: Cluster, seen: View) {
    let api = Api::<Event>::all(watch_client.clone());
    let config =
        watcher::Config::default().fields("type=Warning,involvedObject.kind=PersistentVolumeClaim");
    let mut problems = Problems::new(member, watch_client, host, seen);
    tokio::spawn(async move {
        let mut events = Box::pin(
            watcher::watcher(api, config)
                .default_backoff()
                .applied_objects(),
        );
        let mut tick = tokio::time::interval(RECHECK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        if let Some(w) = Warning::of(&event) {
                            problems.warned(w).await;
                        }
                    }
                    Some(Err(e)) => tracing::debug!(member = %problems.member, error = %e, "member event watch interrupted; resuming"),
                    None => return,
                },
                _ = tick.tick() => problems.recheck().await,
            }
        }
    });
}

pub struct Problems {
    member: String,
    client: kube::Client,
    host: Cluster,
    seen: View,
    recorder: Recorder,
    foreign: HashSet<Key>,
    /// Volume id → the claim and the text its LAST-ERROR shows.
    open: HashMap<String, (Key, String)>,
}

impl Problems {
    pub fn new(member: String, client: kube::Client, host: Cluster, seen: View) -> Self {
        let recorder = Recorder::new(
            host.client(),
            Reporter {
                controller: "csi-relay".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Problems {
            member,
            client,
            host,
            seen,
            recorder,
            foreign: HashSet::new(),
            open: HashMap::new(),
        }
    }

    async fn claim(
        &self,
        (namespace, name): &Key,
    ) -> Result<Option<PersistentVolumeClaim>, String> {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(CALL_TIMEOUT, api.get_opt(name)).await {
            Ok(Ok(claim)) => Ok(claim),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
        }
    }

    /// A member warning: shown if it concerns a relay claim not bound.
    pub async fn warned(&mut self, w: Warning) {
        // Not the relay's, or shown already (the member repeats a warning
        // as its provisioner retries): no read of the claim.
        let shown = |(claim, text): &(Key, String)| *claim == w.claim && text.ends_with(&w.said);
        if self.foreign.contains(&w.claim) || self.open.values().any(shown) {
            return;
        }
        let claim = match self.claim(&w.claim).await {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(member = %self.member, claim = ?w.claim, error = %e, "member claim of a warning not read");
                return;
            }
        };
        let ours = claim
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(naming::MANAGED_BY))
            .is_some_and(|v| v == naming::MANAGER);
        let id = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(naming::VOLUME_ID_ANNOTATION))
            .cloned();
        let Some(id) = id.filter(|_| ours) else {
            if self.foreign.len() >= FOREIGN_KEPT {
                self.foreign.clear();
            }
            self.foreign.insert(w.claim);
            return;
        };
        // An earlier claim of the same name, or one bound since: not news.
        if w.uid.is_some() && w.uid != claim.metadata.uid || bound(&claim) {
            return;
        }
        let (namespace, name) = &w.claim;
        let text = member_word(&self.member, namespace, name, &w.said);
        if self.open.get(&id).is_some_and(|(_, shown)| *shown == text) {
            return;
        }
        if let Err(e) = apply_last_error(&self.host, &id, Some(&text)).await {
            tracing::warn!(volume_id = %id, member = %self.member, error = %e, "cannot show the member's word on the RelayVolume; its next warning tries again");
            return;
        }
        tracing::warn!(volume_id = %id, member = %self.member, claim = %format!("{namespace}/{name}"), said = %w.said, "member claim not provisioned");
        self.open
            .insert(id.clone(), (w.claim.clone(), text.clone()));
        self.tell_host_claim(&id, &text).await;
    }

    /// A Warning Event on the host claim of volume `id`, where `kubectl
    /// describe` shows it. Best effort: LAST-ERROR holds the same.
    async fn tell_host_claim(&self, id: &str, text: &str) {
        let Some(host_pvc) = self
            .seen
            .get(&view_key(&object_name(id)))
            .and_then(|rv| rv.host_pvc.clone())
        else {
            return;
        };
        let Some((namespace, name)) = host_pvc.split_once('/') else {
            return;
        };
        let api = Api::<PersistentVolumeClaim>::namespaced(self.host.client(), namespace);
        let claim = match self
            .host
            .fetch(
                &format!("get PersistentVolumeClaim {host_pvc}"),
                api.get(name),
            )
            .await
        {
            Ok(Some(claim)) => claim,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(volume_id = %id, error = %e, "host claim not read for its event");
                return;
            }
        };
        let report = Report {
            type_: EventType::Warning,
            reason: "MemberProvisioningFailed".into(),
            note: Some(text.to_string()),
            action: "ProvisionMemberClaim".into(),
            secondary: None,
        };
        let published = tokio::time::timeout(
            CALL_TIMEOUT,
            self.recorder.publish(&report, &claim.object_ref(&())),
        )
        .await;
        if !matches!(published, Ok(Ok(()))) {
            tracing::debug!(volume_id = %id, "event on the host claim not published");
        }
    }

    /// Claims behind a shown problem that bound or went: their LAST-ERROR
    /// goes, unless a call wrote another since.
    pub async fn recheck(&mut self) {
        let open: Vec<(String, Key, String)> = self
            .open
            .iter()
            .map(|(id, (key, text))| (id.clone(), key.clone(), text.clone()))
            .collect();
        for (id, key, text) in open {
            let settled = match self.claim(&key).await {
                Ok(Some(claim)) => bound(&claim),
                Ok(None) => true,
                Err(_) => false,
            };
            if !settled {
                continue;
            }
            let shown = self
                .seen
                .get(&view_key(&object_name(&id)))
                .and_then(|rv| rv.status.clone())
                .and_then(|s| s.last_error);
            if shown.as_deref() == Some(text.as_str())
                && apply_last_error(&self.host, &id, None).await.is_err()
            {
                continue; // tried again at the next recheck
            }
            self.open.remove(&id);
        }
    }
}

fn bound(claim: &PersistentVolumeClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

#[cfg(test)]
#[path = "member_problems_tests.rs"]
mod tests;
