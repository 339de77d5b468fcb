//! The process `tests/kill9_orders.rs` kills with SIGKILL, over and over: an order
//! workload with child procedures, timeouts, locks and events.
//!
//! ```text
//! order_worker --dir DIR [--seed 1] [--orders 42] [--span-ms 20000] [--finish-within SECS]
//!              [--break-idempotence] [--break-locks]
//! ```
//!
//! # The workload
//!
//! `--orders` root procedures (`order`), each of one kind, chosen round-robin with seeded
//! parameters (`--seed`), so every run on the same `DIR` (every restart) plans the same
//! orders. The plan is written to `DIR/plan` for the checker. Orders arrive over the
//! first three quarters of `--span-ms` (the lock contenders within its first tenth): the
//! driver submits each at `epoch + arrival`, with a nonce, so a restarted worker finds the
//! ones submitted before and submits the rest when they are due. An order goes through
//! `Reserve → AwaitPayment → Fulfil → Charge → Ship → Done`; `Fulfil` may spawn `item`
//! children (`Pick → Pack → Label → Done`); `Ship` is the point of no return.
//!
//! | kind | what it exercises | expected |
//! |---|---|---|
//! | `plain` | zero to two items, all succeed | succeeded |
//! | `paid` | `AwaitPayment` asks for payment (`DIR/signals/pay-<order>.request`) and suspends on `pay-<order>`; the driver pays either within half a step of the request (mostly before the suspension) or at a random moment of the span | succeeded |
//! | `child-fails` | 3–4 items: one fails fatally at once, its siblings are slow or suspended on `hold-<order>` (signalled late, or never) | rolled back |
//! | `timeout-event` | a procedure timeout, `AwaitPayment` waits for `never-<order>` | rolled back |
//! | `timeout-children` | a procedure timeout shorter than its slow items | rolled back |
//! | `life-lock` | exclusive `sku/0` or `sku/1` held for life, with or without items; some fail at `Charge` (rolled back while holding) | succeeded or rolled back |
//! | `step-lock` | the same keys, exclusive per step | succeeded |
//! | `cancelled` | `AwaitPayment` waits for `never-<order>` until the driver aborts the order (again at each restart: an abort is not persisted) | rolled back |
//! | `stuck` | `Ship` (`#[no_rollback]`) fails fatally: the order must become `Stuck`, visibly, not retry forever | stuck |
//! | `stock-undo` | two or three items, each holding the exclusive `stock/s4` for life (items of every `stock-*` order contend for it); `Charge` fails, so the items that succeeded (and released the key) are revived to roll back, and queue for the key again behind other orders' items | rolled back |
//! | `stock-stop` | three items on `stock/s4` for life; one fails at `Pick`, so its siblings are stopped, most of them while queued for the key | rolled back |
//!
//! # Effects (outside the store)
//!
//! - `DIR/effects/<order>`: the order tree's effects, one line each: `start <proc> <state>`
//!   when a step begins, `do <proc> <state>` when it completed its work, `undo <proc>
//!   <state>` from a rollback handler, and `end <order> <outcome>` from the driver once the
//!   order ended. Every write is idempotent (a line already in the file is not written
//!   again), so a step re-run after a kill leaves no duplicate; `--break-idempotence`
//!   writes unconditionally, which the checker must catch.
//! - `DIR/locks/<key>`: a step holding lock `<key>` appends `<key> <owner> <span>` when it
//!   begins and when it ends (rollback steps too), each in one `O_APPEND` write. `<span>`
//!   names the stretch the owner holds the key through: `life` for an order holding it for
//!   life; `fwd` and `undo` for an item holding it for life (an item that succeeded gave the
//!   key back, and takes it again when revived to roll back: two stretches); and
//!   `step-<state>-<run>` for a per-step locker (`<run>` counts the worker's starts, from
//!   `DIR/runs`, so a step re-run after a kill is a new stretch). The checker finds no
//!   other owner's line inside any stretch. `--break-locks` makes the per-step lockers
//!   declare no lock (they still write the lines), which the checker must catch.
//!
//! # Events
//!
//! The driver signals `pay-*` and some `hold-*` events at `epoch + delay` (wall clock; the
//! epoch is the first run's start, in `DIR/epoch`, so delays span the kills), or for
//! the quick payers `delay` after the request file was written: it creates
//! `DIR/signals/<event>`, then wakes the event once. Steps test that file before they
//! suspend (condition-variable style): a signal set before the step runs is seen there;
//! a wake that lands after the test, while the step that will suspend still runs, must
//! not be lost (guarantee (d)), and the quick payers make that happen often. After a
//! restart the driver wakes every event already signalled once, at startup: it cannot
//! know which wake-ups a killed process had delivered. The wake is one function,
//! `wake`, for the switch to the durable (async) `Executor::wake`.
//!
//! Prints `orders N succeeded S rolled_back R failed F stuck T` and exits 0 once every
//! order and every child has ended (or is stuck). With `--finish-within`, prints what is still live and exits 3
//! if that takes longer. Exits 1 on any error.

