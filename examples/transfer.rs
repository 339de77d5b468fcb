//! A money transfer as a saga: debit one account, credit the other, notify both; when a
//! later step fails, the completed steps are compensated in reverse order.
//!
//! ```text
//! cargo run --example transfer                    # one transfer succeeds, one rolls back
//! cargo run --example transfer -- --fail-last     # only the one whose last step fails
//! cargo run --example transfer -- --dir /tmp/bank # keep the ledger (and the WAL) there
//! ```
//!
//! The accounts live in a small file-backed ledger: one file per entry under
//! `<dir>/ledger/` (`p7-debit` holds `alice -30`), a balance is the sum of an account's
//! entries. The machine is `Validate → Debit → Credit → Notify → Done`; `Debit` and
//! `Credit` are `#[rollback]` states whose undo handlers post compensating entries (a
//! refund, a reversal), and `Notify`, the last step, can fail fatally. The example prints
//! every step and rollback step as it runs, the balances before and after each transfer,
//! and checks them: after the failed transfer they are back where they started. It exits
//! with 0 when everything behaved as expected, 1 otherwise.
//!
//! Each transfer pays from the richer account to the other (alice starts with 100, bob
//! with 50), so running again on the same `--dir` keeps working: the ledger and the WAL
//! are kept, and a transfer a previous run left unfinished is resumed and ended first.
//!
//! A step may run twice (the executor re-runs the step that was running when the process
//! died), so each handler is idempotent: entries are keyed by the procedure id
//! (`ctx.id()`) and the step, and writing one again replaces it with the same content.
//! Each transfer holds exclusive locks on both accounts for its life, so two transfers
//! touching the same account never interleave.

use procflow::ProcedureId;
use procflow::executor::{Executor, Outcome};
use procflow::locks::LockKeyError;
use procflow::prelude::*;
use procflow::store::{WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Transfer, name = "transfer", env = Bank)]
enum TransferState {
    #[initial]
    #[transition(to = [Debit])]
    Validate,
    #[transition(to = [Credit])]
    #[rollback]
    Debit,
    #[transition(to = [Notify])]
    #[rollback]
    Credit,
    #[transition(to = [Done])]
    Notify,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
struct Transfer {
    from: String,
    to: String,
    amount: i64,
    /// Make `Notify` fail fatally (the mail server is down for this one).
    fail_notify: bool,
}

/// The ledger: one file per entry, `<root>/ledger/<key>` holding `<account> <amount>`.
/// Entries are never edited, only added (or written again with the same content).
#[derive(Clone)]
struct Ledger {
    root: PathBuf,
}

impl Ledger {
    fn dir(&self) -> PathBuf {
        self.root.join("ledger")
    }

    /// Writes entry `key` whole (to a temporary file, then renamed), so a crash leaves
    /// either no entry or the whole entry, and posting it again changes nothing.
    fn post(&self, key: &str, account: &str, amount: i64) -> std::io::Result<()> {
        let dir = self.dir();
        std::fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!(".{key}.tmp"));
        std::fs::write(&tmp, format!("{account} {amount}\n"))?;
        std::fs::rename(&tmp, dir.join(key))
    }

    /// Posts `key` unless it is there already (the opening deposits of a reused ledger).
    fn post_once(&self, key: &str, account: &str, amount: i64) -> std::io::Result<()> {
        if self.dir().join(key).exists() {
            return Ok(());
        }
        self.post(key, account, amount)
    }

    /// The sum of `account`'s entries.
    fn balance(&self, account: &str) -> std::io::Result<i64> {
        let mut balance = 0;
        for entry in std::fs::read_dir(self.dir())? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue; // A temporary file a crash left behind.
            }
            let text = std::fs::read_to_string(entry.path())?;
            let bad = || {
                let what = format!("bad ledger entry {}: {text:?}", entry.path().display());
                std::io::Error::new(std::io::ErrorKind::InvalidData, what)
            };
            let (owner, amount) = text.trim().split_once(' ').ok_or_else(bad)?;
            if owner == account {
                balance += amount.parse::<i64>().map_err(|_| bad())?;
            }
        }
        Ok(balance)
    }
}

