//! Versioned conditional updates: `UPDATE … SET …, version = version + 1 WHERE id = ? AND
//! version = ?`.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use sqlx::{Encode, Type};

use super::backend::{Backend, SqlQuery};
use super::{name, version_from_sql, version_to_sql, ConcurrencyError, Version};

/// A type stored in one row of a table with an id column and a version column.
///
/// The table is yours: create it with the id as primary key (or unique), the
/// [`COLUMNS`](Entity::COLUMNS), and a `BIGINT NOT NULL` version column. Implement this trait for
/// each database the type is stored in (or once, generically, with the bounds the values need).
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// use idem::kit::{Entity, SqlQuery};
/// use sqlx::{sqlite::SqliteRow, Row, Sqlite};
///
/// struct Account { id: String, balance: i64 }
///
/// impl Entity<Sqlite> for Account {
///     type Id = String;
///     const COLUMNS: &'static [&'static str] = &["balance"];
///     fn id(&self) -> &String { &self.id }
///     fn bind<'q>(&'q self, query: SqlQuery<'q, Sqlite>) -> SqlQuery<'q, Sqlite> {
///         query.bind(self.balance)
///     }
///     fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> {
///         Ok(Account { id: row.try_get("id")?, balance: row.try_get("balance")? })
///     }
/// }
/// # }
/// ```
pub trait Entity<DB: Backend>: Sized + Send + Sync {
    /// The type of the id column.
    type Id: for<'q> Encode<'q, DB> + Type<DB> + Send + Sync;

    /// The columns that [`bind`](Entity::bind) writes, in the order it binds them. The id and
    /// version columns are not among them.
    const COLUMNS: &'static [&'static str];

    /// This value's id.
    fn id(&self) -> &Self::Id;

    /// Binds one value per entry of [`COLUMNS`](Entity::COLUMNS), in that order.
    fn bind<'q>(&'q self, query: SqlQuery<'q, DB>) -> SqlQuery<'q, DB>;

    /// Builds the value from a row holding the id column, the [`COLUMNS`](Entity::COLUMNS) and
    /// the version column (read them by name).
    fn from_row(row: &DB::Row) -> Result<Self, sqlx::Error>;
}

/// A value together with the version it was read at.
///
/// Reading and writing the value goes through `Deref`/`DerefMut`; the version moves only when
/// [`VersionedTable::save`] succeeded, so a failed save leaves it at the version the change was
/// based on.
///
/// ```
/// use idem::kit::{Version, Versioned};
/// let mut balance = Versioned::new(100_i64, Version::new(3));
/// *balance += 5;
/// assert_eq!(*balance, 105);
/// assert_eq!(balance.version(), Version::new(3));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    value: T,
    version: Version,
}

impl<T> Versioned<T> {
    /// Pairs a value with the version it is based on: the version a client sent back, say, to
    /// reject its change when the row moved on since the client read it.
    ///
    /// ```
    /// use idem::kit::{Version, Versioned};
    /// let v = Versioned::new("draft", Version::INITIAL);
    /// assert_eq!(v.version(), Version::INITIAL);
    /// ```
    pub fn new(value: T, version: Version) -> Versioned<T> {
        Versioned { value, version }
    }

    /// The version the value was read at, or last saved as.
    ///
    /// ```
    /// use idem::kit::{Version, Versioned};
    /// assert_eq!(Versioned::new((), Version::new(9)).version().get(), 9);
    /// ```
    pub fn version(&self) -> Version {
        self.version
    }