use procflow::ProcedureId;
use procflow::executor::{Executor, Status, SubmitOptions};
use procflow::prelude::*;
use procflow::store::{WalConfig, WalStore};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Order, env = Shop, name = "order")]
enum OrderState {
    #[initial]
    #[transition(to = [AwaitPayment])]
    #[rollback]
    Reserve,
    #[transition(to = [Fulfil])]
    #[rollback]
    AwaitPayment,
    #[transition(to = [Charge])]
    #[rollback]
    Fulfil,
    #[transition(to = [Ship])]
    #[rollback]
    Charge,
    #[transition(to = [Done])]
    #[no_rollback]
    Ship,
    #[terminal]
    Done,
}

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Item, env = Shop, name = "item")]
enum ItemState {
    #[initial]
    #[transition(to = [Pack])]
    #[rollback]
    Pick,
    #[transition(to = [Label])]
    #[rollback]
    Pack,
    #[transition(to = [Done])]
    #[rollback]
    Label,
    #[terminal]
    Done,
}

/// The lock an order declares: `key`, exclusive, for life or per step.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct LockSpec {
    key: String,
    for_life: bool,
}

/// A root procedure; its fields are the plan, fixed at submit.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Order {
    /// `o<index>`: the name in effects, lock lines and the nonce.
    name: String,
    /// One of [`KINDS`].
    kind: String,
    /// The key it locks (and writes lock lines to), if any.
    lock: Option<LockSpec>,
    /// Whether `locks` declares `lock` (only `--break-locks` says no: the steps then
    /// write their lock lines without holding the key).
    declare_lock: bool,
    /// `AwaitPayment` waits until this event is signalled.
    await_event: Option<String>,
    /// Spawned by `Fulfil`.
    items: Vec<Item>,
    /// `Charge` fails fatally (the tree rolls back).
    fail_charge: bool,
    /// `Ship`, past the point of no return, fails fatally (the carrier refuses for good).
    fail_ship: bool,
    /// How long each step works.
    step_ms: u64,
    /// The procedure timeout (`SubmitOptions::timeout`).
    timeout_ms: Option<u64>,
    /// When the customer cancels it (`Executor::abort`), after the epoch.
    cancel_ms: Option<u64>,
    /// When the driver submits it, after the epoch: orders arrive over the span, so some
    /// arrive (and suspend, and get paid) during the final run, where no restart heals a
    /// lost wake-up.
    arrival_ms: u64,
}

/// A child procedure of an order.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct Item {
    /// `<order>.i<index>`.
    name: String,
    /// The order's name: effects go to its file.
    order: String,
    /// `Pick` fails fatally.
    fail: bool,
    /// `Pick` waits until this event is signalled.
    wait_event: Option<String>,
    /// How long each step works.
    step_ms: u64,
    /// The key it holds exclusively for life (and writes lock lines to), if any.
    #[serde(default)]
    lock: Option<String>,
}

/// What the handlers share: where effects, lock lines and signals live.
struct Shop {
    /// `DIR/effects`: one file per order tree.
    effects: PathBuf,
    /// `DIR/locks`: one file per lock key.
    locks: PathBuf,
    /// `DIR/signals`: the driver's signals and the orders' payment requests.
    signals: PathBuf,
    /// Effects are written once (not with `--break-idempotence`).
    idempotent: bool,
    /// `--break-locks`.
    break_locks: bool,
    /// This start's number (1 for the first run on the directory): names per-step spans.
    run: u64,
}

impl Shop {
    /// Appends `line` to the order's effect file unless it is there already.
    fn effect(&self, order: &str, line: &str) -> std::io::Result<()> {
        let path = self.effects.join(order);
        if self.idempotent {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.lines().any(|l| l == line) {
                return Ok(()); // Done before a kill: the effect is already there.
            }
        }
        append(&path, line)
    }

