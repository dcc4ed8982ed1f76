//! How clients and peers are served: gRPC stream and keep-alive limits, the HTTP-only client
//! listeners and the gateway, socket options, CORS and the host whitelist, and the peer
//! connections' timeouts. Each is etcd's flag with etcd's default.

use std::time::Duration;

use clap::{ArgAction, Args};

use super::value::{bad, go_duration, BadFlag};

/// The flags of this module.
#[derive(Debug, Args)]
pub struct Transport {
    /// How many gRPC streams one client connection may have open at once (default unlimited).
    #[arg(long, env = "ETCD_MAX_CONCURRENT_STREAMS", default_value_t = u32::MAX)]
    pub max_concurrent_streams: u32,
    /// Minimum duration a client should wait between pings; a client pinging more often is
    /// disconnected (a Go duration).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_MIN_TIME", default_value = "5s")]
    pub grpc_keepalive_min_time: String,
    /// How often the server pings an idle client connection to check it is alive (a Go
    /// duration; 0 disables).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_INTERVAL", default_value = "2h")]
    pub grpc_keepalive_interval: String,
    /// How long the server waits for a ping's answer before closing the connection (a Go
    /// duration; 0 disables).
    #[arg(long, env = "ETCD_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s")]
    pub grpc_keepalive_timeout: String,
    /// URLs to listen on for HTTP-only client traffic (health, metrics, the JSON gateway);
    /// when given, the --listen-client-urls serve gRPC alone.
    #[arg(long, env = "ETCD_LISTEN_CLIENT_HTTP_URLS", default_value = "")]
    pub listen_client_http_urls: String,
    /// Serve the HTTP/JSON gateway (/v3/...) on the client URLs.
    #[arg(long, env = "ETCD_ENABLE_GRPC_GATEWAY", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true")]
    pub enable_grpc_gateway: bool,
    /// Set SO_REUSEPORT on listeners, so that a port already in use can be bound again.
    #[arg(long, env = "ETCD_SOCKET_REUSE_PORT", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub socket_reuse_port: bool,
    /// Set SO_REUSEADDR on listeners, so that an address in TIME_WAIT can be bound.
    #[arg(long, env = "ETCD_SOCKET_REUSE_ADDRESS", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub socket_reuse_address: bool,
    /// Comma-separated origins allowed for CORS on the HTTP endpoints (empty or * allows all).
    #[arg(long, env = "ETCD_CORS", default_value = "*")]
    pub cors: String,
    /// Comma-separated hostnames HTTP requests may name in Host when the client port is not
    /// secure (empty or * allows all).
    #[arg(long, env = "ETCD_HOST_WHITELIST", default_value = "*")]
    pub host_whitelist: String,
    /// Read timeout on each peer connection (a Go duration).
    #[arg(long, env = "ETCD_RAFT_READ_TIMEOUT", default_value = "5s")]
    pub raft_read_timeout: String,
    /// Write timeout on each peer connection (a Go duration).
    #[arg(long, env = "ETCD_RAFT_WRITE_TIMEOUT", default_value = "5s")]
    pub raft_write_timeout: String,
}

/// The server side of gRPC keep-alive, as grpc-go's `keepalive.ServerParameters` and
/// `EnforcementPolicy` take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive {
    /// Pings sent on an idle connection this often; `None` never.
    pub interval: Option<Duration>,
    /// A ping unanswered this long closes the connection; `None` waits forever.
    pub timeout: Option<Duration>,
    /// The shortest interval between a client's pings that is tolerated (0: grpc-go's
    /// default); `None` for connections whose pings are not policed (the peers').
    pub min_time: Option<Duration>,
}

/// Who may call the HTTP endpoints: etcd's `--cors` and `--host-whitelist`, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpAccess {
    /// Origins answered with CORS headers; `None` allows every origin.
    pub cors: Option<Vec<String>>,
    /// Hosts a plaintext HTTP request may name; `None` allows every host.
    pub hosts: Option<Vec<String>>,
}

/// A comma-separated list where empty or `*` means everything (`None`).
fn all_or_list(value: &str) -> Option<Vec<String>> {
    let items: Vec<String> = value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    (!items.is_empty() && !items.iter().any(|s| s == "*")).then_some(items)
}

