//! How the member takes part in its cluster: Raft's pre-vote and initial election ticks, the
//! membership checks (`--strict-reconfig-check`, `--max-learners`), `--force-new-cluster`,
//! and discovery (etcd 3.6's v3 discovery, DNS SRV, and the v2 discovery flags etcd 3.7 still
//! lists). Each is etcd's flag with etcd's default.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use super::value::{bad, go_duration, BadFlag};

/// The flags of this module.
// The discovery client's flags are documented a group at a time, as etcd's help does.
#[allow(missing_docs)]
#[derive(Debug, Args)]
pub struct Cluster {
    /// Run Raft's pre-vote, so that a member partitioned away does not disrupt the cluster
    /// when it comes back.
    #[arg(long, env = "ETCD_PRE_VOTE", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true")]
    pub pre_vote: bool,
    /// Refuse membership changes that would leave the cluster without a quorum.
    #[arg(long, env = "ETCD_STRICT_RECONFIG_CHECK", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true")]
    pub strict_reconfig_check: bool,
    /// The most learners the cluster may have at once.
    #[arg(long, env = "ETCD_MAX_LEARNERS", default_value_t = 1)]
    pub max_learners: i64,
    /// On boot, fast-forward the election ticks so that a first election comes sooner.
    #[arg(long, env = "ETCD_INITIAL_ELECTION_TICK_ADVANCE", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true")]
    pub initial_election_tick_advance: bool,
    /// Make this member, with its data, a cluster of one: for recovering from the loss of a
    /// quorum. Its former peers are removed; new members then join it.
    #[arg(long, env = "ETCD_FORCE_NEW_CLUSTER", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub force_new_cluster: bool,

    /// DNS SRV domain to find the initial cluster's members in.
    #[arg(long, env = "ETCD_DISCOVERY_SRV", default_value = "")]
    pub discovery_srv: String,
    /// Suffix of the SRV names looked up (`_etcd-server-ssl-<suffix>._tcp`).
    #[arg(long, env = "ETCD_DISCOVERY_SRV_NAME", default_value = "")]
    pub discovery_srv_name: String,
    /// V3 discovery: the discovery service's gRPC endpoints, comma-separated.
    #[arg(long, env = "ETCD_DISCOVERY_ENDPOINTS", default_value = "")]
    pub discovery_endpoints: String,
    /// V3 discovery: the token naming the cluster to bootstrap.
    #[arg(long, env = "ETCD_DISCOVERY_TOKEN", default_value = "")]
    pub discovery_token: String,
    /// V3 discovery: the client's settings (Go durations, TLS files, credentials).
    #[arg(long, env = "ETCD_DISCOVERY_DIAL_TIMEOUT", default_value = "2s")]
    pub discovery_dial_timeout: String,
    #[arg(long, env = "ETCD_DISCOVERY_REQUEST_TIMEOUT", default_value = "5s")]
    pub discovery_request_timeout: String,
    #[arg(long, env = "ETCD_DISCOVERY_KEEPALIVE_TIME", default_value = "2s")]
    pub discovery_keepalive_time: String,
    #[arg(long, env = "ETCD_DISCOVERY_KEEPALIVE_TIMEOUT", default_value = "6s")]
    pub discovery_keepalive_timeout: String,
    #[arg(long, env = "ETCD_DISCOVERY_INSECURE_TRANSPORT", action = ArgAction::Set, num_args = 0..=1, default_value = "true", default_missing_value = "true")]
    pub discovery_insecure_transport: bool,
    #[arg(long, env = "ETCD_DISCOVERY_INSECURE_SKIP_TLS_VERIFY", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub discovery_insecure_skip_tls_verify: bool,
    #[arg(long, env = "ETCD_DISCOVERY_CERT", default_value = "")]
    pub discovery_cert: String,
    #[arg(long, env = "ETCD_DISCOVERY_KEY", default_value = "")]
    pub discovery_key: String,
    #[arg(long, env = "ETCD_DISCOVERY_CACERT", default_value = "")]
    pub discovery_cacert: String,
    #[arg(long, env = "ETCD_DISCOVERY_USER", default_value = "")]
    pub discovery_user: String,
    #[arg(long, env = "ETCD_DISCOVERY_PASSWORD", default_value = "")]
    pub discovery_password: String,
    /// V2 discovery's URL (etcd 3.7 deprecates it; cairn has no v2 discovery service to ask).
    #[arg(long, env = "ETCD_DISCOVERY", default_value = "")]
    pub discovery: String,
    /// What to do when discovery fails: exit, the only choice left since the v2 proxy went.
    #[arg(long, env = "ETCD_DISCOVERY_FALLBACK", default_value = "exit")]
    pub discovery_fallback: String,
    /// An HTTP proxy for v2 discovery.
    #[arg(long, env = "ETCD_DISCOVERY_PROXY", default_value = "")]
    pub discovery_proxy: String,
}

