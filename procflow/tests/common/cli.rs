//! The `procflow` binary run by the CLI tests (`cli.rs`, `cli_shared.rs`), and the reads
//! they share. Not in `common/mod.rs`: only tests built with the `cli` feature have the
//! binary.

use serde_json::Value;
use std::process::Command;

/// Runs `procflow ARGS PLACE`; `(succeeded, stdout, stderr)`.
pub fn procflow(args: &[&str], place: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_procflow"))
        .args(args)
        .args(place)
        .output()
        .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (out.status.success(), text(out.stdout), text(out.stderr))
}

/// `procflow ARGS PLACE --json`, parsed; panics with stderr if it fails.
pub fn json(args: &[&str], place: &[&str]) -> Value {
    let (ok, stdout, stderr) = procflow(&[args, &["--json"]].concat(), place);
    assert!(ok, "procflow {args:?} failed: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// What every read command shows at `place` of `ops::stuck_and_waiting`'s two procedures,
/// read while their executor runs.
pub fn reads_stuck_and_waiting(place: &[&str]) {
    let list = json(&["list"], place);
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{list}");
    assert_eq!(rows[0]["state"], "Commit");
    assert_eq!(rows[0]["status"]["name"], "stuck");
    assert_eq!(
        rows[0]["status"]["error"],
        "the region server refuses the commit"
    );
    assert_eq!(rows[1]["status"]["name"], "suspended");
    assert_eq!(rows[1]["status"]["event"], "go-waiting");
    let only_stuck = json(&["list", "--status", "stuck"], place);
    assert_eq!(only_stuck.as_array().unwrap().len(), 1);
    assert_eq!(
        json(&["list", "--machine", "other"], place),
        Value::Array(vec![])
    );
    let show = json(&["show", "1"], place);
    assert_eq!(show["machine"], "job");
    assert_eq!(show["locks"][0]["key"], "ns/t1");
    assert_eq!(show["holds_locks"], true);
    // Issue 32: the procedure's own summary (`describe`), stored with its record, read
    // by a CLI that has none of the procedure's types.
    assert_eq!(show["summary"], "job stuck");
    assert_eq!(json(&["show", "2"], place)["summary"], "job waiting");
    assert_eq!(
        show["attempts"], 1,
        "stored when it became stuck: its first fatal failure"
    );
    let history = json(&["history", "1"], place);
    let outcomes: Vec<&Value> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["outcome"])
        .collect();
    assert_eq!(outcomes[0], "Moved", "{history}");
    assert!(
        outcomes
            .iter()
            .any(|o| o["Retried"] == "the region server refuses the commit"),
        "{history}"
    );
    let (ok, diagram, stderr) = procflow(&["diagram", "1"], place);
    assert!(
        ok && diagram.starts_with("stateDiagram-v2"),
        "{diagram}{stderr}"
    );
    assert!(diagram.contains("class Commit current"), "{diagram}");
    assert!(diagram.contains("class Reserve,Wait visited"), "{diagram}");
    let (ok, locks, stderr) = procflow(&["locks"], place);
    assert!(
        ok && locks.contains("ns/t1") && locks.contains("exclusive"),
        "{locks}{stderr}"
    );
    let (ok, table, stderr) = procflow(&["list"], place);
    assert!(
        ok && table.starts_with("ID") && table.contains("stuck"),
        "{table}{stderr}"
    );
    let (ok, shown, stderr) = procflow(&["show", "1"], place);
    assert!(
        ok && shown.contains("\n  #1 job ") && !shown.contains("##"),
        "{shown}{stderr}"
    );
    assert!(shown.contains("\nsummary      job stuck\n"), "{shown}");
}