    /// The value, without its version.
    ///
    /// ```
    /// use idem::kit::{Version, Versioned};
    /// assert_eq!(Versioned::new(7, Version::INITIAL).into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for Versioned<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Versioned<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

/// The outcome of [`VersionedTable::insert`].
///
/// ```
/// use idem::kit::{Inserted, Version, Versioned};
/// let outcome = Inserted::New(Versioned::new("alice", Version::INITIAL));
/// assert!(matches!(outcome, Inserted::New(ref v) if v.version() == Version::INITIAL));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "Exists means nothing was written"]
pub enum Inserted<T> {
    /// The row was created at [`Version::INITIAL`].
    New(Versioned<T>),
    /// A row with this id already exists; nothing was written. The value is handed back.
    /// Creating by id is naturally idempotent: a repeated "open account" lands here.
    Exists(T),
}

/// A table of [`Entity`] rows with a version column, and the statements that keep it.
///
/// Every save is one conditional statement,
/// `UPDATE <table> SET <columns…>, <version> = <version> + 1 WHERE <id> = ? AND <version> = ?`.
/// When it changes no row, one more read tells [`ConcurrencyError::Conflict`] (the row moved on)
/// from [`ConcurrencyError::NotFound`].
///
/// ```
/// # #[cfg(feature = "sqlite")] {
/// # use idem::kit::{Entity, SqlQuery};
/// # use sqlx::{sqlite::SqliteRow, Row, Sqlite};
/// # struct Account { id: String, balance: i64 }
/// # impl Entity<Sqlite> for Account {
/// #     type Id = String;
/// #     const COLUMNS: &'static [&'static str] = &["balance"];
/// #     fn id(&self) -> &String { &self.id }
/// #     fn bind<'q>(&'q self, q: SqlQuery<'q, Sqlite>) -> SqlQuery<'q, Sqlite> { q.bind(self.balance) }
/// #     fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> {
/// #         Ok(Account { id: row.try_get("id")?, balance: row.try_get("balance")? })
/// #     }
/// # }
/// use idem::kit::{ConcurrencyError, Inserted, Version, VersionedTable};
/// # use sqlx::Connection;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut conn = sqlx::SqliteConnection::connect("sqlite::memory:").await?;
/// sqlx::query("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)")
///     .execute(&mut conn).await?;
/// let accounts = VersionedTable::<Account, Sqlite>::new("accounts")?;
///
/// let Inserted::New(mut alice) = accounts.insert(&mut conn, Account { id: "alice".into(), balance: 0 }).await? else {
///     unreachable!("a new id");
/// };
/// let mut stale = accounts.load(&mut conn, &"alice".to_string()).await?;
///
/// alice.balance += 10;
/// accounts.save(&mut conn, &mut alice).await?;
/// assert_eq!(alice.version(), Version::new(2));
///
/// stale.balance += 99;
/// let err = accounts.save(&mut conn, &mut stale).await.unwrap_err();
/// assert!(matches!(err, ConcurrencyError::Conflict { expected, actual }
///     if expected == Version::INITIAL && actual == Version::new(2)));
/// assert_eq!(stale.version(), Version::INITIAL, "a failed save leaves the version alone");
/// # Ok(()) }
/// # }
/// ```
pub struct VersionedTable<T, DB> {
    update_sql: String,
    version_sql: String,
    select_sql: String,
    insert_sql: String,
    _entity: PhantomData<fn() -> (T, DB)>,
}

impl<T, DB> fmt::Debug for VersionedTable<T, DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VersionedTable")
            .field("update_sql", &self.update_sql)
            .finish_non_exhaustive()
    }
}

impl<T, DB> Clone for VersionedTable<T, DB> {
    fn clone(&self) -> Self {
        VersionedTable {
            update_sql: self.update_sql.clone(),
            version_sql: self.version_sql.clone(),
            select_sql: self.select_sql.clone(),
            insert_sql: self.insert_sql.clone(),
            _entity: PhantomData,
        }
    }
}

/// Names the id and version columns of a [`VersionedTable`] when they are not `id` and
/// `version`.
///
/// ```
/// # #[cfg(not(feature = "sqlite"))] fn main() {}
/// # #[cfg(feature = "sqlite")] fn main() -> Result<(), idem::kit::ConcurrencyError> {
/// # use idem::kit::{Entity, SqlQuery};
/// # use sqlx::{sqlite::SqliteRow, Row, Sqlite};
/// # struct Doc { key: i64 }
/// # impl Entity<Sqlite> for Doc {
/// #     type Id = i64;
/// #     const COLUMNS: &'static [&'static str] = &[];
/// #     fn id(&self) -> &i64 { &self.key }
/// #     fn bind<'q>(&'q self, q: SqlQuery<'q, Sqlite>) -> SqlQuery<'q, Sqlite> { q }
/// #     fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> { Ok(Doc { key: row.try_get("doc_key")? }) }
/// # }
/// use idem::kit::VersionedTable;
/// let docs = VersionedTable::<Doc, Sqlite>::builder("docs")
///     .id_column("doc_key")
///     .version_column("rev")
///     .build()?;
/// assert!(VersionedTable::<Doc, Sqlite>::builder("docs").id_column("doc key").build().is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct VersionedTableBuilder<T, DB> {
    table: String,
    id_column: String,
    version_column: String,
    _entity: PhantomData<fn() -> (T, DB)>,
}

