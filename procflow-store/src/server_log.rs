//! [`log_tail`]: the end of a server's log, for the error of a server a test started
//! (`etcd::LocalCluster`, `postgres::LocalPostgres`) that did not come up.

use std::path::Path;

/// `its log (PATH) ends: LINE | LINE | …`, the last five lines of the log at `path`.
pub(crate) fn log_tail(path: &Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(5).collect();
    format!(
        "its log ({}) ends: {}",
        path.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    )
}
