//! etcd 3.5's flags that etcd 3.6 removed with the v2 API and the v2 proxy. They are taken
//! from the command line only to be refused with a line that names what replaced them: a
//! manifest written for 3.5 fails at once and says why, rather than with clap's "unexpected
//! argument". Their `ETCD_*` variables are warned about as unknown, as etcd 3.6 does.

use clap::Args;

use super::value::{bad, BadFlag};

/// The removed flags, each with what an operator uses instead.
pub const REMOVED: &[(&str, &str)] = &[
    (
        "enable-v2",
        "the v2 API was removed in etcd 3.6; cairn serves the v3 API only",
    ),
    (
        "experimental-enable-v2v3",
        "the v2 API was removed in etcd 3.6; cairn serves the v3 API only",
    ),
    (
        "proxy",
        "the v2 proxy was removed in etcd 3.6: run `etcd grpc-proxy` in front of the cluster",
    ),
    (
        "proxy-dial-timeout",
        "the v2 proxy was removed in etcd 3.6: run `etcd grpc-proxy` in front of the cluster",
    ),
    (
        "proxy-failure-wait",
        "the v2 proxy was removed in etcd 3.6: run `etcd grpc-proxy` in front of the cluster",
    ),
    (
        "proxy-read-timeout",
        "the v2 proxy was removed in etcd 3.6: run `etcd grpc-proxy` in front of the cluster",
    ),
    (
        "proxy-refresh-interval",
        "the v2 proxy was removed in etcd 3.6: run `etcd grpc-proxy` in front of the cluster",
    ),
    (
        "proxy-write-timeout",
        "the v2 proxy was removed in etcd 3.6: run `etcd grpc-proxy` in front of the cluster",
    ),
];

/// The flags of this module, hidden from `--help`.
#[allow(missing_docs)] // hidden: refused whatever their value
#[derive(Debug, Args)]
pub struct Removed {
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "true")]
    pub enable_v2: Option<String>,
    #[arg(long, hide = true, num_args = 0..=1, default_missing_value = "")]
    pub experimental_enable_v2v3: Option<String>,
    #[arg(long, hide = true)]
    pub proxy: Option<String>,
    #[arg(long, hide = true)]
    pub proxy_dial_timeout: Option<String>,
    #[arg(long, hide = true)]
    pub proxy_failure_wait: Option<String>,
    #[arg(long, hide = true)]
    pub proxy_read_timeout: Option<String>,
    #[arg(long, hide = true)]
    pub proxy_refresh_interval: Option<String>,
    #[arg(long, hide = true)]
    pub proxy_write_timeout: Option<String>,
}

impl Removed {
    /// Refuses the first removed flag given, naming what replaced it.
    pub fn check(&self) -> Result<(), BadFlag> {
        let given = [
            self.enable_v2.is_some(),
            self.experimental_enable_v2v3.is_some(),
            self.proxy.is_some(),
            self.proxy_dial_timeout.is_some(),
            self.proxy_failure_wait.is_some(),
            self.proxy_read_timeout.is_some(),
            self.proxy_refresh_interval.is_some(),
            self.proxy_write_timeout.is_some(),
        ];
        match REMOVED.iter().zip(given).find(|(_, g)| *g) {
            Some(((flag, instead), _)) => Err(bad(flag, *instead)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Only {
        #[command(flatten)]
        removed: Removed,
    }

    #[test]
    fn each_removed_flag_is_refused_with_its_replacement() {
        for (flag, instead) in REMOVED {
            let arg = format!("--{flag}=x");
            let removed = Only::try_parse_from(["cairn", arg.as_str()]).unwrap().removed;
            let e = removed.check().unwrap_err();
            assert_eq!(e.to_string(), format!("--{flag}: {instead}"));
        }
        let none = Only::try_parse_from(["cairn"]).unwrap().removed;
        assert!(none.check().is_ok());
    }
}