/// What the discovery flags ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// `--initial-cluster` names the members.
    None,
    /// Look the members up as DNS SRV records under this domain, with this name suffix.
    Srv {
        /// `--discovery-srv`.
        domain: String,
        /// `--discovery-srv-name`.
        suffix: String,
    },
    /// Register with, and learn the members from, a running etcd-compatible cluster.
    V3 {
        /// `--discovery-endpoints`.
        endpoints: Vec<String>,
        /// `--discovery-token`.
        token: String,
    },
}

/// How v3 discovery's client reaches the discovery service (etcd's `clientv3.ConfigSpec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryClient {
    /// `--discovery-dial-timeout`: connecting to one endpoint.
    pub dial_timeout: Duration,
    /// `--discovery-request-timeout`: one request, once connected.
    pub request_timeout: Duration,
    /// `--discovery-keepalive-time`: HTTP/2 pings on an idle connection, this often.
    pub keepalive_time: Duration,
    /// `--discovery-keepalive-timeout`: a ping unanswered this long drops the connection.
    pub keepalive_timeout: Duration,
    /// Dial with TLS (`--discovery-insecure-transport=false`, or a certificate or CA file
    /// given): an endpoint without a scheme is then `https://`.
    pub secure: bool,
    /// `--discovery-insecure-skip-tls-verify`: trust any server certificate.
    pub skip_verify: bool,
    /// `--discovery-cert` and `--discovery-key`: the pair presented to the service.
    pub cert: Option<PathBuf>,
    /// The private key of `cert`.
    pub key: Option<PathBuf>,
    /// `--discovery-cacert`: the CAs a server certificate must chain to.
    pub cacert: Option<PathBuf>,
    /// `--discovery-user` and `--discovery-password` (or `user:password` in the first, as
    /// etcd's help describes it): authenticate before every request.
    pub credentials: Option<(String, String)>,
}

impl Cluster {
    /// The discovery asked for, checked as etcd checks it: one way at most.
    pub fn discovery(&self) -> Result<Discovery, BadFlag> {
        let v3 = !self.discovery_endpoints.trim().is_empty();
        let srv = !self.discovery_srv.trim().is_empty();
        let v2 = !self.discovery.trim().is_empty();
        if u8::from(v3) + u8::from(srv) + u8::from(v2) > 1 {
            return Err(bad(
                "discovery-srv",
                "--discovery, --discovery-endpoints and --discovery-srv exclude each other",
            ));
        }
        if v2 {
            return Err(bad(
                "discovery",
                "v2 discovery is deprecated in etcd 3.7 and cairn has none: use --discovery-endpoints with --discovery-token (v3 discovery), or --discovery-srv",
            ));
        }
        // etcd's checks, with etcd's words.
        let token = self.discovery_token.trim();
        if v3 && token.is_empty() {
            return Err(bad(
                "discovery-endpoints",
                "both --discovery-token and --discovery-endpoints must be set",
            ));
        }
        if !v3 && !token.is_empty() {
            return Err(bad(
                "discovery-token",
                "both --discovery-token and --discovery-endpoints must be set",
            ));
        }
        if v3 {
            let mut endpoints = Vec::new();
            for endpoint in self.discovery_endpoints.split(',').map(str::trim) {
                if endpoint.is_empty() {
                    return Err(bad("discovery-endpoints", "must not contain empty endpoints"));
                }
                endpoints.push(endpoint.to_string());
            }
            // etcd keeps them as a set of strings: sorted, each once.
            endpoints.sort();
            endpoints.dedup();
            return Ok(Discovery::V3 {
                endpoints,
                token: token.to_string(),
            });
        }
        if srv {
            return Ok(Discovery::Srv {
                domain: self.discovery_srv.trim().to_string(),
                suffix: self.discovery_srv_name.trim().to_string(),
            });
        }
        Ok(Discovery::None)
    }

