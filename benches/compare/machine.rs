//! The machine every workload runs: ten steps in a row over 64 bytes of state, and the
//! loop a user would write to drive the same handlers without procflow.

use procflow::prelude::*;
use serde::{Deserialize, Serialize};

/// Steps one procedure takes from `One` to `Done`.
pub const STEPS: u64 = 10;

/// Bytes of user state each procedure carries.
pub const STATE_BYTES: usize = 64;

#[derive(StateMachine, Clone, Copy, Debug, PartialEq, Eq)]
#[state_machine(procedure = Payload, name = "bench_ten_steps")]
pub enum TenSteps {
    #[initial]
    #[transition(to = [Two])]
    One,
    #[transition(to = [Three])]
    Two,
    #[transition(to = [Four])]
    Three,
    #[transition(to = [Five])]
    Four,
    #[transition(to = [Six])]
    Five,
    #[transition(to = [Seven])]
    Six,
    #[transition(to = [Eight])]
    Seven,
    #[transition(to = [Nine])]
    Eight,
    #[transition(to = [Ten])]
    Nine,
    #[transition(to = [Done])]
    Ten,
    #[terminal]
    Done,
}

/// The procedure's data: 64 bytes the steps change.
#[derive(Serialize, Deserialize)]
pub struct Payload {
    pub data: Vec<u8>,
    /// `--touch LINES`: cache lines of memory of its own that every step reads and
    /// writes, one after the other as a chain (each line holds the next one's index), so
    /// that neither the prefetcher nor overlapping loads hide a line that is cold. Not
    /// stored. Empty without the flag.
    #[serde(skip)]
    touched: Vec<u64>,
}

/// Words in a cache line.
const LINE_WORDS: usize = 8;

impl Payload {
    pub fn new(seed: u64) -> Self {
        Self {
            data: seed.to_le_bytes().repeat(STATE_BYTES / 8),
            touched: chain(touch_lines()),
        }
    }

    /// What every step does: a little work on the state, nothing that waits.
    fn work(&mut self, step: usize) {
        let byte = &mut self.data[step % STATE_BYTES];
        *byte = byte.wrapping_mul(31).wrapping_add(step as u8);
        let mut at = 0;
        for _ in 0..self.touched.len() / LINE_WORDS {
            let line = &mut self.touched[at * LINE_WORDS..][..LINE_WORDS];
            line[1] = line[1].wrapping_add(step as u64);
            at = line[0] as usize;
        }
    }
}

/// `--touch LINES`, read once.
fn touch_lines() -> usize {
    static LINES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LINES.get_or_init(|| crate::flag_value("--touch", "--touch LINES").unwrap_or(0))
}

/// `lines` cache lines whose first words link them in one cycle, five or more lines apart
/// (a stride prime to `lines`), so that the walk visits each line once and never goes
/// to the next line in memory.
fn chain(lines: usize) -> Vec<u64> {
    if lines == 0 {
        return Vec::new();
    }
    let prime_to_lines = |stride: &usize| {
        (2..=*stride).all(|d| !(stride.is_multiple_of(d) && lines.is_multiple_of(d)))
    };
    let stride = (5..)
        .find(prime_to_lines)
        .expect("some stride is prime to any count");
    let mut words = vec![0; lines * LINE_WORDS];
    for line in 0..lines {
        words[line * LINE_WORDS] = ((line + stride) % lines) as u64;
    }
    words
}

/// One handler per state: `$method` moves `$state` to `$next`.
macro_rules! handlers {
    ($($method:ident: $state:ident => $next:ident, $step:literal;)*) => {
        impl TenStepsHandlers for Payload {
            $(
                async fn $method(&mut self, _: &Context<()>) -> Step<ten_steps::$state> {
                    self.work($step);
                    Ok(ten_steps::$state::$next.into())
                }
            )*
        }
    };
}

handlers! {
    one: One => Two, 1;
    two: Two => Three, 2;
    three: Three => Four, 3;
    four: Four => Five, 4;
    five: Five => Six, 5;
    six: Six => Seven, 6;
    seven: Seven => Eight, 7;
    eight: Eight => Nine, 8;
    nine: Nine => Ten, 9;
    ten: Ten => Done, 10;
}

/// The bytes a hand-written loop persists after a step: the state's index, then the data.
pub fn encode(state: TenSteps, payload: &Payload) -> Vec<u8> {
    let mut value = Vec::with_capacity(1 + payload.data.len());
    value.push(u8::try_from(state.index()).expect("fewer than 256 states"));
    value.extend_from_slice(&payload.data);
    value
}

/// Drives one procedure through the machine's handlers the way a user without procflow
/// would: call the current state's handler, move to the state it returns, until a
/// terminal state. `after_step` runs after every step with the new state (to persist it,
/// or to yield). Returns the steps taken.
pub async fn drive<F, Fut>(payload: &mut Payload, ctx: &Context<()>, mut after_step: F) -> u64
where
    F: FnMut(TenSteps, &Payload) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut state = TenSteps::INITIAL;
    let mut steps = 0;
    while !state.is_terminal() {
        match state.execute_from_state(payload, ctx).await {
            Ok(Flow::Next(next)) => state = next,
            Ok(_) => unreachable!("the bench machine's handlers only move on"),
            Err(error) => panic!("step {state:?} failed: {error}"),
        }
        steps += 1;
        after_step(state, payload).await;
    }
    steps
}
