//! Rules a machine must follow to be runnable, one `check_*` function each. All run on
//! every derive; each records its errors on the smallest offending token.

use crate::ast::{Machine, State};
use crate::ctxt::Ctxt;
use crate::names;
use std::collections::{BTreeSet, VecDeque};
use syn::Ident;

pub fn check(cx: &Ctxt, machine: &Machine<'_>) {
    check_procedure_given(cx, machine);
    check_data_versions(cx, machine);
    check_shown_data(cx, machine);
    check_aliases(cx, machine);
    // A misspelt `#[intial]` or `#[transtion(..)]` is reported by rustc, with a hint
    // naming ours; the rules about initial, terminal and transitions would only repeat it
    // wrongly ("no initial state").
    if machine.states.iter().any(|s| s.attrs.misspelt) {
        cx.reported_by_rustc();
        // A second `#[initial]` is a mistake whatever the misspelling.
        check_at_most_one_initial(cx, machine);
        check_targets_exist(cx, machine);
        check_targets_unique(cx, machine);
        check_rollback_flags_agree(cx, machine);
        return;
    }
    check_some_initial(cx, machine);
    check_at_most_one_initial(cx, machine);
    check_some_terminal(cx, machine);
    check_initial_is_not_terminal(cx, machine);
    check_terminal_attributes(cx, machine);
    check_steps_have_transitions(cx, machine);
    check_targets_exist(cx, machine);
    check_targets_unique(cx, machine);
    check_rollback_flags_agree(cx, machine);
    check_handler_names_unique(cx, machine);
    // The graph checks would repeat earlier mistakes as noise (a misspelt target makes its
    // state look unreachable), so they run only on an otherwise sound graph.
    if graph_is_sound(machine) {
        let reachable = check_all_reachable(cx, machine);
        check_all_can_terminate(cx, machine, &reachable);
    }
}

// `redact` picks fields out of data that is shown: with `show_data = false` it would do
// nothing, and the reader would wonder which of the two wins.
fn check_shown_data(cx: &Ctxt, machine: &Machine<'_>) {
    let attrs = &machine.attrs;
    if let (Some((_, false)), Some((redact, _))) = (&attrs.show_data, &attrs.redact) {
        cx.error_at(
            redact,
            "`redact` has no effect with `show_data = false`, which hides all of the data: \
             remove one of the two",
        );
    }
    let fields = attrs.redact.as_ref().map_or(&[][..], |(_, f)| f.as_slice());
    for (i, field) in fields.iter().enumerate() {
        if fields[..i]
            .iter()
            .any(|earlier| earlier.value() == field.value())
        {
            cx.error_at(
                field,
                format_args!("`{}` is redacted twice: give it once", field.value()),
            );
        }
    }
}

// `#[state_machine(procedure = ..)]` names the struct that implements the handlers.
fn check_procedure_given(cx: &Ctxt, machine: &Machine<'_>) {
    if machine.attrs.procedure_key.is_some() {
        return;
    }
    let message = "missing the procedure type: add `#[state_machine(procedure = MyProcedure)]`, \
                   naming the struct that holds the procedure's data and implements its handlers";
    match &machine.attrs.attr {
        Some(attr) => cx.error_at(attr, message),
        None => cx.error_at(machine.ident, message),
    }
}

// Every data version this build reads besides its own has a migration: from `oldest`
// (default 1) up to `version - 1`, none outside that range and none twice, so a record
// of any version this build accepts can be read, and one it cannot is caught at start.
fn check_data_versions(cx: &Ctxt, machine: &Machine<'_>) {
    let attrs = &machine.attrs;
    let version = attrs.version.as_ref().map_or(1, |(_, _, n)| *n);
    let oldest = attrs.oldest.as_ref().map_or(1, |(_, _, n)| *n);
    if let Some((_, lit, n)) = &attrs.oldest {
        if *n > version {
            cx.error_at(
                lit,
                format_args!(
                    "`oldest = {n}` is newer than this build's own data version ({version}): \
                     write `oldest = {version}` at most"
                ),
            );
            return;
        }
    }
    let migrations = attrs
        .migrate
        .as_ref()
        .map_or(&[][..], |(_, m)| m.as_slice());
    let mut covered = BTreeSet::new();
    for migration in migrations {
        let n = migration.number;
        if n >= version {
            let fix = if attrs.version.is_none() {
                format!(
                    "this machine's data version is 1 (no `version = ..`): write `version = {}`",
                    n + 1
                )
            } else {
                format!(
                    "migrations are from the versions before it, {oldest} to {}",
                    version - 1
                )
            };
            cx.error_at(
                &migration.version,
                format_args!(
                    "version {n} is not older than this build's data version {version}; {fix}"
                ),
            );
        } else if n < oldest {
            cx.error_at(
                &migration.version,
                format_args!(
                    "version {n} is older than `oldest = {oldest}`: remove this migration, or \
                     lower `oldest`"
                ),
            );
        } else if !covered.insert(n) {
            cx.error_at(
                &migration.version,
                format_args!("version {n} has a migration already: give each version one type"),
            );
        }
    }
    let missing: Vec<u32> = (oldest..version).filter(|n| !covered.contains(n)).collect();
    if let (Some((key, _, _)), Some(last)) = (&attrs.version, missing.last()) {
        let listed: Vec<String> = missing.iter().map(ToString::to_string).collect();
        let wanted: Vec<String> = missing
            .iter()
            .map(|n| format!("{n} = OldTypeV{n}"))
            .collect();
        let add = if attrs.migrate.is_some() {
            format!("add `{}` to `migrate(..)`", wanted.join(", "))
        } else {
            format!("add `migrate({})`", wanted.join(", "))
        };
        cx.error_at(
            key,
            format_args!(
                "records of data version {} need a migration: {add}, each a type that reads \
                 what that version stored (`Deserialize`) and converts into the procedure \
                 type (`From`); or write `oldest = {}` to stop reading older records",
                listed.join(", "),
                last + 1
            ),
        );
    }
}

