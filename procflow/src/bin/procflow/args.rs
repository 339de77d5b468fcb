//! The command line.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// See and act on procflow procedures: in a WAL directory (`--store`), in a PostgreSQL
/// (`--postgres`) or etcd (`--etcd`) store, or through a running executor's admin API
/// (`--url`).
#[derive(Parser)]
#[command(name = "procflow", version)]
pub struct Cli {
    /// Print JSON (one document) instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// The admin token, for abort, wake and bypass through `--url`.
    #[arg(long, global = true, env = "PROCFLOW_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// The PostgreSQL schema that holds the store, with `--postgres`: the one the
    /// executors' `PgConfig` names.
    #[arg(long, global = true, value_name = "NAME")]
    pub schema: Option<String>,
    /// The key prefix that holds the store, with `--etcd`: the one the executors'
    /// `EtcdConfig` names.
    #[arg(long, global = true, value_name = "PREFIX")]
    pub prefix: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// List procedures, oldest first.
    List {
        #[command(flatten)]
        filter: Filter,
        #[command(flatten)]
        at: Place,
    },
    /// One procedure's record, with its children as a tree.
    Show {
        id: u64,
        #[command(flatten)]
        at: Place,
    },
    /// One procedure's step history.
    History {
        id: u64,
        #[command(flatten)]
        at: Place,
    },
    /// One procedure's machine as a Mermaid diagram, its path and current state drawn on
    /// it (and while it rolls back, the states still to undo).
    Diagram {
        id: u64,
        #[command(flatten)]
        at: Place,
    },
    /// The locks procedures hold (at rest: take back first at the next start).
    Locks {
        #[command(flatten)]
        at: Place,
    },
    /// Ask procedures to roll back (through `--url`: now; in a `--store`: when an executor
    /// next starts on it).
    Abort {
        #[command(flatten)]
        target: Target,
        #[command(flatten)]
        at: Place,
    },
    /// Wake the procedures suspended on an event (through `--url`: now; in a `--store`:
    /// when an executor next starts on it).
    Wake {
        event: String,
        /// Who asks.
        #[arg(long, default_value_t = whoami())]
        by: String,
        #[command(flatten)]
        at: Place,
    },
    /// End procedures as bypassed, without running their handlers, releasing their locks
    /// (through `--url`: now; in a `--store`: when an executor next starts on it).
    Bypass {
        #[command(flatten)]
        target: Target,
        /// Bypass their live descendants too.
        #[arg(long)]
        recursive: bool,
        #[command(flatten)]
        at: Place,
    },
}

impl Command {
    /// Where the command looks.
    pub fn place_mut(&mut self) -> &mut Place {
        match self {
            Command::List { at, .. }
            | Command::Show { at, .. }
            | Command::History { at, .. }
            | Command::Diagram { at, .. }
            | Command::Locks { at }
            | Command::Abort { at, .. }
            | Command::Wake { at, .. }
            | Command::Bypass { at, .. } => at,
        }
    }
}

/// Where the procedures are: one of `--store DIR`, `--postgres CONNECTION`, `--etcd
/// ENDPOINTS` and `--url URL`.
#[derive(Args, Clone)]
#[group(required = true, multiple = false)]
pub struct Place {
    /// The store's directory (read without its lock; writes need the store stopped).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// A PostgreSQL store's libpq connection string (`host=127.0.0.1 user=app dbname=app`
    /// or `postgresql://app@127.0.0.1/app`), with `--schema`. Read at one snapshot while
    /// executors run on it; requests left in it are carried out by the running leader
    /// within its request poll.
    #[arg(long, value_name = "CONNECTION")]
    pub postgres: Option<String>,
    /// An etcd store's endpoints (`127.0.0.1:2379,127.0.0.1:2381`), with `--prefix`. Read at
    /// one revision while executors run on it; requests left in it are carried out by the
    /// running leader within its request poll.
    #[arg(long, value_name = "ENDPOINTS")]
    pub etcd: Option<String>,
    /// `--schema`, copied here from the global option (not a member of the group).
    #[arg(skip)]
    pub schema: Option<String>,
    /// `--prefix`, copied here from the global option (not a member of the group).
    #[arg(skip)]
    pub prefix: Option<String>,
    /// A running executor's admin API, e.g. `http://127.0.0.1:7077`.
    #[arg(long)]
    pub url: Option<String>,
}

/// What a command without a place says (clap requires one; this is for the code paths
/// that match on it again).
pub const GIVE_A_PLACE: &str = "give --store DIR, --postgres CONNECTION --schema NAME, \
                                --etcd ENDPOINTS --prefix PREFIX or --url URL";

/// Which procedures a command lists or acts on.
#[derive(Args, Clone, Default)]
pub struct Filter {
    /// Only those with this status (runnable, suspended, stuck, rolling-back, succeeded…).
    #[arg(long)]
    pub status: Option<String>,
    /// Only those of this machine.
    #[arg(long)]
    pub machine: Option<String>,
    /// Only those submitted longer ago than this (`90s`, `15m`, `2h`, `3d`).
    #[arg(long)]
    pub older_than: Option<Age>,
}

impl Filter {
    pub fn any(&self) -> bool {
        self.status.is_some() || self.machine.is_some() || self.older_than.is_some()
    }
}

/// The procedures a write command acts on, and who asks why.
#[derive(Args)]
pub struct Target {
    /// Procedure ids (or use the filters for a bulk request).
    pub ids: Vec<u64>,
    #[command(flatten)]
    pub filter: Filter,
    /// Who asks (recorded with the request and in the procedure's history).
    #[arg(long, default_value_t = whoami())]
    pub by: String,
    /// Why.
    #[arg(long, default_value = "")]
    pub reason: String,
}

/// A duration written `90s`, `15m`, `2h` or `3d`.
#[derive(Clone, Copy)]
pub struct Age(pub Duration);

impl FromStr for Age {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not an age: write a number and s, m, h or d (`15m`)");
        let unit = text.chars().last().ok_or_else(bad)?;
        let number: u64 = text[..text.len() - unit.len_utf8()]
            .parse()
            .map_err(|_| bad())?;
        let seconds = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return Err(bad()),
        };
        Ok(Age(Duration::from_secs(number.saturating_mul(seconds))))
    }
}

fn whoami() -> String {
    std::env::var("USER").unwrap_or_else(|_| "operator".to_owned())
}
