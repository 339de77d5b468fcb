//! The stored form of a procedure and of what the executor keeps next to it: the bytes
//! every store holds, read and written here only.
//!
//! Both the [`executor`](crate::executor) (which writes them) and the
//! [`operator`](crate::operator) views (which read them without the machines' types) sit
//! on top of this module; neither reaches into the other for the format.
//!
//! - [`record`]: a procedure's record, an envelope (what the runtime and operators need:
//!   wait, nonce, times, locks, trouble, history) followed by the snapshot;
//! - [`codec`]: the snapshot, a header naming the machine and its cursor, then the
//!   procedure's own data;
//! - [`head`]: the envelope's fields before its history, written and read by hand;
//! - [`history`]: the bounded step history inside the envelope, its entries' times read
//!   off the step's own clock reads ([`clock`]);
//! - [`requests`]: operators' requests, stored as metadata entries until carried out;
//! - [`wire`]: postcard's bytes, appended to a buffer the way every part above is
//!   written, and read by hand where a restart reads them once per procedure.
//!
//! docs/FORMAT.md describes every byte.

pub(crate) mod clock;
pub mod codec;
pub(crate) mod head;
pub(crate) mod history;
pub(crate) mod record;
pub(crate) mod requests;
pub(crate) mod wire;