    /// Appends `<key> <owner> <span>` to the key's file, in one write.
    fn lock_line(&self, key: &str, owner: &str, span: &str) -> std::io::Result<()> {
        append(
            &self.locks.join(key.replace('/', "_")),
            &format!("{key} {owner} {span}"),
        )
    }

    /// Asks for `event` (a payment request): the driver answers some requests.
    fn request(&self, event: &str) -> std::io::Result<()> {
        write_once(&self.signals.join(format!("{event}.request")), "").map(drop)
    }

    /// Whether the driver has signalled `event`.
    fn signalled(&self, event: &str) -> bool {
        self.signals.join(event).exists()
    }
}

/// One `O_APPEND` write of `line` and its newline: a kill lands before or after it.
fn append(path: &Path, line: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    file.write_all(format!("{line}\n").as_bytes())
}

fn sleep_ms(ms: u64) -> tokio::time::Sleep {
    tokio::time::sleep(Duration::from_millis(ms))
}

impl Order {
    /// A forward step's work: `start`, a lock line, the work (a sleep, so kills land
    /// between the start and the end), a lock line, `do`. A for-life holder writes its
    /// lines from its first step on: the executor records the grant before that step runs,
    /// so a restart gives the key back to it even then.
    async fn act(&self, shop: &Shop, state: &str) -> Result<(), Error> {
        shop.effect(&self.name, &format!("start {} {state}", self.name))
            .retryable()?;
        self.lock_line(shop, state)?;
        sleep_ms(self.step_ms).await;
        self.lock_line(shop, state)?;
        shop.effect(&self.name, &format!("do {} {state}", self.name))
            .retryable()
    }

    /// A rollback step's work: lock lines around `undo`.
    async fn undo(&self, shop: &Shop, state: &str) -> Result<(), Error> {
        self.lock_line(shop, state)?;
        sleep_ms(self.step_ms / 2).await;
        shop.effect(&self.name, &format!("undo {} {state}", self.name))
            .retryable()?;
        self.lock_line(shop, state)
    }

    /// A lock line of the step in `state`: the span is the order's life, or the step.
    fn lock_line(&self, shop: &Shop, state: &str) -> Result<(), Error> {
        let Some(lock) = &self.lock else {
            return Ok(());
        };
        let span = if lock.for_life {
            "life".to_owned()
        } else {
            format!("step-{state}-{}", shop.run)
        };
        shop.lock_line(&lock.key, &self.name, &span).retryable()
    }
}

impl OrderStateHandlers for Order {
    async fn reserve(&mut self, ctx: &Context<Shop>) -> Step<order_state::Reserve> {
        self.act(ctx.env(), "Reserve").await?;
        Ok(order_state::Reserve::AwaitPayment.into())
    }

    /// Waits for the payment event, condition-variable style: test the signal, and
    /// suspend only if it is not there (a wake before the suspension is then not needed).
    async fn await_payment(&mut self, ctx: &Context<Shop>) -> Step<order_state::AwaitPayment> {
        let shop = ctx.env();
        if let Some(event) = &self.await_event
            && !shop.signalled(event)
        {
            shop.effect(&self.name, &format!("start {} AwaitPayment", self.name))
                .retryable()?;
            shop.request(event).retryable()?;
            // The step still works after its test: the answer may come now, before
            // the suspension, and its wake must not be lost (guarantee (d)).
            sleep_ms(self.step_ms / 2).await;
            return Ok(Flow::suspend(event.clone()));
        }
        self.act(shop, "AwaitPayment").await?;
        Ok(order_state::AwaitPayment::Fulfil.into())
    }

    async fn fulfil(&mut self, ctx: &Context<Shop>) -> Step<order_state::Fulfil> {
        self.act(ctx.env(), "Fulfil").await?;
        if self.items.is_empty() {
            return Ok(order_state::Fulfil::Charge.into());
        }
        let children = self
            .items
            .iter()
            .map(Child::new::<ItemState>)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Flow::spawn(children, order_state::Fulfil::Charge))
    }

    async fn charge(&mut self, ctx: &Context<Shop>) -> Step<order_state::Charge> {
        let shop = ctx.env();
        if self.fail_charge {
            shop.effect(&self.name, &format!("start {} Charge", self.name))
                .retryable()?;
            self.lock_line(shop, "Charge")?;
            return Err(Error::fatal(format!("{}: card declined", self.name)));
        }
        self.act(shop, "Charge").await?;
        Ok(order_state::Charge::Ship.into())
    }

    async fn ship(&mut self, ctx: &Context<Shop>) -> Step<order_state::Ship> {
        let shop = ctx.env();
        if self.fail_ship {
            shop.effect(&self.name, &format!("start {} Ship", self.name))
                .retryable()?;
            return Err(Error::fatal(format!(
                "{}: the carrier refuses it",
                self.name
            )));
        }
        self.act(shop, "Ship").await?;
        Ok(order_state::Ship::Done.into())
    }

    async fn rollback_reserve(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "Reserve").await
    }

    async fn rollback_await_payment(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "AwaitPayment").await
    }

    async fn rollback_fulfil(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "Fulfil").await
    }

    async fn rollback_charge(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "Charge").await
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        let Some(spec) = self.lock.as_ref().filter(|_| self.declare_lock) else {
            return Ok(Locks::none());
        };
        let locks = Locks::new([Lock::exclusive(&spec.key)?]);
        Ok(if spec.for_life {
            locks
        } else {
            locks.per_step()
        })
    }
}

