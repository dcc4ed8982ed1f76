//! What the member tells its operators: `--metrics`, `--enable-pprof`, log rotation, and
//! etcd 3.6's distributed-tracing flags. Each is etcd's flag with etcd's default.

use clap::{ArgAction, Args, ValueEnum};

use super::value::{bad, BadFlag};
use super::Compat;

/// `--log-level`: the least severe events logged; `panic` and `fatal` log as `error`.
// No variant docs: clap turns doc comments into help text, which would describe each value
// in `--help`.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
    Panic,
    Fatal,
}

/// `--log-format`: etcd's JSON lines, or lines for people.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Json,
    Console,
}

/// The `--log-outputs` value that sends logs to journald, as etcd names it.
pub const JOURNAL: &str = "systemd/journal";

/// `--log-rotation-config-json`, as lumberjack takes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rotation {
    /// Megabytes a file may reach before it is rotated; 0 is lumberjack's default, 100.
    #[serde(default = "Rotation::default_max_size")]
    pub maxsize: u64,
    /// Days a rotated file is kept; 0 keeps them all.
    #[serde(default)]
    pub maxage: u64,
    /// Rotated files kept; 0 keeps them all.
    #[serde(default)]
    pub maxbackups: u64,
    /// Rotated files are named by local time, not UTC.
    #[serde(default)]
    pub localtime: bool,
    /// Rotated files are gzipped.
    #[serde(default)]
    pub compress: bool,
}

impl Rotation {
    pub(crate) fn default_max_size() -> u64 {
        100
    }
}

/// What the tracing flags ask for ([`Observability::tracing`]; `tracing_export` sends them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracing {
    /// The collector, `host:port` (or `http://host:port`), spoken to in plaintext gRPC as
    /// etcd speaks to it.
    pub address: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// The `service.instance.id` resource attribute; none when empty, as in etcd.
    pub instance_id: String,
    /// Traces started here that are sampled, per million. Invariant: at most 1,000,000.
    pub sampling_rate: u32,
}

/// `--metrics`: how much detail `/metrics` gives.
#[allow(missing_docs)] // clap turns variant docs into help text
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MetricsLevel {
    Basic,
    Extensive,
}

/// The flags of this module.
#[allow(missing_docs)] // the tracing flags are documented as a group, on the first
#[derive(Debug, Args)]
pub struct Observability {
    /// Detail of the exported metrics: extensive adds the gRPC handling-time histograms.
    #[arg(long, env = "ETCD_METRICS", value_enum, default_value = "basic")]
    pub metrics: MetricsLevel,
    /// Serve CPU and heap profiles under /debug/pprof/ on the client URLs.
    #[arg(long, env = "ETCD_ENABLE_PPROF", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub enable_pprof: bool,
    /// Rotate the one file among --log-outputs, as --log-rotation-config-json says.
    #[arg(long, env = "ETCD_ENABLE_LOG_ROTATION", action = ArgAction::Set, num_args = 0..=1, default_value = "false", default_missing_value = "true")]
    pub enable_log_rotation: bool,
    /// Log rotation: maxsize (MB), maxage (days, 0 no limit), maxbackups (0 no limit),
    /// localtime, compress.
    #[arg(
        long,
        env = "ETCD_LOG_ROTATION_CONFIG_JSON",
        default_value = r#"{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}"#
    )]
    pub log_rotation_config_json: String,
    /// Distributed tracing (OpenTelemetry over OTLP/gRPC), once --enable-distributed-tracing
    /// turns it on: the collector's address, the service name and this instance's ID, and
    /// samples per million spans.
    #[arg(long, env = "ETCD_DISTRIBUTED_TRACING_ADDRESS", default_value = "localhost:4317")]
    pub distributed_tracing_address: String,
    #[arg(long, env = "ETCD_DISTRIBUTED_TRACING_SERVICE_NAME", default_value = "etcd")]
    pub distributed_tracing_service_name: String,
    #[arg(long, env = "ETCD_DISTRIBUTED_TRACING_INSTANCE_ID", default_value = "")]
    pub distributed_tracing_instance_id: String,
    #[arg(long, env = "ETCD_DISTRIBUTED_TRACING_SAMPLING_RATE", default_value_t = 0)]
    pub distributed_tracing_sampling_rate: i64,
}

impl Observability {
    /// The log rotation asked for, checked as etcd checks it: `None` unless enabled.
    pub fn rotation(&self, log_outputs: &[String]) -> Result<Option<Rotation>, BadFlag> {
        let rotation: Rotation = serde_json::from_str(&self.log_rotation_config_json).map_err(|e| {
            bad(
                "log-rotation-config-json",
                format!("improperly formatted log rotation config: {e}"),
            )
        })?;
        if !self.enable_log_rotation {
            return Ok(None);
        }
        let files = log_outputs
            .iter()
            .filter(|o| !matches!(o.as_str(), "default" | "stderr" | "stdout" | JOURNAL))
            .count();
        if files != 1 || log_outputs.len() != 1 {
            return Err(bad(
                "enable-log-rotation",
                "log rotation is only supported with a single file target in --log-outputs",
            ));
        }
        Ok(Some(rotation))
    }

