//! `--config-file`: etcd's YAML configuration, read into the same flags the command line
//! gives, so a file is checked exactly as flags are.
//!
//! Each key is etcd 3.7's (`embed.Config`'s JSON tags), with etcd's value forms:
//! - most keys are the flag of the same name (`name: n1` is `--name=n1`); URL lists are one
//!   comma-separated string, and `log-outputs`, `cipher-suites`, `allowed-cn` and
//!   `allowed-hostname` are YAML sequences;
//! - `heartbeat-interval` and `election-timeout` are milliseconds, as on the command line;
//!   other durations are integer nanoseconds, as etcd reads them (cairn also takes a Go
//!   duration string such as `5s`, which etcd refuses);
//! - `client-transport-security` and `peer-transport-security` nest the TLS keys,
//!   `socket-options` the socket flags and `discovery-config` v3 discovery's client.
//!
//! Keys etcd 3.7 ignores (the v2 proxy's, v2 discovery's, `enable-v2`; etcd's own sample file
//! still has them) are ignored too, and so are keys nobody knows, each with a warning where
//! etcd says nothing. When a file is given, the command line's other flags and the `ETCD_*`
//! variables are ignored, as in etcd; only `--raft-read-timeout` and `--raft-write-timeout`
//! still apply, as they do in etcd.

use std::path::{Path, PathBuf};

use serde_yaml_ng::Value;

/// A configuration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not YAML, or not a mapping of etcd's keys to values of their form.
    #[error("error unmarshaling {path}: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the key.
        reason: String,
    },
}

/// The file read as command-line flags (`--key=value`), and a warning for each key ignored.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct FromFile {
    /// The flags, in the file's order.
    pub args: Vec<String>,
    /// Keys ignored, each with why.
    pub ignored: Vec<String>,
}

/// Keys whose value is a `time.Duration` in etcd's file: integer nanoseconds.
const DURATIONS: &[&str] = &[
    "backend-batch-interval",
    "grpc-keepalive-min-time",
    "grpc-keepalive-interval",
    "grpc-keepalive-timeout",
    "corrupt-check-time",
    "compact-hash-check-time",
    "compaction-sleep-interval",
    "watch-progress-notify-interval",
    "warning-apply-duration",
    "warning-unary-request-duration",
    "downgrade-check-time",
    "experimental-corrupt-check-time",
    "experimental-compact-hash-check-time",
    "experimental-compaction-sleep-interval",
    "experimental-watch-progress-notify-interval",
    "experimental-warning-apply-duration",
    "experimental-warning-unary-request-duration",
    "experimental-downgrade-check-time",
    "discovery-dial-timeout",
    "discovery-request-timeout",
    "discovery-keepalive-time",
    "discovery-keepalive-timeout",
];

/// Keys etcd 3.7 ignores in a file: the v2 API's, the v2 proxy's and v2 discovery's.
const IGNORED_AS_IN_ETCD: &[&str] = &[
    "enable-v2",
    "experimental-enable-v2v3",
    "proxy",
    "proxy-failure-wait",
    "proxy-refresh-interval",
    "proxy-dial-timeout",
    "proxy-write-timeout",
    "proxy-read-timeout",
    "discovery",
    "discovery-fallback",
    "discovery-proxy",
];

/// The TLS keys of `client-transport-security` and `peer-transport-security`, with the flag
/// each is on the client and on the peer port (`None`: etcd has no flag for it there).
const TRANSPORT_SECURITY: &[(&str, Option<&str>, &str)] = &[
    ("cert-file", Some("cert-file"), "peer-cert-file"),
    ("key-file", Some("key-file"), "peer-key-file"),
    ("client-cert-file", Some("client-cert-file"), "peer-client-cert-file"),
    ("client-key-file", Some("client-key-file"), "peer-client-key-file"),
    ("client-cert-auth", Some("client-cert-auth"), "peer-client-cert-auth"),
    ("trusted-ca-file", Some("trusted-ca-file"), "peer-trusted-ca-file"),
    ("auto-tls", Some("auto-tls"), "peer-auto-tls"),
    ("allowed-cn", None, "peer-cert-allowed-cn"),
    (
        "allowed-hostname",
        Some("client-cert-allowed-hostname"),
        "peer-cert-allowed-hostname",
    ),
    (
        "skip-client-san-verification",
        None,
        "peer-skip-client-san-verification",
    ),
];

/// Reads `path` into flags. `known(flag)` says whether the command line has `--flag`.
pub fn read(path: &Path, known: impl Fn(&str) -> bool) -> Result<FromFile, ConfigFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, known).map_err(|reason| ConfigFileError::Parse {
        path: path.to_path_buf(),
        reason,
    })
}