// An alias is a state's former name: it is no state's name now and no other alias, so a
// stored name means one state.
fn check_aliases(cx: &Ctxt, machine: &Machine<'_>) {
    let mut seen: Vec<(String, &Ident)> = Vec::new();
    for state in &machine.states {
        for alias in &state.attrs.aliases {
            let name = alias.value();
            if let Some(named) = machine
                .states
                .iter()
                .find(|s| names::state_name(s.ident) == name)
            {
                let whose = if named.ident == state.ident {
                    "its own name: remove the alias".to_owned()
                } else {
                    format!(
                        "the name of state `{}`: an alias is a former name no state has now",
                        named.ident
                    )
                };
                cx.error_at(alias, format_args!("`{name}` is {whose}"));
            } else if let Some((_, other)) = seen.iter().find(|(seen, _)| *seen == name) {
                cx.error_at(
                    alias,
                    format_args!(
                        "`{name}` is an alias of `{other}` already: a stored name must mean one state"
                    ),
                );
            } else {
                seen.push((name, state.ident));
            }
        }
    }
}

// Some state is `#[initial]`: every procedure starts there.
fn check_some_initial(cx: &Ctxt, machine: &Machine<'_>) {
    let none = !machine.states.iter().any(|s| s.attrs.initial.is_some());
    if none && !machine.states.is_empty() {
        cx.error_at(
            machine.ident,
            "no initial state: mark the state every procedure starts in with `#[initial]`",
        );
    }
}

// No more than one state is `#[initial]`.
fn check_at_most_one_initial(cx: &Ctxt, machine: &Machine<'_>) {
    let mut initials = machine
        .states
        .iter()
        .filter_map(|s| s.attrs.initial.as_ref().map(|attr| (s, attr)));
    let Some((first, _)) = initials.next() else {
        return;
    };
    for (_, attr) in initials {
        cx.error_at(
            attr,
            format_args!(
                "`{}` is already `#[initial]`; a machine has exactly one initial state",
                first.ident
            ),
        );
    }
}

// At least one state is `#[terminal]`: reaching it ends the procedure.
fn check_some_terminal(cx: &Ctxt, machine: &Machine<'_>) {
    if !machine.states.is_empty() && !machine.states.iter().any(State::is_terminal) {
        cx.error_at(
            machine.ident,
            "no terminal state: mark the state(s) that end a procedure successfully with \
             `#[terminal]`",
        );
    }
}

// A procedure takes at least one step: its initial state cannot be terminal.
fn check_initial_is_not_terminal(cx: &Ctxt, machine: &Machine<'_>) {
    for state in &machine.states {
        if let (Some(_), Some(terminal)) = (&state.attrs.initial, &state.attrs.terminal) {
            cx.error_at(
                terminal,
                "the initial state cannot be terminal: a procedure must take at least one step; \
                 add a separate `#[terminal]` state",
            );
        }
    }
}

// A terminal state has no handler, so it takes no transitions, rollback or loop bound.
fn check_terminal_attributes(cx: &Ctxt, machine: &Machine<'_>) {
    for state in machine.states.iter().filter(|s| s.is_terminal()) {
        let attrs = &state.attrs;
        if let Some(transition) = &attrs.transition {
            cx.error_at(
                &transition.attr,
                "a `#[terminal]` state ends the procedure: remove `#[transition(..)]`, or remove \
                 `#[terminal]` if the procedure goes on from here",
            );
        }
        if let Some(rollback) = &attrs.rollback {
            cx.error_at(
                rollback,
                "a `#[terminal]` state runs no step, so there is nothing to undo: remove \
                 `#[rollback]`",
            );
        }
        if let Some(no_rollback) = &attrs.no_rollback {
            cx.error_at(
                no_rollback,
                "a `#[terminal]` state ends the procedure, so it cannot be a point of no return: \
                 put `#[no_rollback]` on the state that commits",
            );
        }
        if let Some((attr, _)) = &attrs.max_repeats {
            cx.error_at(
                attr,
                "a `#[terminal]` state is entered once and ends the procedure: remove \
                 `#[max_repeats]`",
            );
        }
    }
}

