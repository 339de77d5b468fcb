//! Release 2 of the deploy test's order machine: a field added (`note`), the state
//! `Reserve` renamed `Hold` (its old name an alias), data version 2 reading version 1.

use crate::worker::{Shop, act, stock_key};
use procflow::locks::{Lock, LockKeyError, Locks};
use procflow::prelude::*;
use serde::{Deserialize, Serialize};

/// This build's name, in what it prints.
pub const BUILD: &str = "v2";

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Order, name = "order", env = Shop, version = 2, migrate(1 = OrderV1))]
pub enum OrderState {
    #[initial]
    #[alias = "Reserve"]
    #[transition(to = [Pack])]
    Hold,
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
    pub note: Option<String>,
}

/// Release 1's data, as it stored it.
#[derive(Deserialize)]
pub struct OrderV1 {
    index: u32,
    qty: u32,
}

impl From<OrderV1> for Order {
    fn from(v1: OrderV1) -> Self {
        Order {
            index: v1.index,
            qty: v1.qty,
            note: None,
        }
    }
}

/// Order `index` as this release submits it.
pub fn order(index: u32) -> Order {
    Order {
        index,
        qty: index + 1,
        note: Some("gift".into()),
    }
}

impl OrderStateHandlers for Order {
    async fn hold(&mut self, ctx: &Context<Shop>) -> Step<order_state::Hold> {
        act(ctx.env(), self.index, &format!("reserve o{}", self.index))?;
        Ok(order_state::Hold::Pack.into())
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
        let line = format!("ship o{} qty={} note={:?}", self.index, self.qty, self.note);
        act(ctx.env(), self.index, &line)?;
        Ok(order_state::Ship::Done.into())
    }
    fn locks(&self) -> Result<Locks, LockKeyError> {
        Ok(Locks::new([Lock::exclusive(stock_key(self.index))?]))
    }
}