/// Reads a file's text into flags (see [`read`]).
pub fn parse(text: &str, known: impl Fn(&str) -> bool) -> Result<FromFile, String> {
    let root: Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    let mut out = FromFile::default();
    let entries = match root {
        Value::Mapping(m) => m,
        // An empty file: every default.
        Value::Null => return Ok(out),
        _ => return Err("the file is not a mapping of keys to values".into()),
    };
    for (key, value) in entries {
        let key = key_name(&key)?;
        match key.as_str() {
            "client-transport-security" | "peer-transport-security" => {
                let peer = key.starts_with("peer");
                for (inner, v) in mapping(&key, value)? {
                    let inner = key_name(&inner)?;
                    let Some((_, client_flag, peer_flag)) = TRANSPORT_SECURITY.iter().find(|(k, _, _)| *k == inner)
                    else {
                        out.ignored.push(format!("{key}.{inner}: no such key"));
                        continue;
                    };
                    match if peer { Some(*peer_flag) } else { *client_flag } {
                        Some(flag) => push(&mut out, flag, &v)?,
                        None => out
                            .ignored
                            .push(format!("{key}.{inner}: etcd has no such setting for clients")),
                    }
                }
            }
            "socket-options" => {
                for (inner, v) in mapping(&key, value)? {
                    match key_name(&inner)?.as_str() {
                        "reuse-port" => push(&mut out, "socket-reuse-port", &v)?,
                        "reuse-address" => push(&mut out, "socket-reuse-address", &v)?,
                        other => out.ignored.push(format!("socket-options.{other}: no such key")),
                    }
                }
            }
            "discovery-config" => discovery_config(&mut out, value)?,
            k if IGNORED_AS_IN_ETCD.contains(&k) => {
                if !value.is_null() {
                    out.ignored.push(format!("{k}: etcd 3.6 removed it"));
                }
            }
            k if known(k) => push(&mut out, k, &value)?,
            k => out.ignored.push(format!("{k}: no such key")),
        }
    }
    Ok(out)
}

/// `discovery-config`: `token`, and `client` (etcd's clientv3 `ConfigSpec`).
fn discovery_config(out: &mut FromFile, value: Value) -> Result<(), String> {
    for (k, v) in mapping("discovery-config", value)? {
        match key_name(&k)?.as_str() {
            "token" => push(out, "discovery-token", &v)?,
            "client" => {
                for (k, v) in mapping("discovery-config.client", v)? {
                    match key_name(&k)?.as_str() {
                        "endpoints" => push(out, "discovery-endpoints", &v)?,
                        "dial-timeout" => push(out, "discovery-dial-timeout", &v)?,
                        "request-timeout" => push(out, "discovery-request-timeout", &v)?,
                        "keepalive-time" => push(out, "discovery-keepalive-time", &v)?,
                        "keepalive-timeout" => push(out, "discovery-keepalive-timeout", &v)?,
                        "secure" => {
                            for (k, v) in mapping("discovery-config.client.secure", v)? {
                                match key_name(&k)?.as_str() {
                                    "cert" => push(out, "discovery-cert", &v)?,
                                    "key" => push(out, "discovery-key", &v)?,
                                    "cacert" => push(out, "discovery-cacert", &v)?,
                                    "insecure-transport" => push(out, "discovery-insecure-transport", &v)?,
                                    "insecure-skip-tls-verify" => push(out, "discovery-insecure-skip-tls-verify", &v)?,
                                    other => out
                                        .ignored
                                        .push(format!("discovery-config.client.secure.{other}: no such key")),
                                }
                            }
                        }
                        "auth" => {
                            for (k, v) in mapping("discovery-config.client.auth", v)? {
                                match key_name(&k)?.as_str() {
                                    "username" => push(out, "discovery-user", &v)?,
                                    "password" => push(out, "discovery-password", &v)?,
                                    other => out
                                        .ignored
                                        .push(format!("discovery-config.client.auth.{other}: not taken by cairn")),
                                }
                            }
                        }
                        other => out
                            .ignored
                            .push(format!("discovery-config.client.{other}: not taken by cairn")),
                    }
                }
            }
            other => out.ignored.push(format!("discovery-config.{other}: no such key")),
        }
    }
    Ok(())
}

/// A key as etcd matches it: a string, case-insensitive.
fn key_name(key: &Value) -> Result<String, String> {
    match key {
        Value::String(s) => Ok(s.to_ascii_lowercase()),
        other => Err(format!("{other:?} is not a key name")),
    }
}

/// The entries of a nested mapping (none for an empty one).
fn mapping(key: &str, value: Value) -> Result<serde_yaml_ng::Mapping, String> {
    match value {
        Value::Mapping(m) => Ok(m),
        Value::Null => Ok(serde_yaml_ng::Mapping::new()),
        _ => Err(format!("invalid {key}: it is not a mapping")),
    }
}

