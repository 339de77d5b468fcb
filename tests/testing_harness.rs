//! `procflow::testing` catches what it is for: a handler that is not idempotent.

use procflow::prelude::*;
use procflow::testing::{CrashTest, CrashTestError};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Deposit, env = Bank)]
enum DepositState {
    #[initial]
    #[transition(to = [Notify])]
    Credit,
    #[transition(to = [Done])]
    Notify,
    #[terminal]
    Done,
}

#[derive(Default)]
struct Bank {
    balance: Mutex<u64>,
    credited: Mutex<Vec<u64>>,
}

#[derive(Serialize, Deserialize, Clone)]
struct Deposit {
    cents: u64,
    idempotent: bool,
}

impl DepositStateHandlers for Deposit {
    async fn credit(&mut self, ctx: &Context<Bank>) -> Step<deposit_state::Credit> {
        let bank = ctx.env();
        let mut credited = bank.credited.lock().unwrap();
        if !self.idempotent || !credited.contains(&ctx.id().get()) {
            credited.push(ctx.id().get());
            *bank.balance.lock().unwrap() += self.cents;
        }
        Ok(deposit_state::Credit::Notify.into())
    }
    async fn notify(&mut self, _: &Context<Bank>) -> Step<deposit_state::Notify> {
        Ok(deposit_state::Notify::Done.into())
    }
}

fn test() -> CrashTest<Bank> {
    CrashTest::new(|builder| builder.register::<DepositState>())
}

fn balance(bank: &Bank) -> u64 {
    *bank.balance.lock().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_procedure_passes() {
    let deposit = || Deposit {
        cents: 500,
        idempotent: true,
    };
    let report = test()
        .double_execution::<DepositState, _>(Bank::default, deposit, balance)
        .await
        .unwrap();
    assert_eq!(report.observed, 500);
    // Submit, the step to `Notify`, and the end carrying the step to `Done`: killed once
    // before each of the three writes.
    assert_eq!(report.killed_before.kills, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_is_not_idempotent_is_caught() {
    let deposit = || Deposit {
        cents: 500,
        idempotent: false,
    };
    let error = test()
        .double_execution::<DepositState, _>(Bank::default, deposit, balance)
        .await
        .unwrap_err();
    match error {
        CrashTestError::Environment {
            pass,
            expected,
            found,
        } => {
            assert_eq!(pass, "killed before store writes");
            assert_eq!((expected.as_str(), found.as_str()), ("500", "1000"));
        }
        other => panic!("expected an environment mismatch, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_check_needs_a_rollback() {
    let deposit = || Deposit {
        cents: 1,
        idempotent: true,
    };
    let error = test()
        .rollback_double_execution::<DepositState, _>(Bank::default, deposit, None, balance)
        .await
        .unwrap_err();
    assert!(matches!(error, CrashTestError::NoRollback(_)), "{error}");
}
