//! v3 discovery's client: joining a new cluster through a running etcd-compatible cluster (the
//! discovery service), as etcd 3.6's `v3discovery.JoinCluster` joins it:
//!
//! 1. read the size the operator set for the token, and the registrations so far: no size, a
//!    bad one, or `size` members registered already and this one not among them, ends it;
//! 2. register this member (a put of its key; done again on a restart, the key's create
//!    revision, and so its place, stays);
//! 3. read them again (the same checks), and until `size` members have registered, wait for
//!    the next change under the members prefix (a watch from the revision read) and read again;
//! 4. the first `size` registrations are the initial cluster.
//!
//! Every request is bounded by `--discovery-request-timeout`, every connection by
//! `--discovery-dial-timeout`; a failed one is retried with etcd's backoff, on the next
//! endpoint, up to [`registry::MAX_RETRIES`] in a row. A refusal that no retry can change
//! (wrong credentials, no permission) ends it at once. Waiting for the other members has no
//! bound, as in etcd: that is what the member is started for.

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::registry::{self, Keys, Registrations, SizeError};
use super::JoinError;
use crate::config::DiscoveryClient;
use crate::pb::etcdserverpb as pb;
use crate::transport::tls::{Connector, Tls};

/// How long one watch waits for a change before the registrations are read again anyway (a
/// change missed by a watch that broke silently is seen then).
const REREAD: Duration = Duration::from_secs(60);
/// One KV call on a session's client, for [`Client::retried`].
type KvCall<M, T> =
    fn(
        pb::kv_client::KvClient<Channel>,
        tonic::Request<M>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<tonic::Response<T>, Status>> + Send>>;

/// etcd's answer to Authenticate when authentication is off.
const AUTH_NOT_ENABLED: &str = "authentication is not enabled";

/// What a member registers at the discovery service: its ID, and its `name=peer-URL,…`.
#[derive(Clone, Copy, Debug)]
pub struct Registration<'a> {
    /// The member's ID.
    pub id: u64,
    /// `name=peer-URL,…`.
    pub value: &'a str,
}

/// Joins the cluster of `token` at the discovery service's `endpoints` with `me`'s
/// registration: the initial cluster, in `--initial-cluster`'s form.
pub async fn join(
    endpoints: &[String],
    token: &str,
    settings: &DiscoveryClient,
    me: Registration<'_>,
) -> Result<String, JoinError> {
    let Registration { id, value } = me;
    let keys = Keys::new(token);
    let own = keys.member(id);
    let mut client = Client::new(endpoints, settings)?;
    client.check(&keys, &own).await?;
    client.put(&own, value).await?;
    tracing::info!(member_key = %own, member_info = %value, "register member itself successfully");
    let mut logged = None;
    loop {
        let (registered, size, revision) = client.check(&keys, &own).await?;
        if registered.len() >= size {
            tracing::info!(
                cluster_size = size,
                found_peers = registered.len(),
                "found all needed peers from discovery service"
            );
            return Ok(registered.initial_cluster(size));
        }
        if logged != Some(registered.len()) {
            tracing::info!(
                cluster_size = size,
                found_peers = registered.len(),
                "waiting for peers from discovery service"
            );
            logged = Some(registered.len());
        }
        client.wait_for_change(keys.members.as_bytes(), revision).await?;
    }
}

/// A failed request: worth retrying, or not.
#[derive(Debug)]
enum Failure {
    /// The service could not be reached, timed out, or failed this once: why.
    Transient(String),
    /// Retrying cannot help.
    Fatal(JoinError),
}

/// A connection to one endpoint, and the token it authenticated with.
#[derive(Debug)]
struct Session {
    channel: Channel,
    token: Option<MetadataValue<Ascii>>,
}

impl Session {
    /// `message` as a request with the session's token and a deadline.
    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        if let Some(token) = &self.token {
            request.metadata_mut().insert("token", token.clone());
        }
        request
    }
}

/// The discovery service's client: its endpoints, one connection at a time, and the count of
/// requests that failed in a row.
#[derive(Debug)]
struct Client<'a> {
    /// Each with its scheme.
    endpoints: Vec<String>,
    settings: &'a DiscoveryClient,
    connector: Connector,
    /// The endpoint the next connection tries first.
    next: usize,
    session: Option<Session>,
    /// Failed requests in a row (0 after one succeeds).
    retries: u32,
}

impl<'a> Client<'a> {
    fn new(endpoints: &[String], settings: &'a DiscoveryClient) -> Result<Client<'a>, JoinError> {
        let scheme = if settings.secure { "https" } else { "http" };
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| match e.contains("://") {
                true => e.clone(),
                false => format!("{scheme}://{e}"),
            })
            .collect();
        for e in &endpoints {
            if let Err(reason) = Endpoint::from_shared(e.clone()) {
                return Err(JoinError::Endpoint {
                    endpoint: e.clone(),
                    reason: reason.to_string(),
                });
            }
        }
        let https = endpoints.iter().any(|e| e.starts_with("https://"));
        let tls = if https || settings.secure {
            let files = crate::transport::tls::Files {
                cert: settings.cert.clone(),
                key: settings.key.clone(),
                trusted_ca: settings.cacert.clone(),
                self_signed: settings.skip_verify,
                ..crate::transport::tls::Files::default()
            };
            Some(Tls::new(files, crate::transport::tls::Protocols::new("", "", "")?)?)
        } else {
            None
        };
        Ok(Client {
            endpoints,
            settings,
            connector: Connector::new(tls),
            next: 0,
            session: None,
            retries: 0,
        })
    }

