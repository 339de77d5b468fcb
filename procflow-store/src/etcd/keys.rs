//! Where the etcd store keeps things: every key lives under the user's prefix.
//!
//! ```text
//! {prefix}/p/{id:020}   a procedure's record (see record.rs)
//! {prefix}/m/{key}      a metadata entry, its value as given
//! {prefix}/leader       the executor group's leader key; its create revision is the
//!                       fencing token
//! {prefix}/w/{writer}   a writer's sequence (see sequence.rs): one per store instance,
//!                       `{writer}` 16 hex digits chosen at random when it connects
//! ```
//!
//! Ids are zero-padded to 20 digits (`u64::MAX` has 20) so that etcd's byte order is id
//! order and `load` can page through them sorted.

use crate::store::ProcId;

/// The key layout under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct Keys {
    prefix: String,
}

impl Keys {
    /// `prefix` without its trailing slashes: `"/app/"` and `"/app"` are the same store.
    pub(crate) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    pub(crate) fn record(&self, id: ProcId) -> Vec<u8> {
        format!("{}/p/{id:020}", self.prefix).into_bytes()
    }

    pub(crate) fn meta(&self, key: &str) -> Vec<u8> {
        format!("{}/m/{key}", self.prefix).into_bytes()
    }

    pub(crate) fn leader(&self) -> Vec<u8> {
        format!("{}/leader", self.prefix).into_bytes()
    }

    /// The sequence key of writer `writer` (a store instance).
    pub(crate) fn sequence(&self, writer: u64) -> Vec<u8> {
        format!("{}/w/{writer:016x}", self.prefix).into_bytes()
    }

    /// `[start, end)` of every record key.
    pub(crate) fn records(&self) -> (Vec<u8>, Vec<u8>) {
        range(format!("{}/p/", self.prefix))
    }

    /// `[start, end)` of every metadata key.
    pub(crate) fn metas(&self) -> (Vec<u8>, Vec<u8>) {
        range(format!("{}/m/", self.prefix))
    }

    /// `[start, end)` of the metadata keys that start with `prefix`.
    pub(crate) fn metas_with_prefix(&self, prefix: &str) -> (Vec<u8>, Vec<u8>) {
        range(format!("{}/m/{prefix}", self.prefix))
    }

    /// The id in a record key.
    pub(crate) fn record_id(&self, key: &[u8]) -> Option<ProcId> {
        let (start, _) = self.records();
        std::str::from_utf8(key.strip_prefix(start.as_slice())?)
            .ok()?
            .parse()
            .ok()
    }

    /// The metadata key in an etcd key.
    pub(crate) fn meta_key(&self, key: &[u8]) -> Option<String> {
        let (start, _) = self.metas();
        String::from_utf8(key.strip_prefix(start.as_slice())?.to_vec()).ok()
    }
}

/// Every key starting with `start`: raising its last byte gives the first key past them
/// (a string's last byte is never 0xff, which UTF-8 does not use).
fn range(start: String) -> (Vec<u8>, Vec<u8>) {
    let mut end = start.clone().into_bytes();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    (start.into_bytes(), end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_by_id_and_parse_back() {
        let keys = Keys::new("/app/");
        assert_eq!(keys.record(7), b"/app/p/00000000000000000007");
        assert!(keys.record(9) < keys.record(10));
        assert_eq!(keys.record_id(&keys.record(u64::MAX)), Some(u64::MAX));
        assert_eq!(
            keys.meta_key(&keys.meta("next_id")).as_deref(),
            Some("next_id")
        );
        let (start, end) = keys.records();
        assert!(start.as_slice() < keys.record(0).as_slice());
        assert!(keys.record(u64::MAX).as_slice() < end.as_slice());
        let meta = keys.meta("a");
        assert!(!(start.as_slice()..end.as_slice()).contains(&meta.as_slice()));
        assert_eq!(keys.leader(), b"/app/leader");
        assert_eq!(keys.sequence(0xab), b"/app/w/00000000000000ab");
        let (start, end) = keys.metas_with_prefix("procflow/request/");
        let inside = keys.meta("procflow/request/0001");
        assert!((start.as_slice()..end.as_slice()).contains(&inside.as_slice()));
        for outside in ["procflow/requests", "procflow/machine/x", "next_id"] {
            let outside = keys.meta(outside);
            assert!(!(start.as_slice()..end.as_slice()).contains(&outside.as_slice()));
        }
    }
}
