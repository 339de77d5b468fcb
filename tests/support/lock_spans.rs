//! The lock span check of the real-process tests (`tests/kill9_orders.rs`,
//! `tests/deploy.rs`): workers append `<key> <owner> <span>` to a file per key when a step
//! holding the key starts and when it ends; no other owner may write inside a span.

use std::collections::{BTreeMap, BTreeSet};

/// The check on one key's lines (`<key> <owner> <span>`): no other owner inside any span.
/// A span is every line of one owner and span name, first to last; an item not in
/// `revived` holds its key for life through `fwd` and `undo` alike (one span).
pub fn check_locks(text: &str, revived: &BTreeSet<String>) -> Vec<String> {
    let lines: Vec<(&str, &str, String)> = text
        .lines()
        .filter_map(|line| {
            let mut words = line.split(' ');
            let (key, owner, span) = (words.next()?, words.next()?, words.next()?);
            let span = match span {
                "fwd" | "undo" if !revived.contains(owner) => "life".to_owned(),
                other => other.to_owned(),
            };
            Some((key, owner, span))
        })
        .collect();
    let mut spans: BTreeMap<(&str, &str), (usize, usize)> = BTreeMap::new();
    for (i, (_, owner, span)) in lines.iter().enumerate() {
        spans
            .entry((owner, span.as_str()))
            .and_modify(|(_, last)| *last = i)
            .or_insert((i, i));
    }
    let mut problems = Vec::new();
    for ((holder, span), (first, last)) in spans {
        let intruders: BTreeSet<&str> = lines[first..=last]
            .iter()
            .map(|(_, owner, _)| *owner)
            .filter(|owner| *owner != holder)
            .collect();
        for intruder in intruders {
            let key = lines[first].0;
            problems.push(format!(
                "[6 lock span] {key}: {intruder} wrote inside {holder}'s `{span}` lock span (lines {}..={})",
                first + 1,
                last + 1
            ));
        }
    }
    problems
}