    /// The size and the registrations, checked as etcd checks them before and after this
    /// member registers: the registrations, the size, and the revision they were read at.
    async fn check(&mut self, keys: &Keys, own: &str) -> Result<(Registrations, usize, i64), JoinError> {
        let size = self.range(keys.size.as_bytes(), None).await?;
        let size = registry::cluster_size(size.kvs.first().map(|kv| kv.value.as_ref())).map_err(|e| match e {
            SizeError::NotFound => JoinError::SizeNotFound,
            SizeError::Bad => JoinError::BadSizeKey,
        })?;
        let prefix = keys.members.as_bytes();
        let members = self.range(prefix, Some(registry::prefix_end(prefix))).await?;
        let mut registered = Registrations::new(keys);
        for kv in &members.kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let value = String::from_utf8_lossy(&kv.value);
            match registered.add(&kv.key, &kv.value, kv.create_revision) {
                Ok(()) => tracing::debug!(member_key = %key, member_info = %value, "found peer from discovery service"),
                Err(e) => tracing::warn!(member_key = %key, member_info = %value, "{e}"),
            }
        }
        if registered.full(size, own) {
            return Err(JoinError::FullCluster);
        }
        let revision = members.header.map_or(0, |h| h.revision);
        Ok((registered, size, revision))
    }

    /// A Range of `key` (to `range_end`), retried.
    async fn range(&mut self, key: &[u8], range_end: Option<Vec<u8>>) -> Result<pb::RangeResponse, JoinError> {
        let message = pb::RangeRequest {
            key: key.to_vec().into(),
            range_end: range_end.unwrap_or_default().into(),
            ..pb::RangeRequest::default()
        };
        self.retried(message, "reading the discovery service", |mut kv, request| {
            Box::pin(async move { kv.range(request).await })
        })
        .await
    }

    /// A Put of `value` at `key`, retried.
    async fn put(&mut self, key: &str, value: &str) -> Result<(), JoinError> {
        let message = pb::PutRequest {
            key: key.as_bytes().to_vec().into(),
            value: value.as_bytes().to_vec().into(),
            ..pb::PutRequest::default()
        };
        self.retried(message, "registering this member", |mut kv, request| {
            Box::pin(async move { kv.put(request).await })
        })
        .await
        .map(|_| ())
    }

    /// `call` with `message` on a session's KV client, each try bounded by the request
    /// timeout, tried again after a transient failure (a back-off between tries) until it is
    /// answered or fails for good; `step` names it in the logs.
    async fn retried<M: Clone, T>(&mut self, message: M, step: &str, call: KvCall<M, T>) -> Result<T, JoinError> {
        loop {
            let timeout = self.settings.request_timeout;
            let answer = match self.session().await {
                Ok(session) => {
                    let request = session.request(message.clone(), timeout);
                    let kv = pb::kv_client::KvClient::new(session.channel.clone());
                    bounded(timeout, call(kv, request)).await
                }
                Err(failure) => Err(failure),
            };
            match self.settle(answer, step) {
                Ok(response) => return Ok(response),
                Err(failure) => self.back_off(failure).await?,
            }
        }
    }

    /// Returns once a key starting with `prefix` changes after `revision`, or [`REREAD`]
    /// passes, or the watch was cancelled (its history compacted, say): what changed is read
    /// again by the caller either way.
    async fn wait_for_change(&mut self, prefix: &[u8], revision: i64) -> Result<(), JoinError> {
        let create = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(pb::WatchCreateRequest {
                key: prefix.to_vec().into(),
                range_end: registry::prefix_end(prefix).into(),
                start_revision: revision.saturating_add(1),
                ..pb::WatchCreateRequest::default()
            })),
        };
        let answer = match self.session().await {
            Ok(session) => {
                // The request stream stays open: a client that closes it ends its watches.
                let requests = tokio_stream::StreamExt::chain(tokio_stream::once(create), tokio_stream::pending());
                let mut request = tonic::Request::new(requests);
                if let Some(token) = &session.token {
                    request.metadata_mut().insert("token", token.clone());
                }
                let mut client = pb::watch_client::WatchClient::new(session.channel.clone());
                let watching = async move {
                    let mut stream = client.watch(request).await.map_err(classify)?.into_inner();
                    loop {
                        match stream.message().await.map_err(classify)? {
                            None => return Err(Failure::Transient("the watch stream ended".into())),
                            Some(r) if r.canceled && r.compact_revision == 0 => {
                                return Err(Failure::Transient(format!(
                                    "the watch was cancelled: {}",
                                    r.cancel_reason
                                )))
                            }
                            Some(r) if r.canceled || !r.events.is_empty() => return Ok(()),
                            Some(_) => {}
                        }
                    }
                };
                tokio::time::timeout(REREAD, watching).await.unwrap_or(Ok(()))
            }
            Err(failure) => Err(failure),
        };
        match self.settle(answer, "watching for peers") {
            Ok(()) => Ok(()),
            Err(failure) => self.back_off(failure).await,
        }
    }

    /// The session, connecting (and authenticating) if there is none: each endpoint is
    /// tried in turn, from [`Client::next`].
    async fn session(&mut self) -> Result<&Session, Failure> {
        if self.session.is_none() {
            let mut last = String::from("no endpoint");
            for i in 0..self.endpoints.len() {
                let at = (self.next + i) % self.endpoints.len();
                let Some(url) = self.endpoints.get(at).cloned() else {
                    continue;
                };
                match self.connect(&url).await {
                    Ok(session) => {
                        self.next = at;
                        self.session = Some(session);
                        break;
                    }
                    Err(Failure::Fatal(e)) => return Err(Failure::Fatal(e)),
                    Err(Failure::Transient(why)) => last = format!("{url}: {why}"),
                }
            }
            if self.session.is_none() {
                return Err(Failure::Transient(last));
            }
        }
        self.session
            .as_ref()
            .ok_or_else(|| Failure::Transient("no connection".into()))
    }

    async fn connect(&self, url: &str) -> Result<Session, Failure> {
        let s = self.settings;
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| Failure::Transient(e.to_string()))?
            .connect_timeout(s.dial_timeout)
            .http2_keep_alive_interval(s.keepalive_time)
            .keep_alive_timeout(s.keepalive_timeout);
        let channel = tokio::time::timeout(s.dial_timeout, endpoint.connect_with_connector(self.connector.clone()))
            .await
            .map_err(|_| Failure::Transient("dial timed out".into()))?
            .map_err(|e| Failure::Transient(error_chain(&e)))?;
        let Some((name, password)) = &s.credentials else {
            return Ok(Session { channel, token: None });
        };
        let mut request = tonic::Request::new(pb::AuthenticateRequest {
            name: name.clone(),
            password: password.clone(),
        });
        request.set_timeout(s.request_timeout);
        let mut auth = pb::auth_client::AuthClient::new(channel.clone());
        let token = match tokio::time::timeout(s.request_timeout, auth.authenticate(request)).await {
            Ok(Ok(response)) => response.into_inner().token,
            // As etcd's client: credentials for a service without authentication go unused.
            Ok(Err(status)) if status.message().ends_with(AUTH_NOT_ENABLED) => {
                return Ok(Session { channel, token: None });
            }
            Ok(Err(status)) => return Err(classify(status)),
            Err(_) => return Err(Failure::Transient("context deadline exceeded".into())),
        };
        let token = token
            .parse()
            .map_err(|_| Failure::Transient("the service answered a token that is not ASCII".into()))?;
        Ok(Session {
            channel,
            token: Some(token),
        })
    }

    /// After a request: on success, the count of failures in a row starts again; on a
    /// transient failure the session is dropped (the next request connects again, to the
    /// next endpoint), and the failure is logged as etcd logs it.
    fn settle<T>(&mut self, answer: Result<T, Failure>, step: &str) -> Result<T, Failure> {
        match answer {
            Ok(value) => {
                self.retries = 0;
                Ok(value)
            }
            Err(Failure::Transient(why)) => {
                tracing::warn!(reason = step, error = %why, "failed to reach the discovery service");
                self.session = None;
                self.next = self.next.wrapping_add(1);
                Err(Failure::Transient(why))
            }
            Err(fatal) => Err(fatal),
        }
    }

    /// Waits etcd's backoff before the next try, or gives up.
    async fn back_off(&mut self, failure: Failure) -> Result<(), JoinError> {
        let why = match failure {
            Failure::Fatal(e) => return Err(e),
            Failure::Transient(why) => why,
        };
        self.retries = self.retries.saturating_add(1);
        let Some(wait) = registry::backoff(self.retries) else {
            return Err(JoinError::TooManyRetries { last: why });
        };
        tracing::warn!(backoff = ?wait, retries = self.retries, "retry connecting to discovery service");
        tokio::time::sleep(wait).await;
        Ok(())
    }
}

/// `call`, given at most `timeout`.
async fn bounded<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(classify(status)),
        Err(_) => Err(Failure::Transient("context deadline exceeded".into())),
    }
}

/// What the service's status means for a retry: refusals that stay refusals (credentials,
/// permissions, a request it cannot take) end discovery; anything else may pass next time.
fn classify(status: Status) -> Failure {
    match status.code() {
        Code::PermissionDenied | Code::InvalidArgument | Code::FailedPrecondition => {
            Failure::Fatal(JoinError::Refused {
                code: status.code(),
                message: status.message().to_string(),
            })
        }
        _ => Failure::Transient(error_chain(&status)),
    }
}

/// An error with its causes, which tonic's transport errors keep behind "transport error"
/// (each said once: some repeat their cause's text).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}
