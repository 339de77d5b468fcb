//! The tables and the one function a [`PgStore`](super::PgStore) keeps in its PostgreSQL
//! schema, created on first use and versioned (`docs/FORMAT.md` describes them).
//!
//! Every write of the store is one call of `apply`, a PL/pgSQL function: one statement,
//! so one transaction and one round trip, whatever the number of batches a group commit
//! carries. Its checks raise errors of their own SQLSTATE class (`PF`), which the
//! committer reads back as the store's refusals.

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::error::StoreError;

/// The version of the layout below, kept in `{schema}.schema_version`. A store refuses a
/// schema of a later version: a newer procflow wrote it.
pub(crate) const VERSION: i32 = 1;

/// SQLSTATE of `apply`'s refusal of a stale fencing token; the error's detail is the
/// current term.
pub(crate) const FENCED: &str = "PF001";
/// SQLSTATE of `apply`'s refusal of a `Finish` of a record that does not exist; the detail
/// is its id.
pub(crate) const UNKNOWN_PROCEDURE: &str = "PF002";
/// SQLSTATE of `apply`'s refusal of a `CreateMeta` of a key that exists; the detail is
/// the key.
pub(crate) const META_EXISTS: &str = "PF003";

/// Checks that `name` can name a schema without quoting: ASCII letters, digits and `_`,
/// not starting with a digit, at most 63 bytes (PostgreSQL's identifier length).
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let valid_start = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let valid_rest = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid_start && valid_rest && name.len() <= 63 {
        Ok(())
    } else {
        Err(format!(
            "`{name}` cannot name a PostgreSQL schema: use 1 to 63 lowercase ASCII letters, \
             digits and `_`, not starting with a digit (e.g. `myapp_procedures`)"
        ))
    }
}

/// `template` with every `{s}` replaced by the schema's name (checked by [`check_name`]:
/// nothing in it needs quoting).
pub(crate) fn sql(template: &str, schema: &str) -> String {
    template.replace("{s}", schema)
}

/// Creates what is missing, under a transaction-scoped advisory lock so that processes
/// starting together do not race on `CREATE`; refuses a schema of a later version.
pub(crate) async fn ensure(client: &mut Client, schema: &str) -> Result<(), String> {
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('procflow schema ' || $1))",
        &[&schema],
    )
    .await
    .map_err(|e| e.to_string())?;
    tx.batch_execute(&sql(TABLES, schema))
        .await
        .map_err(|e| e.to_string())?;
    let found: Option<i32> = tx
        .query_opt(&sql("SELECT version FROM {s}.schema_version", schema), &[])
        .await
        .map_err(|e| e.to_string())?
        .map(|row| row.get(0));
    match found {
        Some(version) if version > VERSION => return Err(newer(schema, version)),
        Some(_) => {}
        None => {
            tx.execute(
                &sql(
                    "INSERT INTO {s}.schema_version (version) VALUES ($1)",
                    schema,
                ),
                &[&VERSION],
            )
            .await
            .map_err(|e| e.to_string())?;
        }
    }
    tx.batch_execute(&sql(APPLY, schema))
        .await
        .map_err(|e| e.to_string())?;
    tx.commit().await.map_err(|e| e.to_string())
}

/// Checks, creating nothing, that `schema` holds a procflow store this build can read.
pub(crate) async fn check(client: &Client, schema: &str) -> Result<(), String> {
    let found = client
        .query_opt(&sql("SELECT version FROM {s}.schema_version", schema), &[])
        .await;
    let missing = [&SqlState::UNDEFINED_TABLE, &SqlState::INVALID_SCHEMA_NAME];
    match found {
        Ok(Some(row)) => match row.get::<_, i32>(0) {
            version if version > VERSION => Err(newer(schema, version)),
            _ => Ok(()),
        },
        Ok(None) => Err(format!(
            "schema `{schema}` holds no procflow store yet (its version row is missing): \
             nothing to read"
        )),
        Err(error) if error.code().is_some_and(|code| missing.contains(&code)) => Err(format!(
            "schema `{schema}` holds no procflow store: check the schema's name (the one \
             the executors' PgConfig names); PgStore::connect creates a store, reading does not"
        )),
        Err(error) => Err(error.to_string()),
    }
}

fn newer(schema: &str, version: i32) -> String {
    format!(
        "schema `{schema}` is at version {version}, written by a newer procflow; \
         this build knows versions up to {VERSION}"
    )
}

/// The error a failure of `ensure` or `check` becomes, `context` saying which.
pub(crate) fn error(
    context: &'static str,
    location: &std::path::Path,
    reason: String,
) -> StoreError {
    StoreError::io(
        context,
        location,
        std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
    )
}