impl Item {
    async fn act(&self, shop: &Shop, state: &str) -> Result<(), Error> {
        shop.effect(&self.order, &format!("start {} {state}", self.name))
            .retryable()?;
        self.lock_line(shop, "fwd")?;
        sleep_ms(self.step_ms).await;
        self.lock_line(shop, "fwd")?;
        shop.effect(&self.order, &format!("do {} {state}", self.name))
            .retryable()
    }

    async fn undo(&self, shop: &Shop, state: &str) -> Result<(), Error> {
        self.lock_line(shop, "undo")?;
        sleep_ms(self.step_ms / 4).await;
        shop.effect(&self.order, &format!("undo {} {state}", self.name))
            .retryable()?;
        self.lock_line(shop, "undo")
    }

    /// A lock line of a step of an item that holds its key for life: `fwd` while it runs
    /// forward, `undo` while it rolls back.
    fn lock_line(&self, shop: &Shop, span: &str) -> Result<(), Error> {
        match &self.lock {
            Some(key) => shop.lock_line(key, &self.name, span).retryable(),
            None => Ok(()),
        }
    }
}

impl ItemStateHandlers for Item {
    async fn pick(&mut self, ctx: &Context<Shop>) -> Step<item_state::Pick> {
        let shop = ctx.env();
        if let Some(event) = &self.wait_event
            && !shop.signalled(event)
        {
            shop.effect(&self.order, &format!("start {} Pick", self.name))
                .retryable()?;
            return Ok(Flow::suspend(event.clone()));
        }
        if self.fail {
            shop.effect(&self.order, &format!("start {} Pick", self.name))
                .retryable()?;
            self.lock_line(shop, "fwd")?;
            sleep_ms(self.step_ms).await;
            self.lock_line(shop, "fwd")?;
            return Err(Error::fatal(format!("{}: out of stock", self.name)));
        }
        self.act(shop, "Pick").await?;
        Ok(item_state::Pick::Pack.into())
    }

    async fn pack(&mut self, ctx: &Context<Shop>) -> Step<item_state::Pack> {
        self.act(ctx.env(), "Pack").await?;
        Ok(item_state::Pack::Label.into())
    }

    async fn label(&mut self, ctx: &Context<Shop>) -> Step<item_state::Label> {
        self.act(ctx.env(), "Label").await?;
        Ok(item_state::Label::Done.into())
    }

    async fn rollback_pick(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "Pick").await
    }

    async fn rollback_pack(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "Pack").await
    }

    async fn rollback_label(&mut self, ctx: &Context<Shop>) -> Result<(), Error> {
        self.undo(ctx.env(), "Label").await
    }

    fn locks(&self) -> Result<Locks, LockKeyError> {
        match &self.lock {
            Some(key) => Ok(Locks::new([Lock::exclusive(key)?])),
            None => Ok(Locks::none()),
        }
    }
}

/// SplitMix64: the plan must be the same on every run of one seed, and this needs no
/// dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `low..high`.
    fn range(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low)
    }

    /// True with probability `percent` / 100.
    fn chance(&mut self, percent: u64) -> bool {
        self.range(0, 100) < percent
    }
}

const KINDS: [&str; 11] = [
    "plain",
    "paid",
    "child-fails",
    "timeout-event",
    "timeout-children",
    "life-lock",
    "step-lock",
    "stuck",
    "cancelled",
    "stock-undo",
    "stock-stop",
];

/// The contended lock keys.
const SKUS: u64 = 2;

/// The one stock key every item of the `stock-*` orders holds for life.
const STOCK: &str = "stock/s4";

