//! DNS SRV discovery (`--discovery-srv`, `--discovery-srv-name`), as etcd's
//! `GetDNSClusterNames` and `srv.GetCluster` do it: the initial cluster is every target of the
//! SRV records `_etcd-server-ssl[-<suffix>]._tcp.<domain>` (as `https://` peer URLs) and
//! `_etcd-server[-<suffix>]._tcp.<domain>` (as `http://`), `target:port` each.
//!
//! This member is the target whose address is one of its `--initial-advertise-peer-urls`'
//! (both sides resolved, as etcd resolves them): it is named `--name` there, and the others
//! `0`, `1`, … until they publish their names. Its URL in the cluster is the record's, not the
//! advertised one, so every member derives the same IDs from the same records.
//!
//! Records are looked up with hickory's resolver, configured from `/etc/resolv.conf` as Go's
//! resolver is; targets and advertised hosts are resolved as the peer transport will dial
//! them (the system's `getaddrinfo`, `/etc/hosts` first).

use std::net::SocketAddr;

use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;

use super::DiscoveryError;

/// The initial cluster the SRV records under `domain` describe, with this member (`name`,
/// advertising `advertised`) in it, in `--initial-cluster`'s form.
pub async fn initial_cluster(
    name: &str,
    domain: &str,
    suffix: &str,
    advertised: &[String],
) -> Result<String, DiscoveryError> {
    let resolver = TokioResolver::builder_tokio()
        .and_then(|b| b.build())
        .map_err(|e| DiscoveryError::Resolver(e.to_string()))?;
    let mut mine = Vec::new();
    for url in advertised {
        let addresses = match host_port(url) {
            Some((host, port)) => resolve(host, port).await,
            None => Err(format!("{url} has no host and port")),
        };
        let addresses = addresses.map_err(|reason| DiscoveryError::Unresolved {
            url: url.clone(),
            reason,
        })?;
        mine.push((url.as_str(), addresses));
    }
    let suffix = match suffix {
        "" => String::new(),
        s => format!("-{s}"),
    };
    let mut members = Vec::new();
    let mut errors = Vec::new();
    let mut others = 0usize;
    for (scheme, service) in [
        ("https", format!("etcd-server-ssl{suffix}")),
        ("http", format!("etcd-server{suffix}")),
    ] {
        let query = format!("_{service}._tcp.{domain}");
        let targets = match lookup(&resolver, &query).await {
            Ok(targets) => targets,
            Err(e) => {
                errors.push(format!("error querying DNS SRV records for _{service} {e}"));
                continue;
            }
        };
        let mut found = 0usize;
        let mut last_error = None;
        for (target, port) in targets {
            let host = join_host_port(&target, port);
            let url = format!("{scheme}://{host}");
            let addresses = match resolve(&target, port).await {
                Ok(a) => a,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            let own = mine
                .iter()
                .find(|(_, theirs)| theirs.iter().any(|a| addresses.contains(a)))
                .map(|(u, _)| *u);
            let member = match own {
                Some(u) if !u.starts_with(&format!("{scheme}://")) => {
                    last_error = Some(format!(
                        "bootstrap at {url} from DNS for {service} has scheme mismatch with expected peer {u}"
                    ));
                    continue;
                }
                Some(_) => name.to_string(),
                None => {
                    others += 1;
                    (others - 1).to_string()
                }
            };
            tracing::info!(node = %format!("{member}={url}"), "got bootstrap from DNS for etcd-server");
            members.push(format!("{member}={url}"));
            found += 1;
        }
        if found == 0 {
            let why = last_error.unwrap_or_else(|| "no record".into());
            errors.push(format!("error querying DNS SRV records for _{service} {why}"));
        } else if let Some(e) = last_error {
            tracing::warn!(service = %service, error = %e, "an SRV record was left out");
        }
    }
    if members.is_empty() {
        return Err(DiscoveryError::NoSrvRecords(errors));
    }
    for e in &errors {
        tracing::info!(domain, error = %e, "SRV discovery: one of the two services gave no member");
    }
    if !members
        .iter()
        .any(|m| m.split_once('=').is_some_and(|(n, _)| n == name))
    {
        return Err(DiscoveryError::NotInSrvRecords { name: name.to_string() });
    }
    Ok(members.join(","))
}

/// The targets of the SRV records named `query`: `(host without the final dot, port)`, by
/// priority, then heavier weight first (Go shuffles by weight; a fixed order makes every
/// member read the same cluster).
async fn lookup(resolver: &TokioResolver, query: &str) -> Result<Vec<(String, u16)>, String> {
    let answer = resolver
        .srv_lookup(query)
        .await
        .map_err(|e| match e.is_no_records_found() {
            true => format!("lookup {query}: no such host"),
            false => format!("lookup {query}: {e}"),
        })?;
    let mut records: Vec<_> = answer
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some((
                srv.priority,
                std::cmp::Reverse(srv.weight),
                srv.target.to_string().trim_end_matches('.').to_string(),
                srv.port,
            )),
            _ => None,
        })
        .collect();
    records.sort();
    records.dedup();
    Ok(records.into_iter().map(|(_, _, host, port)| (host, port)).collect())
}

/// The addresses `host:port` resolves to, as the peer transport's dialing resolves them.
async fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    match tokio::net::lookup_host((host.trim_matches(['[', ']']), port)).await {
        Ok(addresses) => Ok(addresses.collect()),
        Err(e) => Err(format!("lookup {host}: {e}")),
    }
}

/// The host and port of an `http(s)://host:port` URL.
fn host_port(url: &str) -> Option<(&str, u16)> {
    let authority = url.split_once("://")?.1.trim_end_matches('/');
    let (host, port) = authority.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// Go's `net.JoinHostPort`: an IPv6 address in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_and_port_as_go_joins_them() {
        assert_eq!(host_port("http://10.0.0.1:2380"), Some(("10.0.0.1", 2380)));
        assert_eq!(
            host_port("https://m1.example.com:2380/"),
            Some(("m1.example.com", 2380))
        );
        assert_eq!(host_port("http://[::1]:2380"), Some(("[::1]", 2380)));
        assert_eq!(host_port("http://m1"), None);
        assert_eq!(join_host_port("m1.example.com", 2380), "m1.example.com:2380");
        assert_eq!(join_host_port("::1", 2380), "[::1]:2380");
    }
}
