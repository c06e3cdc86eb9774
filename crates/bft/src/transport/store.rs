//! The files behind [`crate::Action::Persist`]: one snapshot and one append-only log in a
//! directory the replica owns.
//!
//! - `bft.snapshot`: magic, then SHA-256 of the body, then the body. Replaced atomically:
//!   written to `bft.snapshot.tmp`, fsynced, renamed over, the directory fsynced.
//! - `bft.log`: a header (magic and the generation of the snapshot it extends), then records
//!   framed as length (u32 LE), SHA-256 of the record, the record. A new snapshot starts a new
//!   log the same way (temporary file, fsync, rename, directory fsync), so a crash between
//!   the two renames leaves a log of the previous generation, which loading ignores.
//! - Appends are fsynced (`fdatasync`) once per [`Persist::Append`], before the driver sends
//!   or delivers anything queued after it. A record cut short or failing its checksum can only be
//!   the last, unsynced write: loading stops there (it was never acted upon).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::{Persist, PersistedState, RestoreError};

const SNAPSHOT: &str = "bft.snapshot";
const LOG: &str = "bft.log";
const SNAPSHOT_MAGIC: &[u8; 8] = b"sdnsSNP1";
const LOG_MAGIC: &[u8; 8] = b"sdnsLOG1";
/// Largest single record accepted when loading (a view change or new view of a full window).
const MAX_RECORD_BYTES: usize = 1 << 30;

/// Why the ordering state could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: checksum mismatch (the snapshot is damaged)")]
    Damaged { path: PathBuf },
    #[error("{path}: {source}")]
    Restore { path: PathBuf, source: RestoreError },
    #[error("persist for generation {got} while the log is at {expected}")]
    Generation { expected: u64, got: u64 },
}

/// The ordering state's files in one directory.
pub struct Store {
    dir: PathBuf,
    log: Option<File>,
    generation: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io { path: path.to_owned(), source }
}

impl Store {
    /// Opens (creating) the directory. Nothing is read yet: see [`Store::load`].
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        Ok(Store { dir: dir.to_owned(), log: None, generation: 0 })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The persisted state (snapshot plus the valid prefix of its log), or `None` when nothing
    /// was ever persisted here. A damaged snapshot is an error, never a fresh start: a replica
    /// that forgot what it promised must not rejoin as if it had not.
    pub fn load(&self) -> Result<Option<PersistedState>, StoreError> {
        let path = self.dir.join(SNAPSHOT);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StoreError::Io { path, source }),
        };
        let body = match bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice()) {
            Some(rest) if rest.len() >= 32 && Sha256::digest(&rest[32..]).as_slice() == &rest[..32] => &rest[32..],
            _ => return Err(StoreError::Damaged { path }),
        };
        let mut state = PersistedState::decode_snapshot(body).map_err(|source| StoreError::Restore { path: path.clone(), source })?;
        let log_path = self.dir.join(LOG);
        let log = match std::fs::read(&log_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Some(state)),
            Err(source) => return Err(StoreError::Io { path: log_path, source }),
        };
        let Some(rest) = log.strip_prefix(LOG_MAGIC.as_slice()) else { return Ok(Some(state)) };
        let Some((generation, mut rest)) = rest.split_first_chunk::<8>() else { return Ok(Some(state)) };
        if u64::from_le_bytes(*generation) != state.generation() {
            // A log left from before the snapshot that replaced it.
            return Ok(Some(state));
        }
        while let Some((length, after)) = rest.split_first_chunk::<4>() {
            let length = u32::from_le_bytes(*length) as usize;
            if length > MAX_RECORD_BYTES || after.len() < 32 + length {
                break;
            }
            let (sum, after) = after.split_at(32);
            let (record, after) = after.split_at(length);
            if Sha256::digest(record).as_slice() != sum {
                break;
            }
            state.apply_record(record).map_err(|source| StoreError::Restore { path: log_path.clone(), source })?;
            rest = after;
        }
        Ok(Some(state))
    }

    /// Carries out one [`Persist`]; returns once it is durable.
    pub fn write(&mut self, persist: &Persist) -> Result<(), StoreError> {
        match persist {
            Persist::Snapshot { generation, bytes } => {
                let mut content = Vec::with_capacity(bytes.len() + 40);
                content.extend_from_slice(SNAPSHOT_MAGIC);
                content.extend_from_slice(&Sha256::digest(bytes));
                content.extend_from_slice(bytes);
                self.replace(SNAPSHOT, &content)?;
                let mut header = LOG_MAGIC.to_vec();
                header.extend_from_slice(&generation.to_le_bytes());
                self.log = None;
                self.replace(LOG, &header)?;
                let path = self.dir.join(LOG);
                self.log = Some(OpenOptions::new().append(true).open(&path).map_err(io(&path))?);
                self.generation = *generation;
                Ok(())
            }
            Persist::Append { generation, records } => {
                if *generation != self.generation || self.log.is_none() {
                    return Err(StoreError::Generation { expected: self.generation, got: *generation });
                }
                let path = self.dir.join(LOG);
                let mut frame = Vec::new();
                for record in records {
                    let length = u32::try_from(record.len()).unwrap_or(u32::MAX);
                    frame.extend_from_slice(&length.to_le_bytes());
                    frame.extend_from_slice(&Sha256::digest(record));
                    frame.extend_from_slice(record);
                }
                let log = self.log.as_mut().ok_or(StoreError::Generation { expected: self.generation, got: *generation })?;
                log.write_all(&frame).and_then(|()| log.sync_data()).map_err(io(&path))
            }
        }
    }

    /// Temporary file, fsync, rename, fsync of the directory.
    fn replace(&self, name: &str, content: &[u8]) -> Result<(), StoreError> {
        let path = self.dir.join(name);
        let tmp = self.dir.join(format!("{name}.tmp"));
        let mut file = File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(content).and_then(|()| file.sync_all()).map_err(io(&tmp))?;
        drop(file);
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(&self.dir).and_then(|dir| dir.sync_all()).map_err(io(&self.dir))
    }
}
