//! Tunables of an [`crate::Engine`], with their defaults.

use crate::error::{Error, Result};

/// Configuration of an [`crate::Engine`].
#[derive(Clone, Debug)]
pub struct Config {
    /// The write-ahead log's configuration; its segments live in `<dir>/wal`.
    pub wal: cairn_wal::Config,
    /// The most operations one Txn may hold (etcd's `--max-txn-ops`). Default 128.
    pub max_txn_ops: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            wal: cairn_wal::Config::default(),
            max_txn_ops: 128,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<()> {
        self.wal.validate().map_err(|e| Error::InvalidConfig(e.to_string()))?;
        if self.max_txn_ops == 0 {
            return Err(Error::InvalidConfig("max_txn_ops must be at least 1".into()));
        }
        Ok(())
    }
}