impl Transport {
    /// The keep-alive settings, checked: each a Go duration.
    pub fn keep_alive(&self) -> Result<KeepAlive, BadFlag> {
        let interval = go_duration("grpc-keepalive-interval", &self.grpc_keepalive_interval)?;
        let timeout = go_duration("grpc-keepalive-timeout", &self.grpc_keepalive_timeout)?;
        Ok(KeepAlive {
            interval: (!interval.is_zero()).then_some(interval),
            timeout: (!timeout.is_zero()).then_some(timeout),
            min_time: Some(go_duration("grpc-keepalive-min-time", &self.grpc_keepalive_min_time)?),
        })
    }

    /// `--cors` and `--host-whitelist`; a CORS origin must be `*` or a URL, as etcd checks.
    pub fn http_access(&self) -> Result<HttpAccess, BadFlag> {
        let cors = all_or_list(&self.cors);
        for origin in cors.iter().flatten() {
            let ok = origin
                .split_once("://")
                .is_some_and(|(scheme, host)| !scheme.is_empty() && !host.is_empty());
            if !ok {
                return Err(bad("cors", format!("{origin:?} is not * or a URL")));
            }
        }
        Ok(HttpAccess {
            cors,
            hosts: all_or_list(&self.host_whitelist),
        })
    }

    /// The peer connections' read and write timeouts.
    pub fn raft_timeouts(&self) -> Result<(Duration, Duration), BadFlag> {
        Ok((
            go_duration("raft-read-timeout", &self.raft_read_timeout)?,
            go_duration("raft-write-timeout", &self.raft_write_timeout)?,
        ))
    }

    /// Checks every value.
    pub fn check(&self) -> Result<(), BadFlag> {
        self.keep_alive()?;
        self.http_access()?;
        self.raft_timeouts()?;
        if self.max_concurrent_streams == 0 {
            return Err(bad("max-concurrent-streams", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Only {
        #[command(flatten)]
        transport: Transport,
    }

    fn parse(args: &[&str]) -> Transport {
        Only::try_parse_from(std::iter::once("cairn").chain(args.iter().copied()))
            .unwrap()
            .transport
    }

    #[test]
    fn keep_alive_defaults_are_etcds_and_zero_disables() {
        let k = parse(&[]).keep_alive().unwrap();
        assert_eq!(k.interval, Some(Duration::from_secs(7200)));
        assert_eq!(k.timeout, Some(Duration::from_secs(20)));
        assert_eq!(k.min_time, Some(Duration::from_secs(5)));
        let k = parse(&["--grpc-keepalive-interval=0", "--grpc-keepalive-timeout=0s"])
            .keep_alive()
            .unwrap();
        assert_eq!((k.interval, k.timeout), (None, None));
        assert!(
            parse(&["--grpc-keepalive-min-time=5"]).keep_alive().is_err(),
            "Go wants a unit"
        );
    }

    #[test]
    fn cors_and_host_whitelist_allow_all_when_empty_or_star() {
        let a = parse(&[]).http_access().unwrap();
        assert_eq!((a.cors, a.hosts), (None, None));
        let a = parse(&["--cors=", "--host-whitelist=a.example,*"])
            .http_access()
            .unwrap();
        assert_eq!((a.cors, a.hosts), (None, None));
        let a = parse(&[
            "--cors=https://a.example,http://b.example:8080",
            "--host-whitelist=a,b:2379",
        ])
        .http_access()
        .unwrap();
        assert_eq!(
            a.cors,
            Some(vec!["https://a.example".into(), "http://b.example:8080".into()])
        );
        assert_eq!(a.hosts, Some(vec!["a".into(), "b:2379".into()]));
        assert!(parse(&["--cors=a.example"]).http_access().is_err());
    }

    #[test]
    fn streams_are_unlimited_by_default_and_zero_is_refused() {
        assert_eq!(parse(&[]).max_concurrent_streams, u32::MAX);
        assert!(parse(&["--max-concurrent-streams=0"]).check().is_err());
        assert!(parse(&["--max-concurrent-streams=100"]).check().is_ok());
    }
}