    /// The v3 discovery client's settings, checked.
    pub fn discovery_client(&self) -> Result<DiscoveryClient, BadFlag> {
        let file = |value: &str| Some(PathBuf::from(value.trim())).filter(|p| !p.as_os_str().is_empty());
        let (cert, key, cacert) = (
            file(&self.discovery_cert),
            file(&self.discovery_key),
            file(&self.discovery_cacert),
        );
        if cert.is_some() != key.is_some() {
            return Err(bad(
                "discovery-cert",
                "--discovery-cert and --discovery-key must be given together",
            ));
        }
        let credentials = match (self.discovery_user.as_str(), self.discovery_password.as_str()) {
            ("", "") => None,
            ("", _) => return Err(bad("discovery-password", "is given without --discovery-user")),
            (user, "") => Some(match user.split_once(':') {
                Some((user, password)) => (user.to_string(), password.to_string()),
                None => (user.to_string(), String::new()),
            }),
            (user, password) => Some((user.to_string(), password.to_string())),
        };
        Ok(DiscoveryClient {
            dial_timeout: go_duration("discovery-dial-timeout", &self.discovery_dial_timeout)?,
            request_timeout: go_duration("discovery-request-timeout", &self.discovery_request_timeout)?,
            keepalive_time: go_duration("discovery-keepalive-time", &self.discovery_keepalive_time)?,
            keepalive_timeout: go_duration("discovery-keepalive-timeout", &self.discovery_keepalive_timeout)?,
            secure: !self.discovery_insecure_transport || cert.is_some() || cacert.is_some(),
            skip_verify: self.discovery_insecure_skip_tls_verify,
            cert,
            key,
            cacert,
            credentials,
        })
    }

    /// `--max-learners`, checked.
    pub fn max_learners(&self) -> Result<usize, BadFlag> {
        usize::try_from(self.max_learners)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| bad("max-learners", format!("{} is less than 1", self.max_learners)))
    }

    /// Checks every value.
    pub fn check(&self) -> Result<(), BadFlag> {
        self.discovery()?;
        self.max_learners()?;
        self.discovery_client()?;
        if self.discovery_fallback != "exit" {
            return Err(bad(
                "discovery-fallback",
                format!(
                    "{:?}: only exit is left since the v2 proxy was removed",
                    self.discovery_fallback
                ),
            ));
        }
        if !self.discovery_proxy.is_empty() {
            tracing::info!(
                flag = "discovery-proxy",
                "flag accepted without effect in cairn: it serves v2 discovery only"
            );
        }
        Ok(())
    }
}

