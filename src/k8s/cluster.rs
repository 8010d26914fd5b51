//! One Kubernetes cluster (a member, or the host) and the bounded way to call
//! it: every call gets a deadline and one error mapping.

use std::future::Future;
use std::time::Duration;

use kube::api::{Api, ListParams, ObjectList, PartialObjectMeta};

use crate::k8s::error::{classify, timed_out, KubeError, KubeResult};
use crate::k8s::CALL_TIMEOUT;

/// Objects per page of a listing that may hold one per volume: one
/// response of 10,000 whole objects, each with its writers' managedFields,
/// is tens of MiB that the API server builds and the controller parses at
/// once (and keeps: the allocator does not give such a burst back).
pub const LIST_PAGE: u32 = 500;

#[derive(Clone)]
pub struct Cluster {
    name: String,
    label: String,
    client: kube::Client,
    /// For long streams (a move's port-forwards): reads may wait longer
    /// than a call's timeout. None: `client`.
    streams: Option<kube::Client>,
    timeout: Duration,
    /// Whether its requests count in `kube_requests_total` and
    /// `cluster_reachable` (whose alert pages when a member stops answering).
    metered: bool,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("name", &self.name).finish()
    }
}

impl Cluster {
    /// A member cluster called `name` (as `--member` and StorageClasses name it).
    pub fn member(name: &str, client: kube::Client) -> Self {
        Cluster {
            name: name.to_string(),
            label: format!("member cluster {name}"),
            client,
            streams: None,
            timeout: CALL_TIMEOUT,
            metered: true,
        }
    }

    /// The host cluster (where the CO and the RelayVolume objects live).
    pub fn host(client: kube::Client) -> Self {
        Cluster {
            name: "host".into(),
            label: "host cluster".into(),
            client,
            streams: None,
            timeout: CALL_TIMEOUT,
            metered: true,
        }
    }

    /// Its requests left out of the metrics: a member declared lost, which
    /// the fence asks, is expected not to answer, and must not page anyone.
    pub fn unmetered(mut self) -> Self {
        self.metered = false;
        self
    }

    pub fn with_streams(mut self, client: kube::Client) -> Self {
        self.streams = Some(client);
        self
    }

    pub fn stream_client(&self) -> kube::Client {
        self.streams.clone().unwrap_or_else(|| self.client.clone())
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// "member cluster east" / "host cluster", for messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    async fn attempt<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> KubeResult<T> {
        let result = match tokio::time::timeout(self.timeout, call).await {
            Err(_) => Err(timed_out(&self.label, what, self.timeout)),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(classify(&self.label, what, e)),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(KubeError::Api { .. }) => "api_error",
            Err(KubeError::Unreachable { .. }) => "unreachable",
            Err(_) => "error",
        };
        if self.metered {
            crate::rt::metrics::kube_request(&self.name, outcome);
        }
        result
    }

    /// Any call: every failure mapped.
    pub async fn run<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> KubeResult<T> {
        self.attempt(what, call).await
    }

    /// A read where 404 means absent.
    pub async fn fetch<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> KubeResult<Option<T>> {
        match self.attempt(what, call).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A create where 409 means it already exists (`None`): the caller reads
    /// the existing object and carries on.
    pub async fn create<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> KubeResult<Option<T>> {
        match self.attempt(what, call).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(409) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A create that may find the object's API or namespace missing: 404
    /// comes back as `Err(Ok(message))` for the caller to explain.
    pub async fn create_or_missing<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> KubeResult<Result<Option<T>, String>> {
        match self.attempt(what, call).await {
            Ok(v) => Ok(Ok(Some(v))),
            Err(e) if e.status() == Some(409) => Ok(Ok(None)),
            Err(KubeError::Api {
                code: 404, message, ..
            }) => Ok(Err(message)),
            Err(e) => Err(e),
        }
    }

    /// A delete where 404 means already gone.
    pub async fn remove<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> KubeResult<()> {
        match self.attempt(what, call).await {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A listing of `api` by pages of `LIST_PAGE` objects, each handed to
    /// `each` before the next is asked for, so neither side holds the whole
    /// list at once. `Ok(None)`: the API is not served (404).
    pub async fn list_pages<K, E>(
        &self,
        what: &str,
        api: &Api<K>,
        params: ListParams,
        each: impl FnMut(Vec<K>) -> Result<(), E>,
    ) -> Result<Option<()>, E>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        E: From<KubeError>,
    {
        self.pages(what, params, |p| async move { api.list(&p).await }, each)
            .await
    }

    /// `list_pages`, of the objects' metadata only.
    pub async fn list_metadata_pages<K, E>(
        &self,
        what: &str,
        api: &Api<K>,
        params: ListParams,
        each: impl FnMut(Vec<PartialObjectMeta<K>>) -> Result<(), E>,
    ) -> Result<Option<()>, E>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        E: From<KubeError>,
    {
        self.pages(
            what,
            params,
            |p| async move { api.list_metadata(&p).await },
            each,
        )
        .await
    }

    async fn pages<T, E, Fut>(
        &self,
        what: &str,
        params: ListParams,
        list: impl Fn(ListParams) -> Fut,
        mut each: impl FnMut(Vec<T>) -> Result<(), E>,
    ) -> Result<Option<()>, E>
    where
        T: Clone,
        E: From<KubeError>,
        Fut: Future<Output = Result<ObjectList<T>, kube::Error>>,
    {
        let mut params = params.limit(LIST_PAGE);
        loop {
            let Some(listed) = self.fetch(what, list(params.clone())).await? else {
                return Ok(None);
            };
            each(listed.items)?;
            match listed.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(Some(())),
            }
        }
    }
}
