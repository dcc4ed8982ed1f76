//! Every flag etcd 3.7.3 and 3.5.1 list in `--help` starts cairn: each is given alone, at a
//! valid value, to a fresh member, which must then serve; or, for the flags etcd 3.6 removed
//! and those that cannot work given alone, be refused with a line that says so.
//! No flag may be refused as unknown. The lists are read from the real binaries, which
//! tests/run-all.sh builds and installs (target/etcd-3.7, target/etcd-3.5).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use std::collections::BTreeMap;
use std::process::Command;

mod common;
#[path = "common/process.rs"]
mod process;

use common::Member;
use process::etcd_tool;

/// What starting cairn with a flag must do.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Serve, healthy.
    Serves,
    /// Exit at once, saying this.
    Refused(&'static str),
    /// The harness gives this flag to every member it starts (name, data directory, URLs,
    /// the initial cluster): every other start here exercises it.
    Harness,
    /// A test of its own checks it (it changes where the member serves); the comment beside
    /// the flag names the test.
    OwnTest,
}

/// The value each flag is given when etcd's default would not exercise it, and what cairn
/// must do with it. A flag not listed here gets the default etcd's help shows, and must serve.
fn overrides(dir: &std::path::Path) -> BTreeMap<&'static str, (String, Expect)> {
    use Expect::*;
    let serves = |v: &str| (v.to_string(), Serves);
    let config = dir.join("cairn.yml");
    std::fs::write(&config, "log-level: warn\nmax-txn-ops: 256\n").unwrap();
    let removed = "removed in etcd 3.6";
    let mut m: BTreeMap<&'static str, (String, Expect)> = BTreeMap::new();
    for harness in [
        "name",
        "data-dir",
        "listen-client-urls",
        "advertise-client-urls",
        "listen-peer-urls",
        "initial-advertise-peer-urls",
        "initial-cluster",
    ] {
        m.insert(harness, (String::new(), Harness));
    }
    // The config file alone decides; the harness's URLs are ignored with it, so it says
    // where to serve itself (see `config_file_member`).
    // a_config_file_alone_configures_the_member_and_flags_and_variables_are_ignored, below.
    m.insert("config-file", (config.display().to_string(), OwnTest));
    // serving_flags.rs: http_urls_take_the_http_endpoints_off_the_client_urls.
    m.insert("listen-client-http-urls", (String::new(), OwnTest));
    for flag in [
        "enable-v2",
        "experimental-enable-v2v3",
        "proxy",
        "proxy-dial-timeout",
        "proxy-failure-wait",
        "proxy-read-timeout",
        "proxy-refresh-interval",
        "proxy-write-timeout",
    ] {
        m.insert(flag, ("on".into(), Refused(removed)));
    }
    m.insert(
        "discovery",
        ("https://discovery.etcd.io/x".into(), Refused("v2 discovery")),
    );
    // Alone, a discovery flag has nothing to discover: refused with etcd's words. The
    // discovery tests (discovery.rs) give them something to discover.
    m.insert(
        "discovery-srv",
        (
            "example.com".into(),
            Refused("error querying DNS SRV records for _etcd-server"),
        ),
    );
    m.insert(
        "discovery-token",
        (
            "t".into(),
            Refused("both --discovery-token and --discovery-endpoints must be set"),
        ),
    );
    m.insert(
        "discovery-endpoints",
        ("http://127.0.0.1:1".into(), Refused("--discovery-token")),
    );
    // A member without data starts as a new one (cluster.rs forces a cluster with data).
    m.insert("force-new-cluster", ("true".into(), Serves));
    m.insert("enable-pprof", ("true".into(), Serves));
    m.insert("enable-log-rotation", ("true".into(), Refused("single file")));
    // Spans for a collector at etcd's default address, which nothing answers: the member
    // serves all the same (tracing.rs has a collector).
    m.insert("experimental-enable-distributed-tracing", ("true".into(), Serves));
    m.insert("enable-distributed-tracing", ("true".into(), Serves));
    for (flag, value) in [
        ("max-concurrent-streams", "1000"),
        ("backend-batch-interval", "10ms"),
        ("backend-batch-limit", "1000"),
        ("backend-bbolt-freelist-type", "array"),
        ("auto-compaction-mode", "revision"),
        ("auto-compaction-retention", "1h"),
        ("cors", "https://a.example"),
        ("host-whitelist", "localhost,127.0.0.1"),
        ("metrics", "extensive"),
        ("max-learners", "2"),
        ("pre-vote", "false"),
        ("strict-reconfig-check", "false"),
        ("initial-election-tick-advance", "false"),
        ("socket-reuse-port", "true"),
        ("socket-reuse-address", "true"),
        ("unsafe-no-fsync", "true"),
        ("enable-grpc-gateway", "false"),
        ("quota-backend-bytes", "-1"),
        ("log-outputs", "stderr"),
        ("log-level", "debug"),
        ("experimental-initial-corrupt-check", "true"),
        ("experimental-watch-progress-notify-interval", "5s"),
        ("experimental-warning-apply-duration", "200ms"),
        ("experimental-txn-mode-write-with-shared-buffer", "false"),
        ("discovery-srv-name", "x"),
        ("listen-metrics-urls", "FREE_PORT"),
        ("max-snapshots", "3"),
        ("max-wals", "3"),
        ("v2-deprecation", "write-only"),
        ("distributed-tracing-sampling-rate", "100"),
        // Listed without a default.
        ("bootstrap-defrag-threshold-megabytes", "100"),
        ("experimental-bootstrap-defrag-threshold-megabytes", "100"),
        ("compaction-sleep-interval", "10ms"),
        ("downgrade-check-time", "5s"),
        ("snapshot-catchup-entries", "1000"),
        ("enable-grpc-gateway", "true"),
        ("memory-mlock", "false"),
    ] {
        m.insert(flag, serves(value));
    }
    m
}

