//! Discovery: how a new member learns its initial cluster when `--initial-cluster` does not
//! name it, as etcd 3.6 and 3.7 learn it.
//!
//! - [`srv`]: from DNS SRV records (`--discovery-srv`, `--discovery-srv-name`).
//! - [`v3`]: from a running etcd-compatible cluster, the discovery service, where each member
//!   registers under etcd's keys ([`registry`]) and waits for the others
//!   (`--discovery-endpoints`, `--discovery-token`, the `--discovery-*` client flags).
//!
//! Either gives what `--initial-cluster` would have given ([`Found`]), and the server plans
//! the member from it as it would from the flag. Until then the member's plan is etcd's
//! temporary cluster: itself alone, with its advertised peer URLs (and, for v3 discovery, the
//! discovery token as the cluster token, which its registered ID derives from).
//!
//! Discovery runs for a member without data only: one whose data directory records its
//! cluster already knows it (etcd: "discovery token is ignored since cluster already
//! initialized"). Nothing is written here. A member that stops after registering registers
//! again under the same key when started again, which keeps its place (the key's create
//! revision).

use std::path::Path;

use crate::config::{self, BadFlag, ClusterState, Discovery, Flags};

pub mod registry;
pub mod srv;
pub mod v3;

/// What discovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The initial cluster, in `--initial-cluster`'s form (`name=peer-URL,…`).
    pub initial_cluster: String,
    /// The token the members' IDs derive from, with their peer URLs.
    pub token: String,
    /// This member was recognised in the cluster by the addresses its advertised peer URLs
    /// resolve to (DNS SRV), not by their text: the two need not read the same.
    pub by_address: bool,
}

/// Why discovery failed: etcd's words, so that what an operator searches for is found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// A discovery flag does not make sense.
    #[error(transparent)]
    Flag(#[from] BadFlag),
    /// No SRV record gave a member: why, for each of the two services.
    #[error("error setting up initial cluster: {}", .0.join("; "))]
    NoSrvRecords(Vec<String>),
    /// SRV records name members, but none is this one: no target has the address of one of
    /// its `--initial-advertise-peer-urls`.
    #[error("error setting up initial cluster: cannot find local etcd member {name:?} in SRV records")]
    NotInSrvRecords {
        /// `--name`.
        name: String,
    },
    /// One of this member's advertised peer URLs does not resolve, so it cannot be told apart
    /// among the SRV targets.
    #[error("error setting up initial cluster: {url}: {reason}")]
    Unresolved {
        /// The URL.
        url: String,
        /// Why it does not resolve.
        reason: String,
    },
    /// The resolver's configuration (`/etc/resolv.conf`) cannot be read.
    #[error("error setting up initial cluster: cannot set up a DNS resolver: {0}")]
    Resolver(String),
    /// v3 discovery did not give this member a cluster.
    #[error("failed to join discovery cluster ({0})")]
    Join(#[from] JoinError),
}

/// Why v3 discovery did not give this member a cluster (etcd's `v3discovery` errors, and the
/// client's).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JoinError {
    /// The token has no size key: the operator has not set it up.
    #[error("discovery: size key not found")]
    SizeNotFound,
    /// The size key is not a positive number.
    #[error("discovery: size key is bad")]
    BadSizeKey,
    /// `size` members registered before this one.
    #[error("discovery: cluster is full")]
    FullCluster,
    /// The registrations do not make a valid initial cluster (a URL that is not one, one URL
    /// for two members).
    #[error("discovery: invalid peer URL: {0}")]
    InvalidUrl(String),
    /// The service could not be used for [`registry::MAX_RETRIES`] retries in a row.
    #[error("discovery: too many retries; the last error: {last}")]
    TooManyRetries {
        /// The last failure.
        last: String,
    },
    /// The service refused in a way no retry changes (credentials, permissions).
    #[error("discovery: the discovery service refused: {message} ({code:?})")]
    Refused {
        /// The gRPC code.
        code: tonic::Code,
        /// The service's message.
        message: String,
    },
    /// An endpoint is not a URL the client can dial.
    #[error("discovery: bad endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint, as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The client's TLS files cannot be used.
    #[error("discovery: TLS: {0}")]
    Tls(#[from] crate::transport::tls::TlsError),
}

/// etcd's refusal of two ways to bootstrap at once: `--initial-cluster` with a discovery flag.
pub fn check(f: &Flags) -> Result<(), BadFlag> {
    let listed = f.initial_cluster.as_deref().is_some_and(|c| !c.trim().is_empty());
    if listed && f.cluster.discovery()? != Discovery::None {
        return Err(BadFlag {
            flag: "initial-cluster",
            reason: "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", \"discovery-endpoints\" or \"discovery-srv\"".into(),
        });
    }
    Ok(())
}

/// The token the initial members' IDs derive from: v3 discovery's token (as etcd uses it),
/// else `--initial-cluster-token`.
pub fn cluster_token(f: &Flags) -> Result<String, BadFlag> {
    Ok(match f.cluster.discovery()? {
        Discovery::V3 { token, .. } => token,
        Discovery::None | Discovery::Srv { .. } => f.initial_cluster_token.clone(),
    })
}

/// Runs the discovery the flags ask for, for the member `member_id` of etcd's temporary
/// cluster (itself alone) whose data is in `member_dir`: `None` when there is none to run.
pub async fn run(f: &Flags, member_id: u64, member_dir: &Path) -> Result<Option<Found>, DiscoveryError> {
    let discovery = f.cluster.discovery()?;
    if discovery == Discovery::None {
        return Ok(None);
    }
    if crate::transport::peer::load_cluster_id(member_dir).is_some() {
        tracing::warn!(
            data_dir = %member_dir.display(),
            "discovery is ignored since the cluster is already initialized: the data directory records it"
        );
        return Ok(None);
    }
    let mut advertised = config::url_list("initial-advertise-peer-urls", &f.initial_advertise_peer_urls)?;
    match discovery {
        Discovery::None => Ok(None),
        Discovery::Srv { domain, suffix } => {
            let cluster = srv::initial_cluster(&f.name, &domain, &suffix, &advertised).await?;
            tracing::info!(cluster = %cluster, discovery_srv = %domain, "got the initial cluster from DNS SRV records");
            Ok(Some(Found {
                initial_cluster: cluster,
                token: f.initial_cluster_token.clone(),
                by_address: true,
            }))
        }
        Discovery::V3 { .. } if f.initial_cluster_state == ClusterState::Existing => {
            // etcd's too: v3 discovery bootstraps new clusters; a member joins an existing
            // one through its members, after `member add`.
            tracing::warn!("v3 discovery is for new clusters: ignored with --initial-cluster-state=existing");
            Ok(None)
        }
        Discovery::V3 { endpoints, token } => {
            let client = f.cluster.discovery_client()?;
            advertised.sort();
            let own: Vec<String> = advertised.iter().map(|u| format!("{}={u}", f.name)).collect();
            tracing::info!(
                discovery_token = %token,
                discovery_endpoints = %endpoints.join(","),
                "Bootstrapping cluster using v3 discovery."
            );
            let value = own.join(",");
            let me = v3::Registration {
                id: member_id,
                value: &value,
            };
            let cluster = v3::join(&endpoints, &token, &client, me).await?;
            config::initial_cluster(&cluster, &token).map_err(|e| JoinError::InvalidUrl(e.reason))?;
            tracing::info!(cluster = %cluster, "discovery joined cluster successfully");
            Ok(Some(Found {
                initial_cluster: cluster,
                token,
                by_address: false,
            }))
        }
    }
}