/// What the handlers share: the ledger, and a log of the steps run, for the final checks.
/// The executor owns its environment, so the example keeps a clone to look at.
#[derive(Clone)]
struct Bank {
    ledger: Ledger,
    log: Arc<Mutex<Vec<(ProcedureId, String)>>>,
}

impl Bank {
    /// Prints a step as it happens and remembers it.
    fn record(&self, id: ProcedureId, step: &str, detail: impl std::fmt::Display) {
        println!("  {id} {step:<16} {detail}");
        let mut log = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.push((id, step.to_owned()));
    }

    fn steps_of(&self, id: ProcedureId) -> Vec<String> {
        let log = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.iter()
            .filter(|(of, _)| *of == id)
            .map(|(_, step)| step.clone())
            .collect()
    }
}

/// The ledger entry a step of procedure `id` posts: stable across re-runs of the step.
fn entry_key(id: ProcedureId, what: &str) -> String {
    format!("p{}-{what}", id.get())
}

impl TransferStateHandlers for Transfer {
    async fn validate(&mut self, ctx: &Context<Bank>) -> Step<transfer_state::Validate> {
        if self.amount <= 0 || self.from == self.to {
            return Err(Error::fatal(format!(
                "cannot transfer {} from {} to {}",
                self.amount, self.from, self.to
            )));
        }
        let balance = ctx.env().ledger.balance(&self.from).retryable()?;
        ctx.env().record(
            ctx.id(),
            "Validate",
            format!("{} has {balance}, needs {}", self.from, self.amount),
        );
        if balance < self.amount {
            return Err(Error::fatal(format!(
                "{} has insufficient funds",
                self.from
            )));
        }
        Ok(transfer_state::Validate::Debit.into())
    }

    async fn debit(&mut self, ctx: &Context<Bank>) -> Step<transfer_state::Debit> {
        let key = entry_key(ctx.id(), "debit");
        ctx.env()
            .ledger
            .post(&key, &self.from, -self.amount)
            .retryable()?;
        ctx.env()
            .record(ctx.id(), "Debit", format!("{} -{}", self.from, self.amount));
        Ok(transfer_state::Debit::Credit.into())
    }

    async fn rollback_debit(&mut self, ctx: &Context<Bank>) -> Result<(), Error> {
        let key = entry_key(ctx.id(), "refund");
        ctx.env()
            .ledger
            .post(&key, &self.from, self.amount)
            .retryable()?;
        ctx.env().record(
            ctx.id(),
            "rollback Debit",
            format!("{} +{} (refund)", self.from, self.amount),
        );
        Ok(())
    }

    async fn credit(&mut self, ctx: &Context<Bank>) -> Step<transfer_state::Credit> {
        let key = entry_key(ctx.id(), "credit");
        ctx.env()
            .ledger
            .post(&key, &self.to, self.amount)
            .retryable()?;
        ctx.env()
            .record(ctx.id(), "Credit", format!("{} +{}", self.to, self.amount));
        Ok(transfer_state::Credit::Notify.into())
    }

    async fn rollback_credit(&mut self, ctx: &Context<Bank>) -> Result<(), Error> {
        let key = entry_key(ctx.id(), "reversal");
        ctx.env()
            .ledger
            .post(&key, &self.to, -self.amount)
            .retryable()?;
        ctx.env().record(
            ctx.id(),
            "rollback Credit",
            format!("{} -{} (reversal)", self.to, self.amount),
        );
        Ok(())
    }

