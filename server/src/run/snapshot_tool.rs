//! `cairn snapshot restore` and `cairn snapshot status`: etcdutl's offline tools, for the files
//! `etcdctl snapshot save` writes from a cairn member (the engine's snapshot, zero padding to a
//! multiple of 512 bytes, and the SHA-256 of both).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use cairn_engine::offline;
use sha2::{Digest, Sha256};

use crate::config::{self, RestoreArgs, StatusArgs};

/// Bytes of the SHA-256 trailer.
const HASH_LEN: u64 = 32;

/// Why a tool failed.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Reading or writing the named file or directory failed.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The arguments or the snapshot will not do: a damaged file, one without its SHA-256
    /// trailer (unless `--skip-hash-check`), a data directory that already exists, `--name`
    /// missing from `--initial-cluster`.
    #[error("{0}")]
    Invalid(String),
    /// A URL or `--initial-cluster` argument does not parse.
    #[error(transparent)]
    Flag(#[from] config::BadFlag),
    /// The engine could not read the snapshot, or restore it into the new directory.
    #[error(transparent)]
    Engine(#[from] cairn_engine::Error),
}

fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({eta})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Opens a snapshot file and checks its SHA-256 trailer; returns the file positioned at the
/// start and the length of the data before the trailer.
fn open_checked(path: &Path, skip_hash_check: bool) -> Result<(File, u64), ToolError> {
    let name = path.display().to_string();
    let mut file = File::open(path).map_err(|e| ToolError::Io(name.clone(), e))?;
    let size = file.metadata().map_err(|e| ToolError::Io(name.clone(), e))?.len();
    let has_hash = size % 512 == HASH_LEN;
    if !has_hash {
        if skip_hash_check {
            return Ok((file, size));
        }
        return Err(ToolError::Invalid(format!(
            "{name}: snapshot missing hash but --skip-hash-check=false"
        )));
    }
    let data_len = size - HASH_LEN;
    let bar = progress(data_len, "checking");
    let mut hasher = Sha256::new();
    let mut reader = bar.wrap_read((&mut file).take(data_len));
    std::io::copy(&mut reader, &mut hasher).map_err(|e| ToolError::Io(name.clone(), e))?;
    bar.finish_and_clear();
    let mut expected = [0u8; HASH_LEN as usize];
    file.read_exact(&mut expected)
        .map_err(|e| ToolError::Io(name.clone(), e))?;
    if hasher.finalize().as_slice() != expected {
        return Err(ToolError::Invalid(format!(
            "{name}: expected sha256 does not match: the file is damaged"
        )));
    }
    file.seek(SeekFrom::Start(0)).map_err(|e| ToolError::Io(name, e))?;
    Ok((file, data_len))
}

/// `cairn snapshot restore`.
pub fn restore(args: &RestoreArgs) -> Result<(), ToolError> {
    let peer_urls = config::url_list("initial-advertise-peer-urls", &args.initial_advertise_peer_urls)?;
    let cluster = match &args.initial_cluster {
        Some(c) => c.clone(),
        None => peer_urls
            .iter()
            .map(|u| format!("{}={u}", args.name))
            .collect::<Vec<_>>()
            .join(","),
    };
    let members = config::initial_cluster(&cluster, &args.initial_cluster_token)?;
    if !members.iter().any(|m| m.name == args.name) {
        return Err(ToolError::Invalid(format!(
            "--initial-cluster has no member named {:?} (--name)",
            args.name
        )));
    }
    let attributes = config::initial_attributes(&members);
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| format!("{}.cairn", args.name).into());
    if data_dir.exists() {
        return Err(ToolError::Invalid(format!(
            "data-dir {:?} exists; restore into a new directory",
            data_dir.display()
        )));
    }
    let member_dir = data_dir.join("member");
    let restored = if offline::is_etcd(&args.file)? {
        // etcd's format: a bbolt database, read a page at a time.
        offline::import_etcd(&args.file, &member_dir, &attributes, args.skip_hash_check)
    } else {
        let (file, data_len) = open_checked(&args.file, args.skip_hash_check)?;
        let bar = progress(data_len, "restoring");
        let mut reader = bar.wrap_read(file.take(data_len));
        let restored = offline::restore_new_cluster(&mut reader, &member_dir, &attributes);
        bar.finish_and_clear();
        restored
    };
    if let Err(e) = restored {
        // Leave no half-made directory behind.
        let _ = std::fs::remove_dir_all(&data_dir);
        return Err(e.into());
    }
    let ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    crate::transport::peer::store_cluster_id(&member_dir, crate::ids::cluster_id(&ids))
        .map_err(|e| ToolError::Io(member_dir.display().to_string(), e))?;
    println!("restored snapshot into {}", data_dir.display());
    Ok(())
}

/// `cairn snapshot status`.
pub fn status(args: &StatusArgs) -> Result<(), ToolError> {
    let size = std::fs::metadata(&args.file)
        .map_err(|e| ToolError::Io(args.file.display().to_string(), e))?
        .len();
    let (info, hash, total) = if offline::is_etcd(&args.file)? {
        // etcd's format: etcdutl's hash, and the database's size (its pages, the trailer
        // aside), as etcdutl reports them.
        let info = offline::etcd_status(&args.file, true)?;
        let hash = offline::etcd_hash(&args.file)?;
        (info, hash, size - if size % 512 == 32 { 32 } else { 0 })
    } else {
        let (file, data_len) = open_checked(&args.file, true)?;
        let mut reader = file.take(data_len);
        let mut crc = crc32fast::Hasher::new();
        let info = {
            let mut hashing = HashingReader {
                inner: &mut reader,
                crc: &mut crc,
            };
            offline::status(&mut hashing)?
        };
        (info, crc.finalize(), size)
    };
    match args.write_out.as_str() {
        "json" => println!(
            "{}",
            serde_json::json!({
                "hash": hash,
                "revision": info.revision,
                "totalKey": info.keys,
                "totalSize": total,
                "version": crate::pb::API_VERSION,
            })
        ),
        "table" => {
            println!("+----------+----------+------------+------------+---------+");
            println!("|   HASH   | REVISION | TOTAL KEYS | TOTAL SIZE | VERSION |");
            println!("+----------+----------+------------+------------+---------+");
            println!(
                "| {hash:8x} | {:8} | {:10} | {:10} | {:7} |",
                info.revision,
                info.keys,
                total,
                crate::pb::API_VERSION
            );
            println!("+----------+----------+------------+------------+---------+");
        }
        _ => println!(
            "{hash:x}, {}, {}, {total}, {}",
            info.revision,
            info.keys,
            crate::pb::API_VERSION
        ),
    }
    Ok(())
}

/// A reader that feeds a CRC as it goes.
struct HashingReader<'a> {
    inner: &'a mut dyn Read,
    crc: &'a mut crc32fast::Hasher,
}

impl Read for HashingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(buf.get(..n).unwrap_or_default());
        Ok(n)
    }
}
