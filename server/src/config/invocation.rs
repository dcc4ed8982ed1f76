//! The name the binary answers to. Started as `cairn` it keeps cairn's defaults; started under
//! the name `etcd` (a symlink or a copy: kubeadm's static pod, etcd's operator and many
//! scripts run the command `etcd`), it keeps etcd's where the two differ:
//!
//! | | `cairn` | `etcd` |
//! | --- | --- | --- |
//! | data dir without `--data-dir` | `./<name>.cairn` | `./<name>.etcd` |
//! | `--version` | `cairn 0.1.0` (clap's) | etcd's four lines, then cairn's own version |
//!
//! `etcd --version` prints, as etcd 3.5 to 3.7 do, `etcd Version: <API_VERSION>` first (what
//! tools parse), then `Git SHA`, `Go Version` and `Go OS/Arch`, and a last line
//! `cairn Version: <version>`, so nobody takes cairn for etcd's own build.

use std::ffi::OsStr;
use std::path::Path;

use clap::{Arg, ArgAction, ArgMatches, Command};

/// The argument id of `etcd --version` (clap's own version flag is `cairn`'s).
const VERSION_ARG: &str = "etcd-version";

/// Which command the binary was started as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Invocation {
    /// `cairn`, or any name but `etcd`.
    #[default]
    Cairn,
    /// `etcd`: argv\[0\]'s file name is exactly `etcd`.
    Etcd,
}

impl Invocation {
    /// The invocation that `arg0` (argv\[0\], as the process was started) names.
    pub fn from_arg0(arg0: Option<&OsStr>) -> Invocation {
        match arg0.map(Path::new).and_then(Path::file_name) {
            Some(name) if name == "etcd" => Invocation::Etcd,
            _ => Invocation::Cairn,
        }
    }

    /// This process's invocation.
    pub fn current() -> Invocation {
        Invocation::from_arg0(std::env::args_os().next().as_deref())
    }

    /// The data directory's default extension: `<name>.cairn`, or `<name>.etcd` as etcd's.
    pub fn data_dir_extension(self) -> &'static str {
        match self {
            Invocation::Cairn => "cairn",
            Invocation::Etcd => "etcd",
        }
    }

    /// `command` (the `Cli`'s) as this invocation parses it: as `etcd`, clap's version flag
    /// gives way to etcd's `--version` (also `--version=true|false`, as Go's flag package
    /// takes a boolean), which [`Invocation::version_asked`] reads.
    pub fn command(self, command: Command) -> Command {
        match self {
            Invocation::Cairn => command,
            Invocation::Etcd => command.name("etcd").disable_version_flag(true).arg(
                Arg::new(VERSION_ARG)
                    .long("version")
                    .help("Print the version and exit")
                    .num_args(0..=1)
                    .require_equals(true)
                    .default_missing_value("true")
                    .value_parser(clap::value_parser!(bool))
                    .action(ArgAction::Set),
            ),
        }
    }

    /// What to print and exit with when `matches` (from [`Invocation::command`]) ask for the
    /// version; `None` for `cairn`, whose version clap prints by itself.
    pub fn version_asked(self, matches: &ArgMatches) -> Option<String> {
        match self {
            Invocation::Cairn => None,
            Invocation::Etcd => matches
                .try_get_one::<bool>(VERSION_ARG)
                .ok()
                .flatten()
                .copied()
                .unwrap_or(false)
                .then(etcd_version),
        }
    }
}

/// `etcd --version`'s lines, as etcd 3.5–3.7 print them, for the etcd API cairn implements.
fn etcd_version() -> String {
    let cairn = env!("CARGO_PKG_VERSION");
    format!(
        "etcd Version: {api}\n\
         Git SHA: Not provided (cairn {cairn})\n\
         Go Version: none (cairn is written in Rust)\n\
         Go OS/Arch: {os}/{arch}\n\
         cairn Version: {cairn}\n",
        api = crate::pb::API_VERSION,
        os = std::env::consts::OS,
        arch = go_arch(std::env::consts::ARCH),
    )
}

/// Rust's name for a CPU architecture as Go's `GOARCH` spells it.
fn go_arch(rust: &str) -> &str {
    match rust {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn only_a_file_named_exactly_etcd_answers_as_etcd() {
        let cases = [
            (Some("etcd"), Invocation::Etcd),
            (Some("/usr/local/bin/etcd"), Invocation::Etcd),
            (Some("./etcd"), Invocation::Etcd),
            (Some("cairn"), Invocation::Cairn),
            (Some("/usr/local/bin/cairn"), Invocation::Cairn),
            (Some("etcdctl"), Invocation::Cairn),
            (Some("etcd-3.6"), Invocation::Cairn),
            (Some("/opt/etcd/cairn"), Invocation::Cairn),
            (Some(""), Invocation::Cairn),
            (None, Invocation::Cairn),
        ];
        for (arg0, expected) in cases {
            assert_eq!(Invocation::from_arg0(arg0.map(OsStr::new)), expected, "{arg0:?}");
        }
    }

    /// etcd's `--version` is a Go boolean flag: bare, `=true` or `=false`.
    #[test]
    fn etcds_version_flag_takes_gos_boolean_forms() {
        let command = Invocation::Etcd.command(crate::config::Cli::command());
        let asked = |args: &[&str]| {
            let matches = command
                .clone()
                .try_get_matches_from(std::iter::once("etcd").chain(args.iter().copied()))
                .unwrap();
            Invocation::Etcd.version_asked(&matches).is_some()
        };
        assert!(asked(&["--version"]));
        assert!(asked(&["--version=true"]));
        assert!(asked(&["--name", "x", "--version"]));
        assert!(!asked(&["--version=false"]));
        assert!(!asked(&["--name", "x"]));
    }

    /// The first line is what tools parse (`etcd Version: X.Y.Z`); the keys are etcd 3.5's to
    /// 3.7's, in their order (`target/etcd-3.7/etcd --version`).
    #[test]
    fn etcds_version_lines_carry_the_api_version_and_cairns_own() {
        let text = etcd_version();
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split_once(": ").map(|(k, _)| k))
            .collect();
        assert_eq!(
            keys,
            ["etcd Version", "Git SHA", "Go Version", "Go OS/Arch", "cairn Version"]
        );
        assert_eq!(text.lines().next(), Some("etcd Version: 3.6.0"));
        assert!(text.ends_with(&format!("cairn Version: {}\n", env!("CARGO_PKG_VERSION"))));
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("riscv64"), "riscv64");
    }

    #[test]
    fn cairns_command_is_left_as_it_is() {
        let matches = Invocation::Cairn
            .command(crate::config::Cli::command())
            .try_get_matches_from(["cairn", "--version"]);
        assert_eq!(
            matches.map(|_| ()).map_err(|e| e.kind()),
            Err(clap::error::ErrorKind::DisplayVersion)
        );
    }
}