impl<T: Entity<DB>, DB: Backend> VersionedTableBuilder<T, DB> {
    /// The id column (default `id`).
    pub fn id_column(mut self, name: &str) -> Self {
        name.clone_into(&mut self.id_column);
        self
    }

    /// The version column (default `version`).
    pub fn version_column(mut self, name: &str) -> Self {
        name.clone_into(&mut self.version_column);
        self
    }

    /// Validates every name and prepares the statements.
    pub fn build(self) -> Result<VersionedTable<T, DB>, ConcurrencyError> {
        let table = name("table", &self.table)?;
        let id = name("id column", &self.id_column)?;
        let version = name("version column", &self.version_column)?;
        let columns = T::COLUMNS
            .iter()
            .map(|c| name("column", c))
            .collect::<Result<Vec<_>, _>>()?;
        let n = columns.len();

        let mut sets: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c} = ${}", i + 1))
            .collect();
        sets.push(format!("{version} = {version} + 1"));
        let update_sql = format!(
            "UPDATE {table} SET {} WHERE {id} = ${} AND {version} = ${}",
            sets.join(", "),
            n + 1,
            n + 2
        );

        let mut all = vec![id.to_string()];
        all.extend(columns.iter().map(ToString::to_string));
        all.push(version.to_string());
        let select_sql = format!("SELECT {} FROM {table} WHERE {id} = $1", all.join(", "));
        let placeholders: Vec<String> = (1..=n + 1).map(|i| format!("${i}")).collect();
        let insert_sql = format!(
            "INSERT INTO {table} ({}) VALUES ({}, {}) ON CONFLICT ({id}) DO NOTHING",
            all.join(", "),
            placeholders.join(", "),
            Version::INITIAL.get()
        );
        let version_sql = format!("SELECT {version} FROM {table} WHERE {id} = $1");
        Ok(VersionedTable {
            update_sql,
            version_sql,
            select_sql,
            insert_sql,
            _entity: PhantomData,
        })
    }
}

impl<T: Entity<DB>, DB: Backend> VersionedTable<T, DB> {
    /// The table `table` with columns `id` and `version`. See
    /// [`builder`](VersionedTable::builder) for other column names.
    ///
    /// ```
    /// # #[cfg(feature = "sqlite")] {
    /// # use idem::kit::{Entity, SqlQuery};
    /// # use sqlx::{sqlite::SqliteRow, Row, Sqlite};
    /// # struct Doc { id: i64 }
    /// # impl Entity<Sqlite> for Doc {
    /// #     type Id = i64;
    /// #     const COLUMNS: &'static [&'static str] = &[];
    /// #     fn id(&self) -> &i64 { &self.id }
    /// #     fn bind<'q>(&'q self, q: SqlQuery<'q, Sqlite>) -> SqlQuery<'q, Sqlite> { q }
    /// #     fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> { Ok(Doc { id: row.try_get("id")? }) }
    /// # }
    /// use idem::kit::{ConcurrencyError, VersionedTable};
    /// assert!(VersionedTable::<Doc, Sqlite>::new("docs").is_ok());
    /// assert!(matches!(VersionedTable::<Doc, Sqlite>::new("docs; DROP TABLE docs"),
    ///     Err(ConcurrencyError::InvalidConfig(_))));
    /// # }
    /// ```
    pub fn new(table: &str) -> Result<VersionedTable<T, DB>, ConcurrencyError> {
        VersionedTable::builder(table).build()
    }