/// Adds `--flag=value`, the value as the flag takes it; a null value leaves the default.
fn push(out: &mut FromFile, flag: &str, value: &Value) -> Result<(), String> {
    let text = match value {
        Value::Null => return Ok(()),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if DURATIONS.contains(&flag) => match n.as_u64() {
            Some(nanos) => format!("{nanos}ns"),
            None => return Err(format!("{flag}: {n} is not a duration in nanoseconds")),
        },
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Sequence(items) => {
            let mut texts = Vec::new();
            for item in items {
                match item {
                    Value::String(s) => texts.push(s.clone()),
                    Value::Number(n) => texts.push(n.to_string()),
                    other => return Err(format!("{flag}: {other:?} is not a string")),
                }
            }
            texts.join(",")
        }
        other => return Err(format!("{flag}: {other:?} is not a value")),
    };
    out.args.push(format!("--{flag}={text}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(flag: &str) -> bool {
        !["teleport", "client-transport-security", "peer-transport-security"].contains(&flag)
    }

    #[test]
    fn keys_become_flags_with_etcds_value_forms() {
        let file = parse(
            "name: n1\n\
             heartbeat-interval: 100\n\
             listen-client-urls: http://a:2379,http://b:2379\n\
             log-outputs: [stderr, /var/log/cairn.log]\n\
             watch-progress-notify-interval: 600000000000\n\
             grpc-keepalive-min-time: 5s\n\
             auto-compaction-retention: 1\n\
             strict-reconfig-check: false\n\
             wal-dir:\n",
            known,
        )
        .unwrap();
        assert_eq!(
            file.args,
            [
                "--name=n1",
                "--heartbeat-interval=100",
                "--listen-client-urls=http://a:2379,http://b:2379",
                "--log-outputs=stderr,/var/log/cairn.log",
                "--watch-progress-notify-interval=600000000000ns",
                "--grpc-keepalive-min-time=5s",
                "--auto-compaction-retention=1",
                "--strict-reconfig-check=false",
            ]
        );
        assert!(file.ignored.is_empty());
    }

    #[test]
    fn transport_security_nests_each_ports_tls_keys() {
        let file = parse(
            "client-transport-security:\n  cert-file: c.pem\n  client-cert-auth: true\n  allowed-cn: [x]\n\
             peer-transport-security:\n  cert-file: p.pem\n  allowed-cn: [a, b]\n  auto-tls: false\n\
             socket-options:\n  reuse-port: true\n",
            known,
        )
        .unwrap();
        assert_eq!(
            file.args,
            [
                "--cert-file=c.pem",
                "--client-cert-auth=true",
                "--peer-cert-file=p.pem",
                "--peer-cert-allowed-cn=a,b",
                "--peer-auto-tls=false",
                "--socket-reuse-port=true",
            ]
        );
        assert_eq!(file.ignored.len(), 1, "client allowed-cn: {:?}", file.ignored);
    }

    #[test]
    fn discovery_config_nests_the_v3_client() {
        let file = parse(
            "discovery-config:\n  token: t\n  client:\n    endpoints: [http://a:2379]\n    dial-timeout: 2000000000\n    \
             secure:\n      insecure-transport: true\n    auth:\n      username: u\n",
            known,
        )
        .unwrap();
        assert_eq!(
            file.args,
            [
                "--discovery-token=t",
                "--discovery-endpoints=http://a:2379",
                "--discovery-dial-timeout=2000000000ns",
                "--discovery-insecure-transport=true",
                "--discovery-user=u",
            ]
        );
    }

    #[test]
    fn keys_etcd_ignores_or_nobody_knows_are_ignored_with_a_warning() {
        let file = parse(
            "proxy: 'off'\ndiscovery-fallback: 'proxy'\nteleport: yes\nName: n\n",
            known,
        )
        .unwrap();
        assert_eq!(file.args, ["--name=n"], "keys match case-insensitively");
        assert_eq!(file.ignored.len(), 3, "{:?}", file.ignored);
    }

    #[test]
    fn malformed_files_are_refused_with_the_reason() {
        assert!(parse("- a\n- b\n", known).is_err());
        assert!(parse("name: [unclosed\n", known).is_err());
        assert!(parse("peer-transport-security: yes\n", known).is_err());
        assert!(
            parse("grpc-keepalive-time: -1\n", |_| true).is_ok(),
            "not a duration key"
        );
        assert!(parse("grpc-keepalive-interval: -1\n", known).is_err());
        assert_eq!(parse("", known).unwrap(), FromFile::default());
    }
}
