//! Release 1 of the deploy test's worker (see `deploy/worker.rs`): `tests/deploy.rs`
//! deploys it over the other release's store, and back.

#[path = "deploy/order_v1.rs"]
mod order;
#[path = "deploy/worker.rs"]
mod worker;

fn main() {
    worker::main();
}