    /// Starts describing the table `table`, to name its id and version columns.
    ///
    /// ```
    /// # #[cfg(not(feature = "sqlite"))] fn main() {}
    /// # #[cfg(feature = "sqlite")] fn main() -> Result<(), idem::kit::ConcurrencyError> {
    /// # use idem::kit::{Entity, SqlQuery};
    /// # use sqlx::{sqlite::SqliteRow, Row, Sqlite};
    /// # struct Doc { id: i64 }
    /// # impl Entity<Sqlite> for Doc {
    /// #     type Id = i64;
    /// #     const COLUMNS: &'static [&'static str] = &[];
    /// #     fn id(&self) -> &i64 { &self.id }
    /// #     fn bind<'q>(&'q self, q: SqlQuery<'q, Sqlite>) -> SqlQuery<'q, Sqlite> { q }
    /// #     fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> { Ok(Doc { id: row.try_get("id")? }) }
    /// # }
    /// let docs = idem::kit::VersionedTable::<Doc, Sqlite>::builder("docs").version_column("rev").build()?;
    /// # let _ = docs;
    /// # Ok(()) }
    /// ```
    pub fn builder(table: &str) -> VersionedTableBuilder<T, DB> {
        VersionedTableBuilder {
            table: table.to_owned(),
            id_column: "id".to_owned(),
            version_column: "version".to_owned(),
            _entity: PhantomData,
        }
    }

    /// Inserts `value` at [`Version::INITIAL`], or reports [`Inserted::Exists`] when its id is
    /// taken (`INSERT … ON CONFLICT (id) DO NOTHING`: never an error, so it is safe inside a
    /// transaction). One statement.
    ///
    /// `conn` is a connection: `&mut conn` for a pooled one, `&mut tx` for a transaction.
    /// See [`VersionedTable`] for an example.
    pub async fn insert(
        &self,
        conn: &mut DB::Connection,
        value: T,
    ) -> Result<Inserted<T>, ConcurrencyError> {
        let query = value.bind(sqlx::query(&self.insert_sql).bind(value.id()));
        let inserted = DB::execute(conn, query).await?;
        Ok(if inserted == 1 {
            Inserted::New(Versioned::new(value, Version::INITIAL))
        } else {
            Inserted::Exists(value)
        })
    }

    /// Reads the row `id` with its version; [`ConcurrencyError::NotFound`] when there is none.
    /// One statement. See [`VersionedTable`] for an example.
    pub async fn load(
        &self,
        conn: &mut DB::Connection,
        id: &T::Id,
    ) -> Result<Versioned<T>, ConcurrencyError> {
        let row = DB::fetch_optional(conn, sqlx::query(&self.select_sql).bind(id))
            .await?
            .ok_or(ConcurrencyError::NotFound)?;
        let value = T::from_row(&row)?;
        let version = version_from_sql(DB::get_i64(&row, T::COLUMNS.len() + 1)?)?;
        Ok(Versioned::new(value, version))
    }

    /// Writes `entity` if the row is still at `entity.version()`, and then (only then) moves
    /// `entity` to the new version, which it also returns.
    ///
    /// One statement when it succeeds. When no row changed, one more read returns
    /// [`ConcurrencyError::Conflict`] with both versions, or [`ConcurrencyError::NotFound`];
    /// `entity` is left untouched. See [`VersionedTable`] for an example.
    pub async fn save(
        &self,
        conn: &mut DB::Connection,
        entity: &mut Versioned<T>,
    ) -> Result<Version, ConcurrencyError> {
        let expected = entity.version();
        let query = entity.value.bind(sqlx::query(&self.update_sql));
        let query = DB::bind_i64(query.bind(entity.value.id()), version_to_sql(expected)?);
        if DB::execute(conn, query).await? == 1 {
            entity.version = expected.next();
            return Ok(entity.version);
        }
        let version_query = sqlx::query(&self.version_sql).bind(entity.value.id());
        match DB::fetch_optional(conn, version_query).await? {
            None => Err(ConcurrencyError::NotFound),
            Some(row) => Err(ConcurrencyError::Conflict {
                expected,
                actual: version_from_sql(DB::get_i64(&row, 0)?)?,
            }),
        }
    }
}