    async fn notify(&mut self, ctx: &Context<Bank>) -> Step<transfer_state::Notify> {
        if self.fail_notify {
            ctx.env()
                .record(ctx.id(), "Notify", "mail server refused the message: fatal");
            return Err(Error::fatal("notification refused by the mail server"));
        }
        // A real notifier would send with the key as its idempotency key.
        let key = entry_key(ctx.id(), "notice");
        let outbox = ctx.env().ledger.root.join("outbox");
        std::fs::create_dir_all(&outbox).retryable()?;
        let notice = format!("{} sent {} to {}\n", self.from, self.amount, self.to);
        std::fs::write(outbox.join(key), notice).retryable()?;
        ctx.env().record(
            ctx.id(),
            "Notify",
            format!("told {} and {}", self.from, self.to),
        );
        Ok(transfer_state::Notify::Done.into())
    }

    /// Both accounts, exclusively, for the transfer's whole life (rollback included).
    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([
            Lock::exclusive(format!("accounts/{}", self.from))?,
            Lock::exclusive(format!("accounts/{}", self.to))?,
        ]))
    }
}

const ACCOUNTS: [(&str, i64); 2] = [("alice", 100), ("bob", 50)];

struct Args {
    dir: PathBuf,
    fail_last_only: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut dir = None;
    let mut fail_last_only = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dir" => dir = Some(PathBuf::from(args.next().ok_or("--dir needs a value")?)),
            "--fail-last" => fail_last_only = true,
            "-h" | "--help" => return Err("usage: transfer [--dir DIR] [--fail-last]".into()),
            other => return Err(format!("unknown argument {other}; try --help")),
        }
    }
    let dir = dir.unwrap_or_else(|| {
        let unique = format!(
            "procflow-transfer-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        std::env::temp_dir().join(unique)
    });
    Ok(Args {
        dir,
        fail_last_only,
    })
}

fn balances(ledger: &Ledger) -> std::io::Result<Vec<i64>> {
    ACCOUNTS
        .iter()
        .map(|(name, _)| ledger.balance(name))
        .collect()
}

fn show(balances: &[i64]) -> String {
    let each: Vec<_> = ACCOUNTS
        .iter()
        .zip(balances)
        .map(|((name, _), balance)| format!("{name} {balance}"))
        .collect();
    each.join(", ")
}

/// Turns a failed expectation into the example's error (exit code 1).
fn check(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok { Ok(()) } else { Err(what()) }
}

