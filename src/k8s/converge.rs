//! Waiting, bounded in time, for one object to reach a state another
//! controller sets (a member VolumeAttachment attached, a member claim
//! Bound). A watch of that one object wakes the wait as soon as the other
//! controller writes, rather than at the next poll (the member attaches in
//! about 100 ms; a poll alone made every publish take at least
//! `POLL_INTERVAL`, on the pod's path); the poll stays as the fallback, so
//! a watch that cannot start, fails or is held by a partition only costs
//! speed.

use std::fmt::Debug;
use std::time::Duration;

use kube::api::{Api, WatchEvent, WatchParams};
use serde::de::DeserializeOwned;

use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::POLL_INTERVAL;

/// How a wait ended.
#[derive(Debug)]
pub enum Waited<K> {
    /// The object reached the state: as last seen.
    Reached(K),
    /// The time ran out: the object as last seen.
    TimedOut(K),
}

/// Waits up to `wait` for `current` (just read or made) to satisfy `done`.
/// An object deleted meanwhile is the error `gone` makes.
pub async fn until<K>(
    cluster: &Cluster,
    api: &Api<K>,
    current: K,
    wait: Duration,
    done: impl Fn(&K) -> bool,
    gone: impl Fn() -> CsiError,
) -> CsiResult<Waited<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let name = current.meta().name.clone().unwrap_or_default();
    let get_what = format!("get {} {name}", K::kind(&()));
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = watch_one(api, &name, &current, wait).await;
    let mut current = current;
    loop {
        if done(&current) {
            return Ok(Waited::Reached(current));
        }
        if tokio::time::Instant::now() + POLL_INTERVAL > deadline {
            return Ok(Waited::TimedOut(current));
        }
        // The watch hands over the changed object itself; a watch that
        // stays quiet says nothing changed; only without a watch is the
        // object read again.
        current = match next_change(&mut changes).await {
            Next::Changed(changed) => *changed,
            Next::Unchanged => continue,
            Next::Unknown => cluster
                .fetch(&get_what, api.get(&name))
                .await?
                .ok_or_else(&gone)?,
        };
    }
}

pub(crate) type Changes<K> =
    std::pin::Pin<Box<dyn futures::Stream<Item = kube::Result<WatchEvent<K>>> + Send>>;

/// A watch of one object from the version just read. None when the watch
/// cannot start: the poll still runs.
async fn watch_one<K>(api: &Api<K>, name: &str, current: &K, wait: Duration) -> Option<Changes<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let version = current.meta().resource_version.as_deref()?;
    // The API server ends the watch by itself once the wait is over
    // (it takes at most 295 s).
    let secs = u32::try_from(wait.as_secs().clamp(1, 290)).unwrap_or(290);
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(secs);
    match tokio::time::timeout(POLL_INTERVAL, api.watch(&params, version)).await {
        Ok(Ok(stream)) => Some(Box::pin(stream)),
        _ => None,
    }
}

/// What one `POLL_INTERVAL` of waiting told.
#[derive(Debug)]
pub(crate) enum Next<K> {
    /// The watch handed over the changed object.
    Changed(Box<K>),
    /// The watch is up and reported nothing: the object is as it was. (A
    /// watch that stays silent past the client's read timeout fails, and
    /// is dropped.)
    Unchanged,
    /// No watch: the object must be read.
    Unknown,
}

/// Waits for the next change the watch reports, or `POLL_INTERVAL` at
/// most. A watch that ends or fails (a partition, a version too old, a
/// deletion) is dropped, and the caller reads the object from then on, so
/// the watch only ever makes the wait shorter.
pub(crate) async fn next_change<K>(changes: &mut Option<Changes<K>>) -> Next<K> {
    use futures::StreamExt;
    let Some(stream) = changes.as_mut() else {
        tokio::time::sleep(POLL_INTERVAL).await;
        return Next::Unknown;
    };
    match tokio::time::timeout(POLL_INTERVAL, stream.next()).await {
        Ok(Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj)))) => {
            Next::Changed(Box::new(obj))
        }
        Err(_) => Next::Unchanged,
        Ok(Some(Ok(_))) | Ok(Some(Err(_))) | Ok(None) => {
            *changes = None;
            tokio::time::sleep(POLL_INTERVAL).await;
            Next::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::VolumeAttachment;

    fn va(attached: bool) -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("csi-x".into());
        va.status = Some(k8s_openapi::api::storage::v1::VolumeAttachmentStatus {
            attached,
            ..Default::default()
        });
        va
    }

    fn stream(
        events: Vec<kube::Result<WatchEvent<VolumeAttachment>>>,
    ) -> Option<Changes<VolumeAttachment>> {
        Some(Box::pin(futures::stream::iter(events)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_change_is_handed_over_at_once() {
        let mut changes = stream(vec![Ok(WatchEvent::Modified(va(true)))]);
        let started = tokio::time::Instant::now();
        let got = next_change(&mut changes).await;
        assert!(
            matches!(&got, Next::Changed(v) if v.status.as_ref().is_some_and(|s| s.attached)),
            "{got:?}"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(changes.is_some(), "a watch that delivers is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_fails_or_ends_is_dropped_and_the_poll_goes_on() {
        let gone = kube::Error::Api(Box::new(
            kube::core::Status::failure("too old resource version", "Expired").with_code(410),
        ));
        for events in [
            vec![Err(gone)],
            vec![],
            vec![Ok(WatchEvent::Deleted(va(false)))],
        ] {
            let mut changes = stream(events);
            let started = tokio::time::Instant::now();
            assert!(matches!(next_change(&mut changes).await, Next::Unknown));
            assert!(changes.is_none(), "the broken watch is dropped");
            assert_eq!(started.elapsed(), POLL_INTERVAL, "the poll's pace is kept");
            // Without a watch the wait is the poll alone.
            let started = tokio::time::Instant::now();
            assert!(matches!(next_change(&mut changes).await, Next::Unknown));
            assert_eq!(started.elapsed(), POLL_INTERVAL);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_is_kept_and_waits_one_poll_interval() {
        let mut changes: Option<Changes<VolumeAttachment>> =
            Some(Box::pin(futures::stream::pending()));
        let started = tokio::time::Instant::now();
        // Nothing changed: no read is needed.
        assert!(matches!(next_change(&mut changes).await, Next::Unchanged));
        assert_eq!(started.elapsed(), POLL_INTERVAL);
        assert!(changes.is_some());
    }
}
