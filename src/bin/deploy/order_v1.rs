//! Release 1 of the deploy test's order machine: `Order { index, qty }`, states
//! `Reserve → Pack → Ship → Done`, data version 1.

use crate::worker::{Shop, act, stock_key};
use procflow::locks::{Lock, LockKeyError, Locks};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};

/// This build's name, in what it prints.
pub const BUILD: &str = "v1";

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Order, name = "order", env = Shop)]
pub enum OrderState {
    #[initial]
    #[transition(to = [Pack])]
    Reserve,
    #[transition(to = [Ship])]
    Pack,
    #[transition(to = [Done])]
    Ship,
    #[terminal]
    Done,
}

#[derive(Serialize, Deserialize)]
pub struct Order {
    pub index: u32,
    pub qty: u32,
}

/// Order `index` as this release submits it.
pub fn order(index: u32) -> Order {
    Order {
        index,
        qty: index + 1,
    }
}

impl OrderStateHandlers for Order {
    async fn reserve(&mut self, ctx: &Context<Shop>) -> Step<order_state::Reserve> {
        act(ctx.env(), self.index, &format!("reserve o{}", self.index))?;
        Ok(order_state::Reserve::Pack.into())
    }
    async fn pack(&mut self, ctx: &Context<Shop>) -> Step<order_state::Pack> {
        let event = format!("pack-{}", self.index);
        if !ctx.env().signalled(&event) {
            return Ok(Flow::suspend(event));
        }
        act(ctx.env(), self.index, &format!("pack o{}", self.index))?;
        Ok(order_state::Pack::Ship.into())
    }
    async fn ship(&mut self, ctx: &Context<Shop>) -> Step<order_state::Ship> {
        let event = format!("pay-{}", self.index);
        if !ctx.env().signalled(&event) {
            return Ok(Flow::suspend(event));
        }
        let line = format!("ship o{} qty={}", self.index, self.qty);
        act(ctx.env(), self.index, &line)?;
        Ok(order_state::Ship::Done.into())
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([Lock::exclusive(stock_key(self.index))?]))
    }
}
