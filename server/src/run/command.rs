//! The `cairn` command line: configuration read from flags, `ETCD_*` variables or a config
//! file, logging set up, then a member run until it is stopped, or an offline tool
//! (`cairn snapshot restore|status`, `cairn check disk`).

use std::process::ExitCode;

use crate::config::{env, file as config_file, CheckCommand, Cli, Command, Invocation, SnapshotCommand};
use clap::{CommandFactory, FromArgMatches};

/// What was learned while reading the configuration, logged once logging is set up.
#[derive(Default)]
struct Notes {
    config_file: Option<std::path::PathBuf>,
    ignored_keys: Vec<String>,
    env: env::EnvReport,
}

/// The flags from the command line and the environment, or from `--config-file`.
fn configuration() -> Result<(Cli, Notes), String> {
    let invocation = Invocation::current();
    let matches = invocation.command(Cli::command()).get_matches();
    if let Some(version) = invocation.version_asked(&matches) {
        print!("{version}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        std::process::exit(0);
    }
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    cli.flags.invocation = invocation;
    let file = cli.flags.config_file.clone().filter(|p| !p.as_os_str().is_empty());
    let (None, Some(path)) = (&cli.command, file) else {
        let env = match cli.command {
            None => env::check(&Cli::command(), &matches, std::env::vars_os()),
            Some(_) => env::EnvReport::default(),
        };
        return Ok((
            cli,
            Notes {
                env,
                ..Notes::default()
            },
        ));
    };
    // The file alone decides, as in etcd: no flag and no variable is read with it.
    let command = Cli::command().mut_args(|a| a.env(None));
    let known = |flag: &str| command.get_arguments().any(|a| a.get_long() == Some(flag));
    let file = config_file::read(&path, known).map_err(|e| e.to_string())?;
    let from_file = command
        .clone()
        .try_get_matches_from(std::iter::once("cairn".to_string()).chain(file.args))
        .map_err(|e| format!("{}: {}", path.display(), e.render()))?;
    let mut from_file = Cli::from_arg_matches(&from_file).map_err(|e| e.to_string())?;
    from_file.flags.invocation = invocation;
    // etcd's peer connection timeouts are globals its file does not reach: the command
    // line's still apply.
    from_file.flags.transport.raft_read_timeout = cli.flags.transport.raft_read_timeout;
    from_file.flags.transport.raft_write_timeout = cli.flags.transport.raft_write_timeout;
    let notes = Notes {
        config_file: Some(path),
        ignored_keys: file.ignored,
        env: env::EnvReport::default(),
    };
    Ok((from_file, notes))
}

/// `cairn check disk`: the report, and exit 0 only for a fit disk (2 when the check could not
/// run).
fn check_disk(args: &crate::config::DiskArgs) -> ExitCode {
    match crate::run::disk_check::run(args) {
        Ok(report) => {
            if args.json {
                println!("{}", report.json());
            } else {
                print!("{}", report.text());
            }
            match report.fit() {
                true => ExitCode::SUCCESS,
                false => ExitCode::from(1),
            }
        }
        Err(e) => {
            eprintln!("cairn: check disk: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the `cairn` command line (the process's arguments and environment) to its end: a
/// member until it is stopped, or an offline tool. The `cairn` binary is this function.
pub fn run_command_line() -> ExitCode {
    let (cli, notes) = match configuration() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cairn: {e}");
            return ExitCode::from(1);
        }
    };
    let f = &cli.flags;
    // A serving member's spans (not the offline tools'), sent until the end of main, where
    // dropping the exporter sends what is still queued.
    let export = match cli.command {
        None => f
            .observability
            .tracing(&f.compat)
            .map_err(|e| e.to_string())
            .and_then(|settings| {
                settings
                    .map(|s| crate::run::tracing_export::Exporter::start(s).map_err(|e| e.to_string()))
                    .transpose()
            }),
        Some(_) => Ok(None),
    };
    let logged = export.and_then(|export| {
        f.observability
            .rotation(&f.log_outputs)
            .map_err(|e| e.to_string())
            .and_then(|rotation| {
                let logs = crate::run::logging::Logs {
                    level: f.log_level,
                    format: f.log_format,
                    outputs: &f.log_outputs,
                    rotation: rotation.as_ref(),
                };
                crate::run::logging::init(&logs, export.as_ref())
            })
            .map(|()| export)
    });
    let export = match logged {
        Ok(export) => export,
        Err(e) => {
            eprintln!("cairn: {e}");
            return ExitCode::from(1);
        }
    };
    if let Some(s) = export.as_ref().map(|e| e.settings()) {
        tracing::info!(
            address = %s.address,
            service_name = %s.service_name,
            service_instance_id = %s.instance_id,
            sampling_rate = s.sampling_rate,
            "distributed tracing setup enabled"
        );
    }
    if let Some(path) = &notes.config_file {
        tracing::info!(
            path = %path.display(),
            "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided"
        );
    }
    for key in &notes.ignored_keys {
        tracing::warn!(key = %key, "configuration file key ignored");
    }
    for variable in &notes.env.unrecognized {
        tracing::warn!(environment_variable = %variable, "unrecognized environment variable");
    }
    if let Some(variable) = notes.env.conflicting.first() {
        tracing::error!(environment_variable = %variable, "{}", env::CONFLICT);
        eprintln!("cairn: {variable}: {}", env::CONFLICT);
        return ExitCode::from(1);
    }
    let outcome = match &cli.command {
        Some(Command::Snapshot(SnapshotCommand::Restore(args))) => {
            crate::run::snapshot_tool::restore(args).map_err(|e| e.to_string())
        }
        Some(Command::Snapshot(SnapshotCommand::Status(args))) => {
            crate::run::snapshot_tool::status(args).map_err(|e| e.to_string())
        }
        Some(Command::Check(CheckCommand::Disk(args))) => return check_disk(args),
        None => match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(runtime) => runtime
                .block_on(crate::run::server::serve(cli.flags))
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot start the runtime: {e}")),
        },
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn: {e}");
            ExitCode::from(1)
        }
    }
}
