//! The `cairn` binary: an etcd-compatible member (`cairn [flags]`, or `cairn --config-file`),
//! and the offline snapshot tools (`cairn snapshot restore|status`). See `cairn --help`.
//! Started under the name `etcd` (a symlink or a copy), it keeps etcd's defaults where they
//! differ from cairn's ([`Invocation`]).

use std::process::ExitCode;

use cairn_server::config::{env, file as config_file, CheckCommand, Cli, Command, Invocation, SnapshotCommand};
use clap::{CommandFactory, FromArgMatches};

/// The allocator: jemalloc, with its sampling heap profiler built in but not sampling until
/// `--enable-pprof` turns it on at startup (`cairn_server::api::pprof::start_heap_sampling`), so
/// that a member without the flag takes no stacks. It then samples an allocation every 2^19
/// bytes (512 KiB) on average, as Go's runtime does (`runtime.MemProfileRate`).
/// `_RJEM_MALLOC_CONF` in the environment overrides these options (`prof:false` for none).
///
/// Not on musl (the static builds): there jemalloc's build finds no `_Unwind_Backtrace` it
/// can link (GCC's `libgcc_eh` wants glibc's `_dl_find_object`) and falls back to walking
/// frame pointers, which Rust's code does not keep, and the first sample crashes the process
/// (tikv/jemallocator#146). The profiler stays off there, and must not be turned on.
mod allocator {
    #[global_allocator]
    static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    /// jemalloc's `malloc_conf`, under the prefix tikv-jemalloc-sys builds it with: a C
    /// `const char *` to options it reads once, at its first allocation.
    // Exporting a symbol by name is unsafe (it could clash with another of that name). It
    // does not: jemalloc's own `_rjem_malloc_conf` is weak, defined so that a program can
    // override it, and nothing else defines it. `&[u8; N]` is a thin pointer, laid out as C's
    // `const char *`, to bytes that end in NUL and are never written.
    #[cfg(target_env = "gnu")]
    #[allow(unsafe_code)]
    #[export_name = "_rjem_malloc_conf"]
    static MALLOC_CONF: &[u8; 46] = b"prof:true,prof_active:false,lg_prof_sample:19\0";
}

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
fn check_disk(args: &cairn_server::config::DiskArgs) -> ExitCode {
    match cairn_server::run::disk_check::run(args) {
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

fn main() -> ExitCode {
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
                    .map(|s| cairn_server::run::tracing_export::Exporter::start(s).map_err(|e| e.to_string()))
                    .transpose()
            }),
        Some(_) => Ok(None),
    };
    let logged = export.and_then(|export| {
        f.observability
            .rotation(&f.log_outputs)
            .map_err(|e| e.to_string())
            .and_then(|rotation| {
                cairn_server::run::logging::init(
                    f.log_level,
                    f.log_format,
                    &f.log_outputs,
                    rotation.as_ref(),
                    export.as_ref(),
                )
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
            cairn_server::run::snapshot_tool::restore(args).map_err(|e| e.to_string())
        }
        Some(Command::Snapshot(SnapshotCommand::Status(args))) => {
            cairn_server::run::snapshot_tool::status(args).map_err(|e| e.to_string())
        }
        Some(Command::Check(CheckCommand::Disk(args))) => return check_disk(args),
        None => match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(runtime) => runtime
                .block_on(cairn_server::run::server::serve(cli.flags))
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
