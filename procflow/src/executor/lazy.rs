//! A procedure loaded from the store keeps its data encoded until it next runs.
//!
//! A restart loads every stored procedure, and most of them are dormant (waiting for an
//! event or for their children) or finished. What the executor needs to report, wake and
//! lock them is decoded at once: the envelope and the cursor. The user's data is only
//! needed by a handler, so it stays as the slice of the stored record's bytes (shared
//! with the store: no copy) until the procedure's next step decodes it. A procedure whose
//! data no longer decodes is found then, and reported unloadable.

use crate::codec::{self, CodecError};
use crate::instance::Instance;
use crate::{Cursor, StateMachine};
use procflow_store::Bytes;

/// A procedure of machine `M`, with its data decoded or still as stored.
pub(crate) enum Lazy<M: StateMachine> {
    /// Not decoded since it was loaded: its data's bytes, as the store holds them, with
    /// the data version that wrote them and the snapshot's format (newer than this
    /// build's for a record a newer build wrote: never decoded, never rewritten).
    Stored {
        cursor: Cursor<M>,
        data: Bytes,
        data_version: u32,
        format: u8,
    },
    /// Decoded, or never stored encoded (submitted, spawned, revived).
    Decoded(Instance<M>),
}

impl<M: StateMachine> Lazy<M> {
    /// Reads the cursor of `snapshot` and keeps the data after it encoded.
    ///
    /// # Errors
    ///
    /// [`CodecError`] if the snapshot's header is not one of `M` this build can read.
    pub(crate) fn stored(snapshot: &Bytes) -> Result<Self, CodecError> {
        let (cursor, split) = codec::decode_cursor::<M>(snapshot)?;
        // The data is the snapshot's tail: a slice of the same bytes, not a copy.
        let data = snapshot.slice(snapshot.len() - split.data.len()..);
        Ok(Self::Stored {
            cursor,
            data,
            data_version: split.data_version,
            format: split.format,
        })
    }

    /// Why this build must neither run nor rewrite it, if so: its snapshot is of a newer
    /// format than this build writes.
    pub(crate) fn newer_format(&self) -> Option<CodecError> {
        match self {
            Self::Stored { format, .. } if *format > codec::SNAPSHOT_VERSION => {
                Some(CodecError::NewerFormat { found: *format })
            }
            _ => None,
        }
    }

    pub(crate) fn cursor(&self) -> &Cursor<M> {
        match self {
            Self::Stored { cursor, .. } => cursor,
            Self::Decoded(instance) => &instance.cursor,
        }
    }

    pub(crate) fn cursor_mut(&mut self) -> &mut Cursor<M> {
        match self {
            Self::Stored { cursor, .. } => cursor,
            Self::Decoded(instance) => &mut instance.cursor,
        }
    }

    /// The procedure's data, if it is decoded.
    pub(crate) fn procedure(&self) -> Option<&M::Procedure> {
        match self {
            Self::Stored { .. } => None,
            Self::Decoded(instance) => Some(&instance.procedure),
        }
    }

    /// The procedure, its data decoded first if it is still stored.
    ///
    /// # Errors
    ///
    /// [`CodecError::Decode`] if the stored data is not an `M::Procedure` of this build;
    /// the procedure is left as it was.
    pub(crate) fn decoded(&mut self) -> Result<&mut Instance<M>, CodecError> {
        if let Some(newer) = self.newer_format() {
            return Err(newer);
        }
        if let Self::Stored {
            cursor,
            data,
            data_version,
            ..
        } = self
        {
            let procedure = codec::decode_data::<M>(*data_version, data)?;
            let cursor = std::mem::take(cursor);
            *self = Self::Decoded(Instance { procedure, cursor });
        }
        match self {
            Self::Decoded(instance) => Ok(instance),
            Self::Stored { .. } => unreachable!("a stored procedure was decoded just above"),
        }
    }

    /// Appends the procedure's snapshot to `out`. Data still stored is copied as it is:
    /// for data postcard wrote, the same bytes decoding and encoding it would give.
    ///
    /// # Errors
    ///
    /// [`CodecError::Encode`] if the data (or the header) cannot be serialized.
    pub(crate) fn encode_into(&self, out: Vec<u8>) -> Result<Vec<u8>, CodecError> {
        match self {
            Self::Stored {
                cursor,
                data,
                data_version,
                ..
            } => codec::encode_stored_into(cursor, *data_version, data, out),
            Self::Decoded(instance) => {
                codec::encode_into(&instance.procedure, &instance.cursor, out)
            }
        }
    }
}

impl<M: StateMachine> From<Instance<M>> for Lazy<M> {
    fn from(instance: Instance<M>) -> Self {
        Self::Decoded(instance)
    }
}