// Every state that runs a step says where it may go next.
fn check_steps_have_transitions(cx: &Ctxt, machine: &Machine<'_>) {
    for state in machine.steps() {
        if state.attrs.transition.is_none() {
            cx.error_at(
                state.ident,
                format_args!(
                    "`{}` has no transitions: add `#[transition(to = [..])]` with the states it \
                     may move to, or mark it `#[terminal]`",
                    state.ident
                ),
            );
        }
    }
}

// Every target names a variant of the enum.
fn check_targets_exist(cx: &Ctxt, machine: &Machine<'_>) {
    let names: Vec<String> = machine.states.iter().map(|s| s.ident.to_string()).collect();
    for target in machine.states.iter().flat_map(State::targets) {
        if machine.state(target).is_some() {
            continue;
        }
        let hint = match names::did_you_mean(&target.to_string(), names.iter().map(String::as_str))
        {
            Some(close) => format!("did you mean `{close}`?"),
            None => format!("the states are: {}", names.join(", ")),
        };
        cx.error_at(
            target,
            format_args!("`{target}` is not a state of `{}`; {hint}", machine.ident),
        );
    }
}

// A transition lists each target once.
fn check_targets_unique(cx: &Ctxt, machine: &Machine<'_>) {
    for state in &machine.states {
        let mut seen = BTreeSet::new();
        for target in state.targets() {
            if !seen.insert(target.to_string()) {
                cx.error_at(
                    target,
                    format_args!("`{target}` is listed twice in this transition: remove one"),
                );
            }
        }
    }
}

// A state is either undoable (`#[rollback]`) or a point of no return, not both.
fn check_rollback_flags_agree(cx: &Ctxt, machine: &Machine<'_>) {
    for state in &machine.states {
        if let (Some(_), Some(no_rollback)) = (&state.attrs.rollback, &state.attrs.no_rollback) {
            cx.error_at(
                no_rollback,
                "`#[rollback]` and `#[no_rollback]` contradict each other: keep `#[rollback]` if \
                 the step can be undone, `#[no_rollback]` if reaching it commits the procedure",
            );
        }
    }
}

/// Methods the handler trait has besides the generated handlers, with what they do.
const RESERVED_METHODS: [(&str, &str); 2] = [
    ("locks", "declare locks"),
    ("describe", "describe a procedure to operators"),
];

// Generated handler names do not collide (`RollbackFoo` vs the rollback of `Foo`), nor
// with the trait's own methods (`Locks` vs `locks`, `Describe` vs `describe`).
fn check_handler_names_unique(cx: &Ctxt, machine: &Machine<'_>) {
    for state in machine.steps() {
        let method = names::execute_method(state.ident).to_string();
        if let Some((_, purpose)) = RESERVED_METHODS.iter().find(|(m, _)| *m == method) {
            cx.error_at(
                state.ident,
                format_args!(
                    "the handler of `{}` would be `{method}`, which the handler trait uses to \
                     {purpose}: rename the state",
                    state.ident
                ),
            );
        }
    }
    let mut seen: Vec<(String, &Ident)> = Vec::new();
    for state in machine.steps() {
        let mut methods = vec![names::execute_method(state.ident)];
        if state.attrs.rollback.is_some() {
            methods.push(names::rollback_method(state.ident));
        }
        for method in methods {
            let method = method.to_string();
            if let Some((_, owner)) = seen.iter().find(|(name, _)| *name == method) {
                cx.error_at(
                    state.ident,
                    format_args!(
                        "the handler `{method}` of `{}` has the same name as a handler of \
                         `{owner}`: rename one of the two states",
                        state.ident
                    ),
                );
            } else {
                seen.push((method, state.ident));
            }
        }
    }
}

fn graph_is_sound(machine: &Machine<'_>) -> bool {
    let one_initial = machine
        .states
        .iter()
        .filter(|s| s.attrs.initial.is_some())
        .count()
        == 1;
    let targets_complete = machine.states.iter().all(|s| {
        s.attrs.transition.as_ref().is_none_or(|t| t.complete)
            && s.targets().iter().all(|t| machine.state(t).is_some())
    });
    let steps_have_transitions = machine.steps().all(|s| s.attrs.transition.is_some());
    one_initial
        && targets_complete
        && steps_have_transitions
        && machine.states.iter().any(State::is_terminal)
}

