//! Golden bytes: a test fails when the stored form of a procedure type changes without a
//! data version bump.
//!
//! procflow stores a procedure's data as positional postcard: a field reordered between
//! two fields of the same type, or an enum variant inserted before others, still decodes,
//! into the wrong values. Nothing at run time can notice. A test that compares the
//! encoding of a sample value with the one kept in a file can: it is the only way to
//! catch such a change before it ships.
//!
//! The file keeps one line per data version, `v<N> <hex>`: the sample as that version
//! stored it. Keep the old lines when you bump the version: each older line is decoded
//! through the machine's migration, so the file also proves that the migrations read
//! real bytes of their versions.

use crate::StateMachine;
use crate::codec::{self, CodecError};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The environment variable that rewrites the current version's line instead of failing.
pub const BLESS: &str = "PROCFLOW_BLESS";

/// What a golden check did, when it passed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Golden {
    /// The data version checked, [`StateMachine::DATA_VERSION`].
    pub version: u32,
    /// The file had no line for it (or [`BLESS`] was set): it was written.
    pub written: bool,
    /// Older versions whose sample the migrations read.
    pub migrated: Vec<u32>,
}

/// Why a golden check failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GoldenError {
    /// The sample encodes differently from the file's line for the current version.
    #[error(
        "the stored form of machine `{machine}` changed without a data version bump: \
         data version {version} was {expected} in {}, and is now {found}. Bump \
         `#[state_machine(version = {})]` and add `migrate({version} = OldType)` reading \
         the old form, or undo the change (`{BLESS}=1` rewrites the line if the old form \
         was never stored anywhere)",
         file.display(), version + 1
    )]
    Changed {
        /// The machine's stable name.
        machine: &'static str,
        /// The data version.
        version: u32,
        /// The file.
        file: PathBuf,
        /// The encoding in the file, in hex.
        expected: String,
        /// The sample's encoding now, in hex.
        found: String,
    },
    /// The sample of an older version does not read through the machine's migration.
    #[error("the sample of data version {version} in {} does not migrate: {source}", file.display())]
    Migration {
        /// The older data version.
        version: u32,
        /// The file.
        file: PathBuf,
        /// Why.
        source: CodecError,
    },
    /// The file holds a version newer than this build's (a later build wrote it).
    #[error(
        "{} holds data version {found}, newer than this build's ({this_build}) of machine `{machine}`",
        file.display()
    )]
    NewerThanBuild {
        /// The machine's stable name.
        machine: &'static str,
        /// The newest version in the file.
        found: u32,
        /// [`StateMachine::DATA_VERSION`].
        this_build: u32,
        /// The file.
        file: PathBuf,
    },
    /// The file cannot be read or written, or a line is malformed.
    #[error("golden file {}: {reason}", file.display())]
    File {
        /// The file.
        file: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The sample does not serialize.
    #[error(transparent)]
    Encode(#[from] CodecError),
}

/// Checks the stored form of `sample`, a value of machine `M`'s procedure type, against
/// the golden file at `path`, and the older versions' samples there against `M`'s
/// migrations; writes the current version's line when the file has none.
///
/// # Examples
///
/// ```
/// # use procflow::prelude::*;
/// # #[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
/// # #[state_machine(procedure = Job)]
/// # enum JobState { #[initial] #[transition(to = [Done])] Start, #[terminal] Done }
/// # #[derive(serde::Serialize, serde::Deserialize)]
/// # struct Job { name: String, retries: u32 }
/// # impl JobStateHandlers for Job {
/// #     async fn start(&mut self, _: &Context<()>) -> Step<job_state::Start> {
/// #         Ok(job_state::Start::Done.into())
/// #     }
/// # }
/// use procflow::testing::golden;
///
/// let dir = tempfile::tempdir()?;
/// let file = dir.path().join("job.golden");
/// let sample = Job { name: "users".into(), retries: 3 };
/// // The first run writes the line for data version 1...
/// assert!(golden::<JobState>(&sample, &file)?.written);
/// // ...later runs compare with it.
/// assert!(!golden::<JobState>(&sample, &file)?.written);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// [`GoldenError::Changed`] when the sample encodes differently at the same version (a
/// field added, removed or reordered, an enum variant inserted, without a bump);
/// [`GoldenError::Migration`] when an older version's sample does not migrate;
/// [`GoldenError::NewerThanBuild`], [`GoldenError::File`].
pub fn golden<M: StateMachine>(
    sample: &M::Procedure,
    path: impl AsRef<Path>,
) -> Result<Golden, GoldenError> {
    let file = path.as_ref().to_path_buf();
    let mut lines = read(&file)?;
    let version = M::DATA_VERSION;
    if let Some((&found, _)) = lines.last_key_value().filter(|(v, _)| **v > version) {
        return Err(GoldenError::NewerThanBuild {
            machine: M::NAME,
            found,
            this_build: version,
            file,
        });
    }
    let now = postcard::to_stdvec(sample).map_err(|source| CodecError::Encode {
        machine: M::NAME,
        source,
    })?;
    let bless = std::env::var_os(BLESS).is_some_and(|v| v == "1");
    let written = match lines.get(&version) {
        Some(kept) if *kept == now || bless => {
            let changed = *kept != now;
            lines.insert(version, now);
            changed
        }
        Some(kept) => {
            return Err(GoldenError::Changed {
                machine: M::NAME,
                version,
                expected: hex(kept),
                found: hex(&now),
                file,
            });
        }
        None => {
            lines.insert(version, now);
            true
        }
    };
    let mut migrated = Vec::new();
    for (&old, bytes) in lines.range(M::OLDEST_VERSION..version) {
        codec::decode_data::<M>(old, bytes).map_err(|source| GoldenError::Migration {
            version: old,
            file: file.clone(),
            source,
        })?;
        migrated.push(old);
    }
    if written {
        write(&file, M::NAME, &lines)?;
    }
    Ok(Golden {
        version,
        written,
        migrated,
    })
}

/// The file's lines by version; none if it does not exist.
fn read(file: &Path) -> Result<BTreeMap<u32, Vec<u8>>, GoldenError> {
    let failed = |reason: String| GoldenError::File {
        file: file.to_path_buf(),
        reason,
    };
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(error) => return Err(failed(error.to_string())),
    };
    let mut lines = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parsed = line.strip_prefix('v').and_then(|rest| {
            let (version, bytes) = rest.split_once(' ')?;
            Some((version.parse::<u32>().ok()?, unhex(bytes.trim())?))
        });
        let Some((version, bytes)) = parsed else {
            return Err(failed(format!(
                "line {} is not `v<version> <hex>`: {line}",
                n + 1
            )));
        };
        lines.insert(version, bytes);
    }
    Ok(lines)
}

fn write(file: &Path, machine: &str, lines: &BTreeMap<u32, Vec<u8>>) -> Result<(), GoldenError> {
    let mut text = format!(
        "# procflow golden samples of machine `{machine}`: one line per data version, \
         `v<version> <hex of the stored data>`.\n# Keep the old lines: they prove the \
         migrations read what those versions stored.\n"
    );
    for (version, bytes) in lines {
        let _ = writeln!(text, "v{version} {}", hex(bytes));
    }
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| GoldenError::File {
            file: file.to_path_buf(),
            reason: e.to_string(),
        })?;
    }
    std::fs::write(file, text).map_err(|e| GoldenError::File {
        file: file.to_path_buf(),
        reason: e.to_string(),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, byte| {
        let _ = write!(out, "{byte:02x}");
        out
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(hex(&bytes), "0001abff");
        assert_eq!(unhex("0001abff").unwrap(), bytes);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
    }
}