/// An event the driver signals `delay_ms` after the epoch, or, for a payment answering
/// a request, `delay_ms` after the order asked for it.
#[derive(Clone, Debug)]
struct Signal {
    event: String,
    delay_ms: u64,
    after_request: bool,
}

/// The orders, and the events the driver signals.
struct Plan {
    orders: Vec<Order>,
    signals: Vec<Signal>,
}

/// The same plan for the same seed, order count and span.
fn plan(seed: u64, count: u32, span_ms: u64) -> Plan {
    let mut rng = Rng(seed);
    let mut plan = Plan {
        orders: Vec::new(),
        signals: Vec::new(),
    };
    for index in 0..count {
        let kind = KINDS[index as usize % KINDS.len()];
        let order = plan_order(&mut rng, &mut plan.signals, index, kind, span_ms);
        plan.orders.push(order);
    }
    // The slowest customer pays at the end of the span: the work lasts at least that long,
    // so the kills land on a worker with work left.
    if let Some(last) = plan
        .signals
        .iter_mut()
        .rfind(|s| s.event.starts_with("pay-"))
    {
        last.delay_ms = span_ms;
        last.after_request = false;
    }
    plan
}

fn plan_order(
    rng: &mut Rng,
    signals: &mut Vec<Signal>,
    index: u32,
    kind: &str,
    span_ms: u64,
) -> Order {
    let name = format!("o{index}");
    let mut order = Order {
        name: name.clone(),
        kind: kind.to_owned(),
        lock: None,
        declare_lock: true,
        await_event: None,
        items: Vec::new(),
        fail_charge: false,
        fail_ship: false,
        step_ms: rng.range(20, 120),
        timeout_ms: None,
        cancel_ms: None,
        arrival_ms: rng.range(0, span_ms * 3 / 4),
    };
    let item = |rng: &mut Rng, i: usize, step_ms: u64| Item {
        name: format!("{name}.i{i}"),
        order: name.clone(),
        fail: false,
        wait_event: None,
        step_ms: rng.range(step_ms / 2, step_ms),
        lock: None,
    };
    match kind {
        "plain" => {
            let n = rng.range(0, 3) as usize;
            order.items = (0..n).map(|i| item(rng, i, 100)).collect();
        }
        "paid" => {
            // Most pay quickly, answering the request while the step that will suspend
            // still runs. The others pay at some moment of the span. They arrive late:
            // a wake-up lost in the final run is not healed by the next restart.
            order.arrival_ms = rng.range(span_ms / 3, span_ms * 3 / 4);
            let event = format!("pay-{name}");
            let after_request = rng.chance(60);
            let delay_ms = if after_request {
                rng.range(0, order.step_ms / 2)
            } else {
                rng.range(span_ms / 10, span_ms)
            };
            signals.push(Signal {
                event: event.clone(),
                delay_ms,
                after_request,
            });
            order.await_event = Some(event);
        }
        "child-fails" => {
            let n = rng.range(3, 5) as usize;
            order.items = (0..n).map(|i| item(rng, i, 400)).collect();
            let failing = rng.range(0, n as u64) as usize;
            order.items[failing].fail = true;
            order.items[failing].step_ms = 10;
            // One sibling waits for an event: signalled late (it would run on after the
            // failure unless stopped), or never (only a stop ends it).
            let waiting = (failing + 1) % n;
            let event = format!("hold-{name}");
            if rng.chance(50) {
                let delay_ms = rng.range(span_ms / 4, span_ms / 2);
                signals.push(Signal {
                    event: event.clone(),
                    delay_ms,
                    after_request: false,
                });
            }
            order.items[waiting].wait_event = Some(event);
        }
        "timeout-event" => {
            order.await_event = Some(format!("never-{name}"));
            order.timeout_ms = Some(rng.range(300, 2000));
        }
        "timeout-children" => {
            // Quick up to the spawn, then items of 3 steps of 300-600 ms each: the
            // deadline passes while the order waits for them.
            order.step_ms = 20;
            order.timeout_ms = Some(rng.range(400, 700));
            let n = rng.range(2, 4) as usize;
            order.items = (0..n).map(|i| item(rng, i, 600)).collect();
        }
        "life-lock" | "step-lock" => {
            order.lock = Some(LockSpec {
                key: format!("sku/{}", rng.range(0, SKUS)),
                for_life: kind == "life-lock",
            });
            order.fail_charge = kind == "life-lock" && rng.chance(35);
            // Early, so that they contend for the keys while the kills land.
            order.arrival_ms = rng.range(0, span_ms / 10);
            order.step_ms = rng.range(40, 150);
            if rng.chance(50) {
                order.items = (0..2).map(|i| item(rng, i, 100)).collect();
            }
        }
        "stuck" => {
            let n = rng.range(0, 2) as usize;
            order.items = (0..n).map(|i| item(rng, i, 100)).collect();
            order.fail_ship = true;
        }
        "cancelled" => {
            // Waits for a payment that never comes, until the customer cancels.
            order.await_event = Some(format!("never-{name}"));
            order.cancel_ms = Some(order.arrival_ms + rng.range(200, span_ms / 2));
        }
        "stock-undo" | "stock-stop" => {
            // Early and quick up to the spawn, so that the items of all of them contend
            // for the stock key while the kills land.
            order.arrival_ms = rng.range(0, span_ms / 10);
            order.step_ms = rng.range(20, 60);
            let n = if kind == "stock-stop" {
                3
            } else {
                rng.range(2, 4) as usize
            };
            order.items = (0..n).map(|i| item(rng, i, 90)).collect();
            for item in &mut order.items {
                item.lock = Some(STOCK.to_owned());
            }
            if kind == "stock-undo" {
                // Every item succeeds and gives the key back; then the order fails, and
                // revives them to roll back: they queue for the key again.
                order.fail_charge = true;
            } else {
                // The last item fails at once; the others are stopped, queued for the
                // key behind each other and behind other orders' items.
                order.items[n - 1].fail = true;
            }
        }
        _ => unreachable!("unknown kind {kind}"),
    }
    order
}