/// Runs one transfer from the richer account to the other and checks its effect.
async fn run_transfer(
    executor: &Executor<Bank>,
    bank: &Bank,
    amount: i64,
    fail_notify: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let before = balances(&bank.ledger)?;
    let (payer, payee) = if before[0] >= before[1] {
        (0, 1)
    } else {
        (1, 0)
    };
    let transfer = Transfer {
        from: ACCOUNTS[payer].0.into(),
        to: ACCOUNTS[payee].0.into(),
        amount,
        fail_notify,
    };
    let note = if fail_notify {
        " (its notification will fail)"
    } else {
        ""
    };
    println!(
        "\ntransfer {amount} from {} to {}{note}",
        transfer.from, transfer.to
    );
    println!("  balances before: {}", show(&before));
    let id = executor.submit(transfer).await?;
    let outcome = executor.wait(id).await?;
    let after = balances(&bank.ledger)?;
    println!("  {id} {outcome:?}");
    println!("  balances after:  {}", show(&after));

    let steps = bank.steps_of(id);
    let forward = ["Validate", "Debit", "Credit", "Notify"];
    if fail_notify {
        check(
            outcome == Outcome::RolledBack(Error::fatal("notification refused by the mail server")),
            || format!("{id} should have rolled back, but: {outcome:?}"),
        )?;
        let expected: Vec<_> = forward
            .iter()
            .chain(&["rollback Credit", "rollback Debit"])
            .collect();
        check(steps.iter().eq(expected.iter().copied()), || {
            format!("{id} ran {steps:?}, expected {expected:?}")
        })?;
        check(after == before, || {
            format!("the rollback left {}, not {}", show(&after), show(&before))
        })?;
        println!("  ok: rolled back newest first, balances restored");
    } else {
        check(outcome == Outcome::Succeeded, || {
            format!("{id} should have succeeded, but: {outcome:?}")
        })?;
        check(steps.iter().eq(forward.iter()), || {
            format!("{id} ran {steps:?}, expected {forward:?}")
        })?;
        let mut expected = before.clone();
        expected[payer] -= amount;
        expected[payee] += amount;
        check(after == expected, || {
            format!(
                "after the transfer: {}, expected {}",
                show(&after),
                show(&expected)
            )
        })?;
        println!("  ok: {amount} moved");
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let args = parse_args().unwrap_or_else(|message| {
        eprintln!("{message}");
        std::process::exit(2)
    });
    if let Err(error) = run(args).await {
        eprintln!("FAILED: {error}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    println!("ledger: {}", args.dir.join("ledger").display());
    let bank = Bank {
        ledger: Ledger {
            root: args.dir.clone(),
        },
        log: Arc::default(),
    };
    for (name, opening) in ACCOUNTS {
        bank.ledger
            .post_once(&format!("open-{name}"), name, opening)?;
    }

    let store = Arc::new(WalStore::open(args.dir.join("wal"), WalConfig::default())?);
    let executor = Executor::builder(store, bank.clone())
        .register::<TransferState>()
        .start()
        .await?;
    // A transfer an earlier run on this `--dir` left unfinished resumed at `start`; let it
    // end before taking "before" balances.
    for unfinished in executor.list().iter().filter(|p| !p.status.is_finished()) {
        println!("resuming {} at {}", unfinished.id, unfinished.state);
        let outcome = executor.wait(unfinished.id).await?;
        println!("  {} {outcome:?}", unfinished.id);
    }
    let result = async {
        if !args.fail_last_only {
            run_transfer(&executor, &bank, 30, false).await?;
        }
        run_transfer(&executor, &bank, 50, true).await
    }
    .await;
    executor.shutdown().await?;
    result
}

/// `cargo test` runs these (the example has `test = true`): the double-execution checks on
/// this example's procedure, forward and through its rollback.
#[cfg(test)]
mod crash_checks {
    use super::*;
    use procflow::testing::CrashTest;
    use std::collections::BTreeSet;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A bank in a fresh directory per pass, with the opening deposits.
    fn bank() -> Bank {
        static PASS: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "procflow-transfer-check-{}-{}",
            std::process::id(),
            PASS.fetch_add(1, Ordering::SeqCst)
        ));
        let bank = Bank {
            ledger: Ledger { root },
            log: Arc::default(),
        };
        for (name, opening) in ACCOUNTS {
            bank.ledger
                .post_once(&format!("open-{name}"), name, opening)
                .unwrap();
        }
        bank
    }

    /// The balances and the ledger's entries; then removes the ledger.
    fn books(bank: &Bank) -> (i64, i64, BTreeSet<String>) {
        let entries = std::fs::read_dir(bank.ledger.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !name.starts_with('.'))
            .collect();
        let books = (
            bank.ledger.balance("alice").unwrap(),
            bank.ledger.balance("bob").unwrap(),
            entries,
        );
        let _ = std::fs::remove_dir_all(&bank.ledger.root);
        books
    }

    fn transfer(fail_notify: bool) -> Transfer {
        Transfer {
            from: "alice".into(),
            to: "bob".into(),
            amount: 30,
            fail_notify,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transfer_survives_double_execution() {
        let test = CrashTest::new(|b| b.register::<TransferState>());
        let report = test
            .double_execution::<TransferState, _>(bank, || transfer(false), books)
            .await
            .unwrap();
        assert_eq!(report.clean.outcome, Outcome::Succeeded);
        assert_eq!((report.observed.0, report.observed.1), (70, 80));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn failed_transfer_rolls_back_through_double_execution() {
        let test = CrashTest::new(|b| b.register::<TransferState>());
        let report = test
            .rollback_double_execution::<TransferState, _>(bank, || transfer(true), None, books)
            .await
            .unwrap();
        assert!(matches!(report.clean.outcome, Outcome::RolledBack(_)));
        // Every debit and credit has its reversal: the balances are back.
        assert_eq!((report.observed.0, report.observed.1), (100, 50));
        assert!(report.killed_before.kills >= 2);
    }
}