/// The tables. `meta.key` sorts by bytes (`COLLATE "C"`), as the other stores' keys do,
/// so that pages and prefixes follow one order whatever the database's locale.
const TABLES: &str = r#"
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.schema_version (
    version integer NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.records (
    id bigint PRIMARY KEY,
    parent bigint,
    finished boolean NOT NULL,
    value bytea NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.meta (
    key text COLLATE "C" PRIMARY KEY,
    value bytea NOT NULL
);
CREATE TABLE IF NOT EXISTS {s}.leader (
    id integer PRIMARY KEY CHECK (id = 1),
    term bigint NOT NULL UNIQUE,
    holder text,
    expires_at timestamptz NOT NULL
);
INSERT INTO {s}.leader (id, term, holder, expires_at)
    VALUES (1, 0, NULL, '-infinity') ON CONFLICT (id) DO NOTHING;
"#;

/// The function every commit calls. The fencing check locks the leader row `FOR KEY
/// SHARE`: a takeover changes `term`, a column with a unique index, so its update needs
/// the row's `FOR UPDATE` lock and waits for every transaction holding the share lock; a
/// transaction that starts after the takeover committed waits for it, then reads the new
/// term (READ COMMITTED re-reads a row it had to wait for) and raises `PF001`. A lease
/// renewal only changes `expires_at`, and does not wait.
const APPLY: &str = r#"
CREATE OR REPLACE FUNCTION {s}.apply(
    fence bigint,
    must_exist bigint[],
    create_keys text[],
    put_ids bigint[], put_parents bigint[], put_finished boolean[], put_values bytea[],
    finish_ids bigint[], finish_values bytea[],
    delete_ids bigint[],
    meta_keys text[], meta_values bytea[],
    meta_deletes text[]
) RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    owner bigint;
    found integer;
    missing bigint;
    created text[];
    taken text;
BEGIN
    IF fence IS NOT NULL THEN
        SELECT term INTO owner FROM {s}.leader WHERE id = 1 FOR KEY SHARE;
        IF owner IS DISTINCT FROM fence THEN
            RAISE EXCEPTION 'procflow: fenced'
                USING ERRCODE = 'PF001', DETAIL = coalesce(owner, 0)::text;
        END IF;
    END IF;
    IF cardinality(must_exist) > 0 THEN
        -- Locked until the commit: no one deletes them in between.
        SELECT count(*) INTO found
            FROM (SELECT 1 FROM {s}.records WHERE id = ANY(must_exist) FOR UPDATE) AS locked;
        IF found < cardinality(must_exist) THEN
            SELECT m.id INTO missing FROM unnest(must_exist) AS m(id)
                WHERE NOT EXISTS (SELECT 1 FROM {s}.records r WHERE r.id = m.id)
                ORDER BY m.id LIMIT 1;
            RAISE EXCEPTION 'procflow: unknown procedure'
                USING ERRCODE = 'PF002', DETAIL = missing::text;
        END IF;
    END IF;
    IF cardinality(create_keys) > 0 THEN
        -- A key another transaction is creating makes this insert wait for its outcome.
        WITH made AS (
            INSERT INTO {s}.meta (key, value)
                SELECT k, ''::bytea FROM unnest(create_keys) AS k
                ON CONFLICT (key) DO NOTHING RETURNING key)
        SELECT array_agg(key) INTO created FROM made;
        IF coalesce(cardinality(created), 0) < cardinality(create_keys) THEN
            SELECT k INTO taken FROM unnest(create_keys) AS k
                WHERE created IS NULL OR NOT (k = ANY(created)) LIMIT 1;
            RAISE EXCEPTION 'procflow: metadata key exists'
                USING ERRCODE = 'PF003', DETAIL = taken;
        END IF;
    END IF;
    -- Each write only if it has rows: an empty statement still costs its execution, a
    -- third of a one-step commit's time on the server.
    IF cardinality(finish_ids) > 0 THEN
        UPDATE {s}.records AS r SET finished = true, value = f.value
            FROM unnest(finish_ids, finish_values) AS f(id, value) WHERE r.id = f.id;
    END IF;
    IF cardinality(delete_ids) > 0 THEN
        DELETE FROM {s}.records WHERE id = ANY(delete_ids);
    END IF;
    IF cardinality(put_ids) > 0 THEN
        INSERT INTO {s}.records (id, parent, finished, value)
            SELECT * FROM unnest(put_ids, put_parents, put_finished, put_values)
            ON CONFLICT (id) DO UPDATE
                SET parent = excluded.parent, finished = excluded.finished, value = excluded.value;
    END IF;
    IF cardinality(meta_deletes) > 0 THEN
        DELETE FROM {s}.meta WHERE key = ANY(meta_deletes);
    END IF;
    IF cardinality(meta_keys) > 0 THEN
        INSERT INTO {s}.meta (key, value)
            SELECT * FROM unnest(meta_keys, meta_values)
            ON CONFLICT (key) DO UPDATE SET value = excluded.value;
    END IF;
END
$fn$;
"#;

/// The statements the committer prepares, with the schema's name in them.
pub(crate) struct Statements {
    /// One call of `apply`.
    pub(crate) apply: String,
    /// A commit that puts one record and does nothing else (a procedure's step, the most
    /// common commit): `apply`'s fence in the same statement, no function call. `$1` is
    /// the fence (NULL: none), `$2`..`$5` the row. It writes nothing if the fence fails.
    pub(crate) put_one: String,
    /// The leader row's term, for the error of a `put_one` that wrote nothing.
    pub(crate) term: String,
}

impl Statements {
    pub(crate) fn new(schema: &str) -> Self {
        Self {
            apply: sql(
                "SELECT {s}.apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                schema,
            ),
            put_one: sql(PUT_ONE, schema),
            term: sql("SELECT term FROM {s}.leader WHERE id = 1", schema),
        }
    }
}

/// See [`Statements::put_one`]. The fence reads the row as `apply` does, `FOR KEY SHARE`.
const PUT_ONE: &str = "WITH fence AS (
    SELECT term FROM {s}.leader WHERE id = 1 AND ($1::bigint IS NULL OR term = $1) FOR KEY SHARE)
INSERT INTO {s}.records (id, parent, finished, value)
    SELECT $2, $3, $4, $5 FROM fence
    ON CONFLICT (id) DO UPDATE
        SET parent = excluded.parent, finished = excluded.finished, value = excluded.value";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_need_no_quoting() {
        for good in ["procflow", "my_app_2", "_x"] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in ["", "2fast", "My", "a-b", "a;DROP", "a b", &"x".repeat(64)] {
            let error = check_name(bad).unwrap_err();
            assert!(error.contains("lowercase ASCII letters"), "{bad}: {error}");
        }
    }
}