/// Whether `url` is a URL etcd would accept for a peer: `http` or `https`, a host and a port.
pub fn valid_peer_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<tonic::codegen::http::Uri>() else {
        return false;
    };
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https" | "unix" | "unixs"));
    let path_ok = matches!(uri.path(), "" | "/");
    scheme_ok && path_ok && uri.host().is_some_and(|h| !h.is_empty()) && uri.port_u16().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Only {
        #[command(flatten)]
        cluster: Cluster,
    }

    fn parse(args: &[&str]) -> Cluster {
        Only::try_parse_from(std::iter::once("cairn").chain(args.iter().copied()))
            .unwrap()
            .cluster
    }

    #[test]
    fn defaults_are_etcds() {
        let c = parse(&[]);
        assert!(c.pre_vote && c.strict_reconfig_check && c.initial_election_tick_advance);
        assert!(!c.force_new_cluster);
        assert_eq!(c.max_learners().unwrap(), 1);
        assert_eq!(c.discovery().unwrap(), Discovery::None);
        c.check().unwrap();
    }

    #[test]
    fn go_bools_take_the_bare_flag_and_an_explicit_value() {
        assert!(parse(&["--force-new-cluster"]).force_new_cluster);
        assert!(!parse(&["--pre-vote=false"]).pre_vote);
        assert!(!parse(&["--strict-reconfig-check=false"]).strict_reconfig_check);
    }

    #[test]
    fn discovery_is_one_way_at_most_and_v3_needs_a_token() {
        let v3 = parse(&[
            "--discovery-endpoints=http://a:2379,http://b:2379",
            "--discovery-token=t",
        ]);
        assert_eq!(
            v3.discovery().unwrap(),
            Discovery::V3 {
                endpoints: vec!["http://a:2379".into(), "http://b:2379".into()],
                token: "t".into()
            }
        );
        assert!(parse(&["--discovery-endpoints=http://a:2379"]).discovery().is_err());
        assert!(
            parse(&["--discovery-srv=example.com", "--discovery-endpoints=http://a:1"])
                .discovery()
                .is_err()
        );
        assert_eq!(
            parse(&["--discovery-srv=example.com", "--discovery-srv-name=x"])
                .discovery()
                .unwrap(),
            Discovery::Srv {
                domain: "example.com".into(),
                suffix: "x".into()
            }
        );
        assert!(parse(&["--discovery=https://discovery.etcd.io/x"]).discovery().is_err());
        assert!(parse(&["--max-learners=0"]).check().is_err());
    }

    #[test]
    fn v3_discovery_flags_are_checked_with_etcds_words() {
        // etcd's Config.Validate: the token and the endpoints go together, no endpoint is
        // empty; the endpoints are a set.
        let both = "both --discovery-token and --discovery-endpoints must be set";
        for args in [&["--discovery-token=t"][..], &["--discovery-endpoints=http://a:1"]] {
            let e = parse(args).discovery().unwrap_err();
            assert!(e.reason.contains(both), "{args:?}: {e}");
        }
        let e = parse(&["--discovery-endpoints=http://a:1,,http://b:1", "--discovery-token=t"])
            .discovery()
            .unwrap_err();
        assert_eq!(e.to_string(), "--discovery-endpoints: must not contain empty endpoints");
        let set = parse(&[
            "--discovery-endpoints=http://b:1,http://a:1,http://b:1",
            "--discovery-token=t",
        ]);
        assert_eq!(
            set.discovery().unwrap(),
            Discovery::V3 {
                endpoints: vec!["http://a:1".into(), "http://b:1".into()],
                token: "t".into()
            }
        );
    }

    #[test]
    fn the_discovery_client_takes_etcds_defaults_and_files() {
        let c = parse(&[]).discovery_client().unwrap();
        assert_eq!(
            (c.dial_timeout, c.request_timeout, c.keepalive_time, c.keepalive_timeout),
            (
                Duration::from_secs(2),
                Duration::from_secs(5),
                Duration::from_secs(2),
                Duration::from_secs(6)
            )
        );
        assert!(!c.secure && !c.skip_verify && c.credentials.is_none() && c.cacert.is_none());
        // A CA or a client certificate, or --discovery-insecure-transport=false, means TLS.
        assert!(parse(&["--discovery-cacert=ca.pem"]).discovery_client().unwrap().secure);
        assert!(
            parse(&["--discovery-insecure-transport=false"])
                .discovery_client()
                .unwrap()
                .secure
        );
        assert!(parse(&["--discovery-cert=c.pem"]).discovery_client().is_err());
        type Case<'a> = (&'a [&'a str], Option<(&'a str, &'a str)>);
        let table: [Case<'_>; 3] = [
            (
                &["--discovery-user=root", "--discovery-password=pw"],
                Some(("root", "pw")),
            ),
            (&["--discovery-user=root:pw"], Some(("root", "pw"))),
            (&["--discovery-user=root"], Some(("root", ""))),
        ];
        for (args, want) in table {
            let got = parse(args).discovery_client().unwrap().credentials;
            assert_eq!(got, want.map(|(u, p)| (u.to_string(), p.to_string())), "{args:?}");
        }
        assert!(parse(&["--discovery-password=pw"]).discovery_client().is_err());
        assert!(parse(&["--discovery-request-timeout=soon"]).check().is_err());
    }

    #[test]
    fn peer_urls_are_checked_as_etcd_does() {
        assert!(valid_peer_url("http://127.0.0.1:2380"));
        assert!(valid_peer_url("https://node-1.example:12380"));
        assert!(!valid_peer_url("127.0.0.1:2380"), "no scheme");
        assert!(!valid_peer_url("http://127.0.0.1"), "no port");
        assert!(!valid_peer_url("ftp://127.0.0.1:2380"));
        assert!(!valid_peer_url("http://127.0.0.1:2380/path"));
        assert!(!valid_peer_url(""));
    }
}
