//! The `ETCD_*` environment, checked as etcd checks it: a variable that names no flag is
//! warned about (a typo, or a flag etcd removed), and one whose flag is also given on the
//! command line stops the start, since the operator cannot have meant both.

use std::ffi::OsString;

use clap::parser::ValueSource;

/// What the environment holds beyond the flags it set.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EnvReport {
    /// `NAME=value` of each `ETCD_*` variable no flag reads.
    pub unrecognized: Vec<String>,
    /// Names of variables whose flag the command line also gives.
    pub conflicting: Vec<String>,
}

/// The message etcd stops with for [`EnvReport::conflicting`].
pub const CONFLICT: &str =
    "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag)";

/// Checks `vars` against the flags of `command`, as parsed into `matches`.
pub fn check(
    command: &clap::Command,
    matches: &clap::ArgMatches,
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> EnvReport {
    let mut report = EnvReport::default();
    for (name, value) in vars {
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("ETCD_") {
            continue;
        }
        let arg = command.get_arguments().find(|a| a.get_env().is_some_and(|e| e == name));
        match arg {
            Some(arg) if matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine) => {
                report.conflicting.push(name.to_string());
            }
            Some(_) => {}
            None => report.unrecognized.push(format!("{name}={}", value.to_string_lossy())),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn unknown_variables_are_reported_and_flags_given_twice_conflict() {
        let command = crate::config::Cli::command();
        let matches = command.clone().try_get_matches_from(["cairn", "--name", "n1"]).unwrap();
        crate::config::Cli::from_arg_matches(&matches).unwrap();
        let report = check(
            &command,
            &matches,
            vars(&[
                ("ETCD_NAME", "n2"),
                ("ETCD_DATA_DIR", "/d"),
                ("ETCD_PROXY", "off"),
                ("ETCD_TELEPORT", "1"),
                ("ETCDCTL_API", "3"),
                ("HOME", "/root"),
            ]),
        );
        assert_eq!(report.conflicting, ["ETCD_NAME"]);
        assert_eq!(report.unrecognized, ["ETCD_PROXY=off", "ETCD_TELEPORT=1"]);
    }
}
