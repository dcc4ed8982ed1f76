//! Requests only the leader can serve (membership changes, lease keep-alives and TTLs), sent
//! on by a follower to the leader's client URL (over TLS if the URL is https), as etcd's
//! followers do.

use std::collections::HashMap;

use parking_lot::Mutex;
use tonic::transport::Channel;
use tonic::Status;

use cairn_engine::Engine;

use crate::transport::tls::Connector;

/// How long a request waits for the leader's client URLs to be known here.
const PUBLISH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// Channels to leaders, by member ID (kept: a leader is asked again and again).
#[derive(Debug, Default)]
pub struct Forwarder {
    connector: Connector,
    channels: Mutex<HashMap<u64, Channel>>,
}

/// Where a request goes: served here, or sent on to the leader over `Channel`.
#[derive(Debug)]
pub enum Route {
    /// This member is the leader: serve the request here.
    Here,
    /// Another member leads: send the request over this channel to its first client URL.
    Leader(Channel),
}

impl Forwarder {
    /// Dials leaders with `connector` (the client port's TLS, for https client URLs).
    pub fn new(connector: Connector) -> Forwarder {
        Forwarder {
            connector,
            channels: Mutex::default(),
        }
    }

    /// Whether member `me` of `engine` serves a leader-only request itself, or where to send
    /// it. A leader
    /// whose client URLs are not known here yet (a cluster just started: each member
    /// publishes them through the log once it runs) is waited for, for up to
    /// [`PUBLISH_PATIENCE`]; "no leader" after that.
    pub async fn route(&self, engine: &Engine, me: u64) -> Result<Route, Status> {
        let deadline = tokio::time::Instant::now() + PUBLISH_PATIENCE;
        loop {
            match self.route_now(engine, me) {
                Ok(Some(route)) => return Ok(route),
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Ok(None) => return Err(crate::errors::status(&cairn_engine::Error::NoLeader)),
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Forwarder::route`] as things are now: `None` while the leader's client URLs are
    /// not known.
    fn route_now(&self, engine: &Engine, me: u64) -> Result<Option<Route>, Status> {
        let Some(leader) = engine.leader() else {
            return Err(crate::errors::status(&cairn_engine::Error::NoLeader));
        };
        if leader == me {
            return Ok(Some(Route::Here));
        }
        if let Some(channel) = self.channels.lock().get(&leader) {
            return Ok(Some(Route::Leader(channel.clone())));
        }
        let Some(url) = engine
            .members()
            .list()
            .into_iter()
            .find(|m| m.id == leader)
            .and_then(|m| m.client_urls.into_iter().next())
        else {
            return Ok(None);
        };
        let channel = self
            .connector
            .lazy_channel(&url)
            .map_err(|e| Status::internal(format!("etcdserver: the leader's client URL: {e}")))?;
        self.channels.lock().insert(leader, channel.clone());
        Ok(Some(Route::Leader(channel)))
    }
}
