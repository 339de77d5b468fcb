//! The store's reads: one record, the metadata under a prefix, and the paged `load` and
//! `list`, each of which reads all its pages inside one `REPEATABLE READ` transaction,
//! so that every page sees the same snapshot.

use std::collections::BTreeMap;
use std::future::Future;

use bytes::Bytes;
use deadpool_postgres::{Object, Transaction};
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, Row};

use super::{Shared, schema, timed_out};
use crate::error::StoreError;
use crate::store::{Loaded, ProcId, Record, RecordInfo};

const RECORDS_PAGE: &str = "SELECT id, parent, finished, value FROM {s}.records \
     WHERE id > $1 ORDER BY id LIMIT $2";
const INFOS_PAGE: &str = "SELECT id, parent, finished, octet_length(value) FROM {s}.records \
     WHERE id > $1 ORDER BY id LIMIT $2";
const META_PAGE: &str = "SELECT key, value FROM {s}.meta \
     WHERE $1::text IS NULL OR key > $1 ORDER BY key LIMIT $2";
const META_PREFIX: &str = "SELECT key, value FROM {s}.meta WHERE starts_with(key, $1)";
const GET: &str = "SELECT id, parent, finished, value FROM {s}.records WHERE id = $1";

impl Shared {
    /// Runs `read` on a pooled connection; a connection that failed or timed out is
    /// dropped, not returned to the pool: an answer it still owes would confuse the next
    /// request.
    async fn on_connection<T>(
        &self,
        context: &'static str,
        read: impl AsyncFnOnce(&Shared, &mut Object) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut object = self.connect(context).await?;
        let result = read(self, &mut object).await;
        if result.is_err() {
            drop(Object::take(object));
        }
        result
    }

    /// `request` within the deadline, its error an I/O error of `context`.
    pub(crate) async fn timed<T>(
        &self,
        context: &'static str,
        request: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.io(context, std::io::Error::other(error))),
            Err(_) => Err(timed_out(context, self.location.clone(), &self.config)),
        }
    }

    fn sql(&self, template: &str) -> String {
        schema::sql(template, &self.config.schema)
    }

    pub(crate) async fn get(&self, id: ProcId) -> Result<Option<Record>, StoreError> {
        let context = "reading a record";
        let Ok(key) = i64::try_from(id) else {
            return Ok(None); // No id over bigint's range is ever stored.
        };
        self.on_connection(context, async |this, client| {
            let statement = this
                .timed(context, client.prepare_cached(&this.sql(GET)))
                .await?;
            let row = this
                .timed(context, client.query_opt(&statement, &[&key]))
                .await?;
            row.map(|row| this.record(&row)).transpose()
        })
        .await
    }

    pub(crate) async fn meta(&self, prefix: &str) -> Result<BTreeMap<String, Vec<u8>>, StoreError> {
        let context = "reading metadata";
        self.on_connection(context, async |this, client| {
            let sql = this.sql(META_PREFIX);
            let statement = this.timed(context, client.prepare_cached(&sql)).await?;
            let rows = this
                .timed(context, client.query(&statement, &[&prefix]))
                .await?;
            Ok(rows.iter().map(|row| (row.get(0), row.get(1))).collect())
        })
        .await
    }

    pub(crate) async fn load(&self) -> Result<Loaded, StoreError> {
        let context = "loading the store";
        self.on_connection(context, async |this, client| {
            let tx = this.snapshot(context, client).await?;
            let mut loaded = Loaded::default();
            let (records, meta) = (&mut loaded.records, &mut loaded.meta);
            this.pages(
                context,
                &tx,
                RECORDS_PAGE,
                i64::MIN,
                |row| row.get(0),
                |row| {
                    records.push(this.record(row)?);
                    Ok(())
                },
            )
            .await?;
            this.pages(
                context,
                &tx,
                META_PAGE,
                None::<String>,
                |row| row.get(0),
                |row| {
                    meta.insert(row.get(0), row.get(1));
                    Ok(())
                },
            )
            .await?;
            this.timed(context, tx.commit()).await?;
            Ok(loaded)
        })
        .await
    }

    pub(crate) async fn list(&self) -> Result<Vec<RecordInfo>, StoreError> {
        let context = "listing the store's records";
        self.on_connection(context, async |this, client| {
            let tx = this.snapshot(context, client).await?;
            let mut infos = Vec::new();
            this.pages(
                context,
                &tx,
                INFOS_PAGE,
                i64::MIN,
                |row| row.get(0),
                |row| {
                    let length: i32 = row.get(3);
                    infos.push(RecordInfo {
                        id: this.id(row.get(0))?,
                        parent: this.parent(row)?,
                        finished: row.get(2),
                        value_len: usize::try_from(length).unwrap_or(0),
                    });
                    Ok(())
                },
            )
            .await?;
            this.timed(context, tx.commit()).await?;
            Ok(infos)
        })
        .await
    }

    /// A read-only `REPEATABLE READ` transaction: every statement in it sees one snapshot.
    async fn snapshot<'a>(
        &self,
        context: &'static str,
        client: &'a mut Object,
    ) -> Result<Transaction<'a>, StoreError> {
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true);
        self.timed(context, tx.start()).await
    }

    /// Reads every row of the page query `template` (`$1`: the key to read after, `$2`:
    /// the page size) in `tx`, page by page from after `first`, handing each row to
    /// `each`; `key` gives the key a row ends its page at.
    async fn pages<K: ToSql + Sync>(
        &self,
        context: &'static str,
        tx: &Transaction<'_>,
        template: &str,
        first: K,
        key: impl Fn(&Row) -> K,
        mut each: impl FnMut(&Row) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let statement = self
            .timed(context, tx.prepare_cached(&self.sql(template)))
            .await?;
        let page = self.page_size();
        let mut after = first;
        loop {
            let rows = self
                .timed(context, tx.query(&statement, &[&after, &page]))
                .await?;
            for row in &rows {
                each(row)?;
            }
            match rows.last() {
                Some(last) if rows.len() as i64 == page => after = key(last),
                _ => return Ok(()),
            }
        }
    }

    fn page_size(&self) -> i64 {
        i64::try_from(self.config.page_size).unwrap_or(i64::MAX)
    }

    fn record(&self, row: &Row) -> Result<Record, StoreError> {
        let value: Vec<u8> = row.get(3);
        Ok(Record {
            id: self.id(row.get(0))?,
            parent: self.parent(row)?,
            finished: row.get(2),
            value: Bytes::from(value),
        })
    }

    /// The parent in column 1 of a record's row.
    fn parent(&self, row: &Row) -> Result<Option<ProcId>, StoreError> {
        let parent: Option<i64> = row.get(1);
        parent.map(|p| self.id(p)).transpose()
    }

    /// A stored id: never negative, the store writes none.
    fn id(&self, id: i64) -> Result<ProcId, StoreError> {
        ProcId::try_from(id).map_err(|_| StoreError::Corrupt {
            file: self.location.join("records"),
            offset: 0,
            reason: format!("negative procedure id {id}"),
        })
    }
}