/// Each flag `--help` lists, with the default it shows (`--flag 'default'`). A flag listed
/// without one is given a value by [`overrides`].
fn listed(binary: &std::path::Path) -> BTreeMap<String, String> {
    let out = Command::new(binary).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let mut flags = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("  --") else {
            continue;
        };
        let (name, default) = match rest.split_once(' ') {
            Some((name, default)) => (name, default.trim().trim_matches('\'')),
            None => (rest, "NO DEFAULT"),
        };
        if name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            flags.insert(name.to_string(), default.to_string());
        }
    }
    flags
}

/// A flag's value, as an etcd command line gives it (an empty default as `--flag=`);
/// `math.MaxUint32` is what it says.
fn argument(flag: &str, value: &str) -> String {
    match value {
        "math.MaxUint32" => format!("--{flag}={}", u32::MAX),
        "FREE_PORT" => format!("--{flag}=http://127.0.0.1:{}", common::free_ports().0),
        _ => format!("--{flag}={value}"),
    }
}

/// Starts cairn with one flag and checks it does what `expect` says.
fn try_flag(flag: &str, value: &str, expect: Expect) -> Result<(), String> {
    let arg = argument(flag, value);
    match expect {
        Expect::Harness | Expect::OwnTest => Ok(()),
        Expect::Serves => {
            let outcome = std::panic::catch_unwind(|| {
                let mut member = Member::start("flags", &[arg.as_str()]);
                member.stop();
            });
            outcome.map_err(|_| format!("{arg}: cairn did not serve"))
        }
        Expect::Refused(why) => {
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("log");
            let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
                .arg("--data-dir")
                .arg(dir.path().join("d"))
                .args(["--listen-client-urls", "http://127.0.0.1:0"])
                .args(["--advertise-client-urls", "http://127.0.0.1:1"])
                .args(["--listen-peer-urls", "http://127.0.0.1:0"])
                .arg(&arg)
                .stdout(std::process::Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            // A refusal comes before anything is bound; a member that serves instead is
            // stopped once its patience is over.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break Some(status);
                }
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            };
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            if status.is_none_or(|s| s.success()) || !stderr.contains(why) {
                return Err(format!("{arg}: wanted a refusal saying {why:?}, got: {stderr}"));
            }
            if stderr.contains("unexpected argument") {
                return Err(format!("{arg}: refused as unknown"));
            }
            Ok(())
        }
    }
}

