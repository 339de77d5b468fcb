//! The generated code is lint-clean: a public machine, derived under the strictest lints
//! a library would use. `cargo clippy --all-targets` (run by CI) checks the clippy ones.

#![deny(warnings, missing_docs, unreachable_pub, unused_qualifications)]
#![deny(clippy::all, clippy::pedantic)]

use procflow::prelude::*;
use serde::{Deserialize, Serialize};

/// The steps of provisioning an account.
#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[state_machine(procedure = Provision, name = "provision", env = Directory, max_repeats = 8)]
pub enum ProvisionState {
    /// Check the request.
    #[initial]
    #[transition(to = [CreateUser, Rejected])]
    Validate,
    /// Create the user record.
    #[transition(to = [Grant])]
    #[rollback]
    CreateUser,
    /// Grant access; retried until it sticks.
    #[transition(to = [Grant, Notify])]
    #[max_repeats = 3]
    #[no_rollback]
    Grant,
    /// Tell the user.
    #[transition(to = [Done])]
    Notify,
    /// Provisioned.
    #[terminal]
    Done,
    /// Refused.
    #[terminal]
    Rejected,
}

/// The shared environment.
#[derive(Debug, Default)]
pub struct Directory;

/// The procedure's data.
#[derive(Debug, Serialize, Deserialize)]
pub struct Provision {
    /// Who to provision.
    pub user: String,
    granted: bool,
}

impl ProvisionStateHandlers for Provision {
    async fn validate(&mut self, _: &Context<Directory>) -> Step<provision_state::Validate> {
        Ok(if self.user.is_empty() {
            provision_state::Validate::Rejected
        } else {
            provision_state::Validate::CreateUser
        }
        .into())
    }

    async fn create_user(&mut self, _: &Context<Directory>) -> Step<provision_state::CreateUser> {
        Ok(provision_state::CreateUser::Grant.into())
    }

    async fn rollback_create_user(&mut self, _: &Context<Directory>) -> Result<(), Error> {
        Ok(())
    }

    async fn grant(&mut self, _: &Context<Directory>) -> Step<provision_state::Grant> {
        if self.granted {
            return Ok(provision_state::Grant::Notify.into());
        }
        self.granted = true;
        Ok(provision_state::Grant::Grant.into())
    }

    async fn notify(&mut self, _: &Context<Directory>) -> Step<provision_state::Notify> {
        Ok(provision_state::Notify::Done.into())
    }
}

#[tokio::test]
async fn lint_clean_machine_runs() {
    let provision = Provision {
        user: "ada".into(),
        granted: false,
    };
    let mut run = procflow::Stepper::<ProvisionState>::new(provision, Directory);
    assert_eq!(run.run().await, &procflow::Phase::Succeeded);
    assert_eq!(run.cursor().state(), ProvisionState::Done);
    assert_eq!(run.cursor().entries(ProvisionState::Grant), 2);
}