impl Order {
    /// How it must end.
    fn expected(&self) -> &'static str {
        if self.fail_ship {
            return "stuck";
        }
        let fails = self.fail_charge
            || self.timeout_ms.is_some()
            || self.cancel_ms.is_some()
            || self.items.iter().any(|item| item.fail);
        if fails { "rolled_back" } else { "succeeded" }
    }

    /// Its line of `DIR/plan`: `<order> <kind> expect=<outcome> life=<key or -> procs=..`.
    fn plan_line(&self) -> String {
        let life = match &self.lock {
            Some(LockSpec {
                key,
                for_life: true,
            }) => key.as_str(),
            _ => "-",
        };
        let mut procs = self.name.clone();
        for item in &self.items {
            let _ = write!(procs, ",{}", item.name);
        }
        format!(
            "{} {} expect={} life={life} procs={procs}",
            self.name,
            self.kind,
            self.expected()
        )
    }
}

/// The command line (see the module docs).
struct Args {
    dir: PathBuf,
    seed: u64,
    orders: u32,
    span_ms: u64,
    finish_within: Option<Duration>,
    idempotent: bool,
    break_locks: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: PathBuf::new(),
        seed: 1,
        orders: 42,
        span_ms: 20_000,
        finish_within: None,
        idempotent: true,
        break_locks: false,
    };
    let mut dir = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{arg}: {e}"));
        match arg.as_str() {
            "--dir" => dir = Some(PathBuf::from(value()?)),
            "--seed" => args.seed = number(value()?)?,
            "--orders" => {
                args.orders = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?;
            }
            "--span-ms" => args.span_ms = number(value()?)?,
            "--finish-within" => {
                args.finish_within = Some(Duration::from_secs(number(value()?)?));
            }
            "--break-idempotence" => args.idempotent = false,
            "--break-locks" => args.break_locks = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    args.dir = dir.ok_or("--dir is required")?;
    Ok(args)
}

#[tokio::main]
async fn main() {
    match run().await {
        Ok(true) => {}
        Ok(false) => std::process::exit(3),
        Err(error) => {
            eprintln!("order_worker: {error}");
            std::process::exit(1);
        }
    }
}

type Failure = Box<dyn std::error::Error>;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes `text` to `path` unless it exists, atomically (a kill leaves all or nothing);
/// returns the file's text.
fn write_once(path: &Path, text: &str) -> std::io::Result<String> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        return Ok(existing);
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(text.to_owned())
}

/// Counts this start in `path` (atomically: a kill leaves the old count or the new one)
/// and returns its number, 1 for the first.
fn count_run(path: &Path) -> std::io::Result<u64> {
    let before: u64 = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, (before + 1).to_string())?;
    std::fs::rename(&tmp, path)?;
    Ok(before + 1)
}