#[test]
fn every_flag_etcd_3_7_and_3_5_list_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = overrides(dir.path());
    let mut all = listed(&etcd_tool("etcd-3.7", "etcd", "tests/etcd-3.7/build.sh"));
    let v37 = all.len();
    for (flag, default) in listed(&etcd_tool("etcd-3.5", "etcd", "tests/etcd-3.5/install.sh")) {
        all.entry(flag).or_insert(default);
    }
    assert!(v37 > 100 && all.len() > 120, "too few flags read from --help: {all:?}");
    let jobs: Vec<(String, String, Expect)> = all
        .iter()
        .map(|(flag, default)| match overrides.get(flag.as_str()) {
            Some((value, expect)) => (flag.clone(), value.clone(), *expect),
            None => (flag.clone(), default.clone(), Expect::Serves),
        })
        .collect();
    // Four at a time: each start is a process with its own data directory and ports.
    let failures: Vec<String> = std::thread::scope(|s| {
        let chunks: Vec<_> = jobs.chunks(jobs.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|(flag, value, expect)| try_flag(flag, value, *expect).err())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} flags failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn a_config_file_alone_configures_the_member_and_flags_and_variables_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = common::free_ports();
    let config = dir.path().join("cairn.yml");
    std::fs::write(
        &config,
        format!(
            "name: filed\n\
             data-dir: {data}\n\
             listen-client-urls: http://127.0.0.1:{client}\n\
             advertise-client-urls: http://127.0.0.1:{client}\n\
             listen-peer-urls: http://127.0.0.1:{peer}\n\
             initial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
             initial-cluster: filed=http://127.0.0.1:{peer}\n\
             max-txn-ops: 3\n\
             log-outputs: [stderr]\n\
             proxy: 'off'\n",
            data = dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--config-file")
        .arg(&config)
        // Ignored: the file decides.
        .args(["--max-txn-ops", "1000", "--name", "flagged"])
        .env("ETCD_MAX_TXN_OPS", "2000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let endpoint = format!("127.0.0.1:{client}");
    let healthy = (0..600).any(|_| {
        let ok = common::http_get(client, "/health").is_ok_and(|(status, _)| status == 200);
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        ok
    });
    assert!(healthy, "the member the file describes did not serve");
    let members = common::json(common::etcdctl(&endpoint, &["member", "list", "-w", "json"], None));
    assert_eq!(members["members"][0]["name"], "filed");
    // The file's --max-txn-ops (3), not the flag's nor the variable's.
    let txn = "\nput a 1\nput b 2\nput c 3\nput d 4\n\n\n";
    common::fails(
        common::etcdctl(&endpoint, &["txn", "-i"], Some(txn)),
        "too many operations in txn request",
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// etcd's own sample configuration file, from etcd 3.7's published Go module (the root
/// module `go.etcd.io/etcd/v3`; 3.7.1 is its newest 3.7 release on the proxy).
fn etcds_sample_file() -> String {
    let out = Command::new("go")
        .args(["mod", "download", "-json", "go.etcd.io/etcd/v3@v3.7.1"])
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .current_dir(std::env::temp_dir())
        .output()
        .expect("go (tests/run-all.sh needs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let module: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = std::path::Path::new(module["Dir"].as_str().unwrap());
    std::fs::read_to_string(dir.join("etcd.conf.yml.sample")).unwrap()
}

#[test]
fn etcds_own_sample_configuration_file_is_read_as_etcd_reads_it_and_serves() {
    use clap::CommandFactory;
    let sample = etcds_sample_file();
    let command = cairn_server::config::Cli::command();
    let known = |flag: &str| command.get_arguments().any(|a| a.get_long() == Some(flag));
    let read = cairn_server::config::file::parse(&sample, known).unwrap();
    for expected in [
        "--name=default",
        "--heartbeat-interval=100",
        "--election-timeout=1000",
        "--initial-cluster-state=new",
        "--strict-reconfig-check=false",
        "--enable-pprof=true",
        "--client-cert-auth=false",
        "--peer-auto-tls=false",
        "--log-outputs=stderr",
        "--auto-compaction-retention=1",
        "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "--tls-max-version=TLS1.3",
    ] {
        assert!(
            read.args.iter().any(|a| a == expected),
            "{expected} not in {:?}",
            read.args
        );
    }
    // The v2 proxy's and v2 discovery's keys, which etcd 3.7 ignores too.
    for ignored in ["proxy:", "discovery-fallback:", "proxy-read-timeout:"] {
        assert!(
            read.ignored.iter().any(|i| i.starts_with(ignored)),
            "{:?}",
            read.ignored
        );
    }
    // The sample as an operator adapts it (ports, data directory) starts a member.
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = common::free_ports();
    let adapted = sample
        .replace("localhost:2380", &format!("127.0.0.1:{peer}"))
        .replace("localhost:2379", &format!("127.0.0.1:{client}"))
        .replace(
            "\ndata-dir:\n",
            &format!("\ndata-dir: {}\n", dir.path().join("data").display()),
        );
    let file = dir.path().join("etcd.conf.yml");
    std::fs::write(&file, adapted).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .arg("--config-file")
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let healthy = (0..600).any(|_| {
        let ok = common::http_get(client, "/health").is_ok_and(|(status, _)| status == 200);
        if !ok {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        ok
    });
    let endpoint = format!("127.0.0.1:{client}");
    let put = healthy.then(|| common::etcdctl(&endpoint, &["put", "from-sample", "yes"], None));
    let _ = child.kill();
    let _ = child.wait();
    assert!(healthy, "the member etcd's sample describes did not serve");
    common::ok(put.unwrap());
}