// Every state can be reached from the initial state. Returns the reachable ones.
fn check_all_reachable(cx: &Ctxt, machine: &Machine<'_>) -> BTreeSet<usize> {
    let initial = machine
        .states
        .iter()
        .position(|s| s.attrs.initial.is_some());
    let reached = closure(machine, initial.into_iter().collect(), |from, to| {
        (from, to)
    });
    let initial_name = initial.map(|i| machine.states[i].ident);
    for (i, state) in machine.states.iter().enumerate() {
        if !reached.contains(&i) {
            cx.error_at(
                state.ident,
                format_args!(
                    "`{}` cannot be reached from the initial state `{}`: list it in a \
                     `#[transition(to = [..])]`, or remove it",
                    state.ident,
                    initial_name.map(ToString::to_string).unwrap_or_default()
                ),
            );
        }
    }
    reached
}

// From every reachable state some terminal state can be reached: a loop must have an exit.
// The mistake is the loop, not each state in it nor the states leading into it, so there
// is one error per strongly connected component that no edge leaves ("bottom" cycle);
// every other stuck state only leads into one of those. (An unreachable state is already
// reported as such.)
fn check_all_can_terminate(cx: &Ctxt, machine: &Machine<'_>, reachable: &BTreeSet<usize>) {
    let terminals = (0..machine.states.len())
        .filter(|&i| machine.states[i].is_terminal())
        .collect();
    // Walk the edges backwards from the terminal states.
    let finishing = closure(machine, terminals, |from, to| (to, from));
    let mut reported = BTreeSet::new();
    for start in 0..machine.states.len() {
        if !reachable.contains(&start) || finishing.contains(&start) || reported.contains(&start) {
            continue;
        }
        let forward = closure(machine, vec![start], |from, to| (from, to));
        let backward = closure(machine, vec![start], |from, to| (to, from));
        let component: BTreeSet<usize> = forward.intersection(&backward).copied().collect();
        // A bottom component: everything reachable from it is inside it.
        if forward != component {
            continue;
        }
        reported.extend(component.iter().copied());
        let cycle = cycle_through(machine, start, &component);
        let path: Vec<String> = cycle
            .iter()
            .map(|&i| names::state_name(machine.states[i].ident))
            .collect();
        let first = &machine.states[start];
        let mut exit: Vec<Ident> = first.targets().to_vec();
        let terminal = machine.states.iter().find(|s| s.is_terminal());
        exit.extend(terminal.map(|t| t.ident.clone()));
        cx.error_at(
            first.ident,
            format_args!(
                "`{}` loops with no exit: no `#[terminal]` state can be reached from it; add an \
                 exit, e.g. `{}` on `{}`",
                path.join(" → "),
                crate::attr::corrected(&exit),
                first.ident
            ),
        );
    }
}

/// The states of a shortest cycle from `start` back to it inside `component`, `start`
/// first and last.
fn cycle_through(machine: &Machine<'_>, start: usize, component: &BTreeSet<usize>) -> Vec<usize> {
    let index = |ident: &Ident| machine.states.iter().position(|s| s.ident == ident);
    let mut parent: Vec<Option<usize>> = vec![None; machine.states.len()];
    let mut queue = VecDeque::from([start]);
    while let Some(at) = queue.pop_front() {
        for next in machine.states[at].targets().iter().filter_map(index) {
            if next == start {
                // Walk the parents back from `at` to `start` (the root, without parent).
                let mut path = vec![at];
                while let Some(p) = parent[*path.last().expect("not empty")] {
                    path.push(p);
                }
                path.reverse();
                path.push(start);
                return path;
            }
            if component.contains(&next) && next != start && parent[next].is_none() {
                parent[next] = Some(at);
                queue.push_back(next);
            }
        }
    }
    vec![start, start]
}

/// The states reachable from `start` along the edges, each edge `(from, to)` oriented by
/// `orient` (identity for forward, swapped for backward).
fn closure(
    machine: &Machine<'_>,
    start: Vec<usize>,
    orient: impl Fn(usize, usize) -> (usize, usize),
) -> BTreeSet<usize> {
    let index = |ident: &Ident| machine.states.iter().position(|s| s.ident == ident);
    let edges: Vec<(usize, usize)> = machine
        .states
        .iter()
        .enumerate()
        .flat_map(|(from, s)| {
            s.targets()
                .iter()
                .filter_map(move |t| Some((from, index(t)?)))
        })
        .map(|(from, to)| orient(from, to))
        .collect();
    let mut seen: BTreeSet<usize> = start.iter().copied().collect();
    let mut queue: VecDeque<usize> = start.into();
    while let Some(at) = queue.pop_front() {
        for &(_, to) in edges.iter().filter(|(from, _)| *from == at) {
            if seen.insert(to) {
                queue.push_back(to);
            }
        }
    }
    seen
}