    /// Checks every value.
    pub fn check(&self, log_outputs: &[String]) -> Result<(), BadFlag> {
        self.rotation(log_outputs)?;
        Ok(())
    }

    /// The distributed tracing asked for: `None` unless `--enable-distributed-tracing` (or
    /// etcd 3.5's `--experimental-enable-distributed-tracing`) turns it on. As in etcd 3.6, an
    /// `--experimental-distributed-tracing-*` flag given wins over the newer name, and the
    /// sampling rate is checked only when tracing is on.
    pub fn tracing(&self, compat: &Compat) -> Result<Option<Tracing>, BadFlag> {
        let on = compat
            .experimental_enable_distributed_tracing
            .or(compat.enable_distributed_tracing)
            .unwrap_or(false);
        if !on {
            return Ok(None);
        }
        let (flag, rate) = match compat.experimental_distributed_tracing_sampling_rate {
            Some(rate) => ("experimental-distributed-tracing-sampling-rate", rate),
            None => (
                "distributed-tracing-sampling-rate",
                self.distributed_tracing_sampling_rate,
            ),
        };
        let sampling_rate = u32::try_from(rate)
            .ok()
            .filter(|rate| *rate <= 1_000_000)
            .ok_or_else(|| bad(flag, "must be between 0 and 1000000 samples per million"))?;
        let pick = |old: &Option<String>, new: &String| old.clone().unwrap_or_else(|| new.clone());
        Ok(Some(Tracing {
            address: pick(
                &compat.experimental_distributed_tracing_address,
                &self.distributed_tracing_address,
            ),
            service_name: pick(
                &compat.experimental_distributed_tracing_service_name,
                &self.distributed_tracing_service_name,
            ),
            instance_id: pick(
                &compat.experimental_distributed_tracing_instance_id,
                &self.distributed_tracing_instance_id,
            ),
            sampling_rate,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Only {
        #[command(flatten)]
        o: Observability,
    }

    fn parse(args: &[&str]) -> Observability {
        Only::try_parse_from(std::iter::once("cairn").chain(args.iter().copied()))
            .unwrap()
            .o
    }

    #[test]
    fn rotation_needs_exactly_one_file_output_as_in_etcd() {
        let file = vec!["/var/log/cairn.log".to_string()];
        assert_eq!(parse(&[]).rotation(&file).unwrap(), None, "off by default");
        let r = parse(&[
            "--enable-log-rotation",
            r#"--log-rotation-config-json={"maxsize": 1, "maxbackups": 3}"#,
        ])
        .rotation(&file)
        .unwrap()
        .unwrap();
        assert_eq!((r.maxsize, r.maxbackups, r.maxage), (1, 3, 0));
        let on = parse(&["--enable-log-rotation"]);
        assert!(on.rotation(&["stderr".to_string()]).is_err());
        assert!(on.rotation(&[file[0].clone(), "stderr".to_string()]).is_err());
        assert!(parse(&["--log-rotation-config-json=nope"]).rotation(&file).is_err());
    }

    #[test]
    fn tracing_is_off_unless_enabled_and_etcd_3_5s_names_win_as_in_etcd_3_6() {
        #[derive(Debug, Parser)]
        struct Both {
            #[command(flatten)]
            o: Observability,
            #[command(flatten)]
            c: Compat,
        }
        let tracing = |args: &[&str]| {
            let both = Both::try_parse_from(std::iter::once("cairn").chain(args.iter().copied())).unwrap();
            both.o.tracing(&both.c)
        };
        assert_eq!(tracing(&[]).unwrap(), None);
        assert_eq!(tracing(&["--enable-distributed-tracing=false"]).unwrap(), None);
        // Not checked while off, as in etcd.
        assert_eq!(tracing(&["--distributed-tracing-sampling-rate=-1"]).unwrap(), None);
        let on = tracing(&["--enable-distributed-tracing"]).unwrap().unwrap();
        assert_eq!(
            on,
            Tracing {
                address: "localhost:4317".into(),
                service_name: "etcd".into(),
                instance_id: String::new(),
                sampling_rate: 0,
            }
        );
        let old = tracing(&[
            "--experimental-enable-distributed-tracing",
            "--distributed-tracing-address=a:1",
            "--experimental-distributed-tracing-address=b:2",
            "--distributed-tracing-instance-id=n1",
            "--experimental-distributed-tracing-sampling-rate=1000000",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (old.address.as_str(), old.instance_id.as_str(), old.sampling_rate),
            ("b:2", "n1", 1_000_000)
        );
        for rate in ["-1", "1000001"] {
            let e = tracing(&[
                "--enable-distributed-tracing",
                &format!("--distributed-tracing-sampling-rate={rate}"),
            ])
            .unwrap_err();
            assert_eq!(e.flag, "distributed-tracing-sampling-rate");
        }
    }

    #[test]
    fn metrics_take_basic_or_extensive() {
        assert_eq!(parse(&[]).metrics, MetricsLevel::Basic);
        assert_eq!(parse(&["--metrics=extensive"]).metrics, MetricsLevel::Extensive);
        assert!(Only::try_parse_from(["cairn", "--metrics=all"]).is_err());
    }
}