/// Runs the workload; `Ok(false)` when `--finish-within` passed first.
async fn run() -> Result<bool, Failure> {
    let args = parse_args()?;
    let shop = Shop {
        effects: args.dir.join("effects"),
        locks: args.dir.join("locks"),
        signals: args.dir.join("signals"),
        idempotent: args.idempotent,
        break_locks: args.break_locks,
        run: 0,
    };
    for dir in [&shop.effects, &shop.locks, &shop.signals] {
        std::fs::create_dir_all(dir)?;
    }
    let epoch: u64 = write_once(&args.dir.join("epoch"), &now_ms().to_string())?
        .trim()
        .parse()?;
    let run = count_run(&args.dir.join("runs"))?;
    let plan = plan(args.seed, args.orders, args.span_ms);
    let lines: String = plan.orders.iter().map(|o| o.plan_line() + "\n").collect();
    write_once(&args.dir.join("plan"), &lines)?;

    let store = Arc::new(WalStore::open(args.dir.join("wal"), WalConfig::default())?);
    let executor = Executor::builder(store, Shop { run, ..shop })
        .register::<OrderState>()
        .register::<ItemState>()
        .start()
        .await?;
    let driver = tokio::spawn(drive_signals(executor.clone(), plan.signals.clone(), epoch));
    let submitted = Submitted::default();
    let all = run_orders(&executor, &plan.orders, epoch, &submitted);
    let finished = match args.finish_within {
        Some(limit) => tokio::time::timeout(limit, all).await.ok(),
        None => Some(all.await),
    };
    driver.abort();
    let Some(counts) = finished.transpose()? else {
        report_live(&executor, &submitted);
        executor.kill();
        return Ok(false);
    };
    executor.shutdown().await?;
    println!(
        "orders {} succeeded {} rolled_back {} failed {} stuck {}",
        plan.orders.len(),
        counts[0],
        counts[1],
        counts[2],
        counts[3]
    );
    Ok(true)
}

/// The orders submitted so far, by id (for the report of what is still live).
type Submitted = Arc<std::sync::Mutex<Vec<(ProcedureId, String)>>>;

/// Submits every order at its arrival (the nonce finds the ones an earlier run
/// submitted) and waits for it, recording its end in its effect file; then waits for
/// every child. Returns the counts of succeeded, rolled back, failed and stuck orders.
async fn run_orders(
    executor: &Executor<Shop>,
    orders: &[Order],
    epoch: u64,
    submitted: &Submitted,
) -> Result<[u32; 4], Failure> {
    let mut orders_ended = tokio::task::JoinSet::new();
    for order in orders {
        let (executor, submitted) = (executor.clone(), Arc::clone(submitted));
        let order = order.clone();
        orders_ended.spawn(async move {
            sleep_ms((epoch + order.arrival_ms).saturating_sub(now_ms())).await;
            let id = submit(&executor, &order).await?;
            if let Some(at) = order.cancel_ms {
                tokio::spawn(cancel(executor.clone(), id, epoch + at));
            }
            let label = format!("{} ({})", order.name, order.kind);
            submitted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((id, label));
            wait_one(executor, id, order.name).await
        });
    }
    let mut counts = [0; 4];
    while let Some(ended) = orders_ended.join_next().await {
        counts[ended??] += 1;
    }
    // A child that outlives its order is a bug the checker must see: wait for it.
    while executor
        .list()
        .iter()
        .any(|info| ended_as(&info.status).is_none())
    {
        sleep_ms(50).await;
    }
    Ok(counts)
}

/// Aborts order `id` at `at` (ms since the Unix epoch): at once in a run that starts
/// later, since an abort is not persisted and the customer asks again after a restart.
async fn cancel(executor: Executor<Shop>, id: ProcedureId, at: u64) {
    sleep_ms(at.saturating_sub(now_ms())).await;
    if let Err(error) = executor.abort(id) {
        eprintln!("order_worker: cannot cancel {id}: {error}");
        std::process::exit(1);
    }
}

/// Submits `order` with its nonce and timeout.
async fn submit(executor: &Executor<Shop>, order: &Order) -> Result<ProcedureId, String> {
    let mut options = SubmitOptions::default().nonce(format!("order-{}", order.name));
    if let Some(ms) = order.timeout_ms {
        options = options.timeout(Duration::from_millis(ms));
    }
    let mut data = order.clone();
    if data.kind == "step-lock" && executor.env().break_locks {
        data.declare_lock = false;
    }
    executor
        .submit_with(data, options)
        .await
        .map_err(|e| format!("submit {}: {e}", order.name))
}

