//! A procedure's data as the admin shows it: decoded with its machine's type (migrations
//! included), as JSON, with the fields its machine redacts replaced, or not at all for a
//! machine that hides its data (`#[state_machine(show_data = false)]`).

use crate::StateMachine;
use crate::codec;
use serde_json::{Value, json};

/// What replaces a redacted field.
pub(crate) const REDACTED: &str = "[redacted]";

/// What the admin shows of one procedure's data.
#[derive(Debug)]
pub(crate) enum Shown {
    /// The data, redacted as its machine says.
    Data(Value),
    /// Why there is none to show.
    Not(String),
}

impl Shown {
    /// The `data` and `data_note` keys of a record's JSON: the data or `null`, and why
    /// it is `null`.
    pub(crate) fn into_fields(self) -> (Value, Value) {
        match self {
            Self::Data(data) => (data, Value::Null),
            Self::Not(why) => (Value::Null, json!(why)),
        }
    }
}

/// Renders a stored snapshot of machine `M` (a registry entry's `shown`).
pub(crate) fn shown<M: StateMachine>(snapshot: &[u8]) -> Shown {
    if !M::SHOW_DATA {
        return Shown::Not(format!(
            "machine `{}` does not show its data (show_data = false)",
            M::NAME
        ));
    }
    let procedure = match codec::decode::<M>(snapshot) {
        Ok((procedure, _)) => procedure,
        Err(error) => return Shown::Not(format!("its data does not decode: {error}")),
    };
    match serde_json::to_value(&procedure) {
        Ok(mut data) => {
            for path in M::REDACTED {
                redact(&mut data, &path.split('.').collect::<Vec<_>>());
            }
            Shown::Data(data)
        }
        Err(error) => Shown::Not(format!("its data has no JSON form: {error}")),
    }
}

/// Replaces the field at `path` (names of nested fields) with [`REDACTED`]. Through a
/// list, every element's field is redacted; a path that leads nowhere (an enum variant
/// without that field, `None`) changes nothing.
fn redact(value: &mut Value, path: &[&str]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match value {
        Value::Object(fields) => {
            if let Some(field) = fields.get_mut(*first) {
                if rest.is_empty() {
                    *field = json!(REDACTED);
                } else {
                    redact(field, rest);
                }
            } else {
                // An externally tagged enum: `{"Variant": {..fields}}`.
                let has_field = |v: &Value| v.as_object().is_some_and(|o| o.contains_key(*first));
                for inner in fields.values_mut().filter(|v| has_field(v)) {
                    redact(inner, path);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| redact(item, path)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_redacted_by_path_through_lists_and_enum_variants() {
        let mut data = json!({
            "name": "acme",
            "password": "hunter2",
            "card": {"number": "4111", "holder": "A"},
            "keys": [{"secret": "s1", "id": 1}, {"secret": "s2", "id": 2}],
            "login": {"Password": {"secret": "s3"}},
            "none": null,
        });
        for path in [
            "password",
            "card.number",
            "keys.secret",
            "login.secret",
            "none.x",
            "absent",
        ] {
            redact(&mut data, &path.split('.').collect::<Vec<_>>());
        }
        assert_eq!(
            data,
            json!({
                "name": "acme",
                "password": REDACTED,
                "card": {"number": REDACTED, "holder": "A"},
                "keys": [{"secret": REDACTED, "id": 1}, {"secret": REDACTED, "id": 2}],
                "login": {"Password": {"secret": REDACTED}},
                "none": null,
            })
        );
    }
}
