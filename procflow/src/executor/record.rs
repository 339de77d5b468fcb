//! The value the executor stores for each procedure: an envelope with what the runtime
//! needs (what the procedure waits for, its nonce, its timestamps), followed by the
//! procedure's snapshot ([`codec`](crate::codec)).
//!
//! ```text
//! +-------------------------------+----------------------------------------+
//! | Envelope (postcard)           | snapshot (codec: version, machine,     |
//! | version, wait, nonce, times   | cursor, data), to the end              |
//! +-------------------------------+----------------------------------------+
//! ```

use crate::codec::CodecError;
use serde::{Deserialize, Serialize};

/// The version byte that starts every envelope.
pub(crate) const ENVELOPE_VERSION: u8 = 1;

/// Metadata key holding the first procedure id not yet handed out (u64, little endian).
pub(crate) const NEXT_ID_KEY: &str = "procflow/next_id";
/// Metadata key holding the fencing token of the executor that last took the store over
/// (u64, little endian); written with that token as the executor starts.
pub(crate) const FENCE_KEY: &str = "procflow/fence";
/// Metadata key prefix mapping a nonce to its procedure id (u64, little endian).
pub(crate) const NONCE_PREFIX: &str = "procflow/nonce/";

/// What a procedure waits for before its next step. Variants are only appended: their
/// index is on disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Wait {
    /// Nothing: it can run.
    Ready,
    /// These children to end.
    Children(Vec<u64>),
    /// The event `name`, or the wall-clock time `until_ms` (ms since the Unix epoch).
    Event { name: String, until_ms: Option<u64> },
}

/// Children a step started: undone (if they succeeded) before the state at `depth - 1` on
/// the rollback stack, the state that spawned them, is undone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Spawn {
    /// The rollback stack's length right after the spawning step.
    pub(crate) depth: usize,
    pub(crate) children: Vec<u64>,
}

/// The runtime's part of a stored procedure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Envelope {
    pub(crate) version: u8,
    pub(crate) wait: Wait,
    pub(crate) nonce: Option<String>,
    /// Wall-clock submit time, ms since the Unix epoch.
    pub(crate) submitted_ms: u64,
    /// Wall-clock end time, once finished.
    pub(crate) finished_ms: Option<u64>,
    /// Wall-clock time after which the procedure fails (rolls back), if it has a timeout.
    pub(crate) deadline_ms: Option<u64>,
    /// Children started and not yet undone, oldest first.
    pub(crate) spawns: Vec<Spawn>,
}

impl Envelope {
    pub(crate) fn new(nonce: Option<String>, deadline_ms: Option<u64>) -> Self {
        Self {
            version: ENVELOPE_VERSION,
            wait: Wait::Ready,
            nonce,
            submitted_ms: now_ms(),
            finished_ms: None,
            deadline_ms,
            spawns: Vec::new(),
        }
    }

    /// Writes the envelope and appends the snapshot bytes `encode_snapshot` produces into
    /// the same buffer.
    pub(crate) fn encode(
        &self,
        encode_snapshot: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, CodecError>,
    ) -> Result<Vec<u8>, CodecError> {
        let out = postcard::to_extend(self, Vec::with_capacity(128)).map_err(|source| {
            CodecError::Encode {
                machine: "(envelope)",
                source,
            }
        })?;
        encode_snapshot(out)
    }

    /// Splits a stored value into its envelope and snapshot.
    pub(crate) fn decode(bytes: &[u8]) -> Result<(Self, &[u8]), String> {
        let (envelope, snapshot) = postcard::take_from_bytes::<Self>(bytes)
            .map_err(|e| format!("unreadable envelope: {e}"))?;
        if envelope.version != ENVELOPE_VERSION {
            return Err(format!(
                "envelope version {} is not supported (this procflow reads {ENVELOPE_VERSION})",
                envelope.version
            ));
        }
        Ok((envelope, snapshot))
    }
}

/// Milliseconds since the Unix epoch, for the timestamps that must survive a restart.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_leaves_the_snapshot() {
        let mut envelope = Envelope::new(Some("req-1".into()), Some(5));
        envelope.wait = Wait::Event {
            name: "region-open".into(),
            until_ms: Some(9),
        };
        let bytes = envelope
            .encode(|mut out| {
                out.extend_from_slice(b"snapshot");
                Ok(out)
            })
            .unwrap();
        let (back, rest) = Envelope::decode(&bytes).unwrap();
        assert_eq!(back, envelope);
        assert_eq!(rest, b"snapshot");
        assert!(Envelope::decode(&bytes[..3]).is_err());
    }
}