/// How a procedure with `status` ended, if it did, and its slot in the counts: succeeded,
/// rolled back, failed, or stuck past its point of no return. `Stuck` is matched by
/// name: the status the executor is getting (guarantee (e)) is not in this build yet.
fn ended_as(status: &Status) -> Option<(usize, &'static str)> {
    match status {
        Status::Succeeded => Some((0, "succeeded")),
        Status::RolledBack => Some((1, "rolled_back")),
        Status::Failed => Some((2, "failed")),
        other if format!("{other:?}").starts_with("Stuck") => Some((3, "stuck")),
        _ => None,
    }
}

/// Waits for one order and records `end <order> <outcome>`; returns the outcome's slot in
/// the counts.
async fn wait_one(
    executor: Executor<Shop>,
    id: ProcedureId,
    name: String,
) -> Result<usize, String> {
    let mut info = executor
        .subscribe(id)
        .ok_or(format!("{name}: unknown id {id}"))?;
    // `wait` returns when it finished (or the executor stopped); a stuck order does not
    // finish, so its status is watched too.
    let stuck = info.wait_for(|i| ended_as(&i.status).is_some_and(|(slot, _)| slot == 3));
    tokio::select! {
        waited = executor.wait(id) => drop(waited.map_err(|e| format!("{name}: {e}"))?),
        seen = stuck => drop(seen.map_err(|e| format!("{name}: {e}"))?),
    }
    let status = executor.state(id).map_or(Status::Runnable, |i| i.status);
    let (slot, outcome) = ended_as(&status).ok_or(format!("{name}: ended as {status:?}"))?;
    let line = format!("end {name} {outcome}");
    executor
        .env()
        .effect(&name, &line)
        .map_err(|e| format!("{name}: {e}"))?;
    Ok(slot)
}

/// Prints every procedure still live, for the test's report.
fn report_live(executor: &Executor<Shop>, submitted: &Submitted) {
    let ids = submitted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let name = |id: Option<ProcedureId>| {
        id.and_then(|id| ids.iter().find(|(i, _)| *i == id))
            .map_or_else(|| "-".to_owned(), |(_, label)| label.clone())
    };
    for info in executor.list() {
        if !info.status.is_finished() {
            eprintln!(
                "live: {} {} {} in {:?} at {}, parent {}",
                info.id,
                info.machine,
                name(Some(info.id)),
                info.status,
                info.state,
                name(info.parent)
            );
        }
    }
}

/// Signals each event when it is due: creates its signal file, then wakes it once. An
/// event is due `delay_ms` after the epoch, or after its request file was written for
/// the ones that answer a request. Events already signalled by an earlier run are woken
/// once, now (the process cannot know which wake-ups its killed predecessor delivered).
async fn drive_signals(executor: Executor<Shop>, mut pending: Vec<Signal>, epoch: u64) {
    let dir = executor.env().signals.clone();
    loop {
        let mut due = Vec::new();
        pending.retain(|signal| {
            let is_due = due_at(&dir, signal, epoch).is_some_and(|at| at <= now_ms());
            if is_due {
                due.push(signal.event.clone());
            }
            !is_due
        });
        for event in due {
            if let Err(error) = write_once(&dir.join(&event), "") {
                eprintln!("order_worker: cannot signal {event}: {error}");
                std::process::exit(1);
            }
            if let Err(error) = wake(&executor, &event).await {
                eprintln!("order_worker: cannot wake {event}: {error}");
                std::process::exit(1);
            }
        }
        if pending.is_empty() {
            return;
        }
        sleep_ms(5).await;
    }
}

/// When `signal` is due (ms since the Unix epoch); `None` while it waits for a request.
fn due_at(dir: &Path, signal: &Signal, epoch: u64) -> Option<u64> {
    if dir.join(&signal.event).exists() {
        return Some(0); // Signalled before a restart: wake it again.
    }
    if !signal.after_request {
        return Some(epoch + signal.delay_ms);
    }
    let asked = std::fs::metadata(dir.join(format!("{}.request", signal.event)))
        .and_then(|m| m.modified())
        .ok()?;
    let asked = asked.duration_since(UNIX_EPOCH).ok()?.as_millis();
    Some(u64::try_from(asked).unwrap_or(u64::MAX) + signal.delay_ms)
}

/// The one call of `Executor::wake`. When it becomes `async` and fallible (durable
/// wake-ups), this is the only line to change:
/// `executor.wake(event).await.map_err(|e| e.to_string())`.
async fn wake(executor: &Executor<Shop>, event: &str) -> Result<usize, String> {
    executor.wake(event).await.map_err(|e| e.to_string())
}
