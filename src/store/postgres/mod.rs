//! Store stage, the Postgres engine: several gateways share one database for their records,
//! rollups, spend and console tables. The schema is embedded and migrated at start (under an
//! advisory lock, so instances starting together do not race); reads use a small pool of
//! connections; the writer thread owns a connection of its own (`write`).

pub mod keys;
mod read;
mod write;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use postgres::{Client, Config, NoTls};

use super::StoreError;
use super::console::{AuditEntry, Session};
use super::engine::Engine;
use super::query::{Page, Query};
use super::rollup::{Rollup, RollupQuery};

pub(super) use write::PgWriter;

/// Idle connections kept for reads.
const POOL: usize = 4;

/// Bounds on a dead or unreachable server, so neither a read nor the writer hangs on one:
/// connecting, and unacknowledged data on an open connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);

/// Any number the advisory lock of migrations is known by.
const MIGRATION_LOCK: i64 = 0x6d6f_6465_6c67_6174; // "modelgat"

/// Each migration runs once, in order, in one transaction with the version it brings.
const MIGRATIONS: &[&str] = &[
    // 1: records (clustered access by key through the primary key; `seq` is the keyset
    // tie-breaker and grows with each insert), their idempotency on request_id, the rollups
    // (the latency histogram a dense array of counts per bin), spend, the console's tables.
    "
CREATE TABLE usage (
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    key_id TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    request_id TEXT NOT NULL,
    listener TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT NOT NULL,
    status INTEGER NOT NULL,
    stream BOOLEAN NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    total_tokens BIGINT NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    latency_ms BIGINT NOT NULL,
    ttft_ms BIGINT,
    upstream TEXT NOT NULL,
    estimated BOOLEAN NOT NULL,
    attempts INTEGER NOT NULL,
    served_model TEXT NOT NULL,
    PRIMARY KEY (key_id, time_ms, seq)
);
CREATE UNIQUE INDEX usage_request_id ON usage (request_id);
CREATE INDEX usage_time ON usage (time_ms, seq);
CREATE TABLE spend (
    key_id TEXT PRIMARY KEY,
    spend DOUBLE PRECISION NOT NULL,
    last_used_ms BIGINT NOT NULL
);
CREATE TABLE usage_rollup (
    key_id TEXT NOT NULL,
    bucket_ms BIGINT NOT NULL,
    model TEXT NOT NULL,
    status INTEGER NOT NULL,
    requests BIGINT NOT NULL,
    prompt_tokens BIGINT NOT NULL,
    completion_tokens BIGINT NOT NULL,
    total_tokens BIGINT NOT NULL,
    cost DOUBLE PRECISION NOT NULL,
    latency_ms BIGINT NOT NULL,
    estimated BIGINT NOT NULL,
    latency INTEGER[] NOT NULL,
    PRIMARY KEY (key_id, bucket_ms, model, status)
);
CREATE INDEX usage_rollup_time ON usage_rollup (bucket_ms);
CREATE TABLE console_sessions (
    token_sha256 TEXT PRIMARY KEY,
    \"user\" TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    cred TEXT NOT NULL
);
CREATE TABLE console_audit (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time_ms BIGINT NOT NULL,
    \"user\" TEXT NOT NULL,
    action TEXT NOT NULL,
    key_id TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX console_audit_time ON console_audit (time_ms);
",
    // 2: keys for a fleet (`[keys] source = "postgres"`): each key's `[[keys]]` table as in a
    // keys file (never a secret in clear), and a notification to every gateway on any change,
    // also one made by hand in SQL.
    "
CREATE TABLE keys (
    id TEXT PRIMARY KEY,
    entry TEXT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE FUNCTION modelgate_keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('modelgate_keys', '');
    RETURN NULL;
END
$$;
CREATE TRIGGER keys_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON keys
    FOR EACH STATEMENT EXECUTE FUNCTION modelgate_keys_changed();
",
    // 3: why a reply was cut short (`client`, `upstream`, `budget`, `shutdown`, `crash`).
    "ALTER TABLE usage ADD COLUMN cut TEXT NOT NULL DEFAULT '';",
    // 4: the prompt's cached and cache-write tokens, the output's reasoning tokens.
    "ALTER TABLE usage ADD COLUMN cached_prompt_tokens BIGINT NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN cache_write_tokens BIGINT NOT NULL DEFAULT 0;
     ALTER TABLE usage ADD COLUMN reasoning_tokens BIGINT NOT NULL DEFAULT 0;",
];

fn pg_err(what: &str, e: postgres::Error) -> String {
    // The error's text names the server's message; the connection string (and its password)
    // is never part of it. Its causes follow ("error connecting to server" alone hid a
    // refused connection, an unknown host or database).
    let mut text = format!("usage store (postgres): {what}: {e}");
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

impl StoreError {
    pub(super) fn pg(e: postgres::Error) -> StoreError {
        StoreError(pg_err("query", e))
    }
}

/// The connection settings from a `postgres://…` URL or a `key=value` string, with the
/// gateway's timeouts unless the string sets its own.
pub(super) fn config(url: &str) -> Result<Config, String> {
    let mut c: Config = url
        .parse()
        .map_err(|e| format!("usage store (postgres): the connection string: {e}"))?;
    if c.get_connect_timeout().is_none() {
        c.connect_timeout(CONNECT_TIMEOUT);
    }
    if c.get_tcp_user_timeout().is_none() {
        c.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if c.get_application_name().is_none() {
        c.application_name("modelgate");
    }
    Ok(c)
}

/// Connects over TLS unless the settings say `sslmode=disable`. The server's certificate is
/// verified against the system's roots (or `SSL_CERT_FILE`), for `prefer` and `require` too:
/// stricter than libpq, which only verifies for `verify-ca`/`verify-full`.
pub(super) fn connect(c: &Config) -> Result<Client, String> {
    let result = match c.get_ssl_mode() {
        postgres::config::SslMode::Disable => c.connect(NoTls),
        _ => c.connect(tls()?),
    };
    result.map_err(|e| pg_err("connecting", e))
}

/// The TLS connector, built once (reading the system's roots takes milliseconds).
fn tls() -> Result<tokio_postgres_rustls::MakeRustlsConnect, String> {
    static TLS: std::sync::OnceLock<Result<rustls::ClientConfig, String>> =
        std::sync::OnceLock::new();
    let config = TLS.get_or_init(|| {
        let mut roots = rustls::RootCertStore::empty();
        let found = rustls_native_certs::load_native_certs();
        for cert in found.certs {
            // A certificate the store cannot use is skipped, as the system's own tools do.
            let _ = roots.add(cert);
        }
        // No roots (no ca-certificates): a server without TLS is still reached in plain
        // (sslmode=prefer); one with TLS fails its handshake and the error says so.
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|b| b.with_root_certificates(roots).with_no_client_auth())
            .map_err(|e| format!("usage store (postgres): TLS: {e}"))
    });
    config
        .clone()
        .map(tokio_postgres_rustls::MakeRustlsConnect::new)
}

/// A connection to an up-to-date schema (for the keys source and the `keys` commands).
pub(in crate::store) fn migrated_client(url: &str) -> Result<Client, String> {
    let mut c = connect(&config(url)?)?;
    migrate(&mut c)?;
    Ok(c)
}

/// Applies the migrations this database has not had yet.
fn migrate(client: &mut Client) -> Result<(), String> {
    let mut tx = client.transaction().map_err(|e| pg_err("begin", e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(|e| pg_err("locking the schema", e))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS modelgate_schema (version INTEGER NOT NULL)")
        .map_err(|e| pg_err("creating modelgate_schema", e))?;
    let version: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM modelgate_schema",
            &[],
        )
        .and_then(|r| r.try_get(0))
        .map_err(|e| pg_err("reading the schema version", e))?;
    let have = usize::try_from(version).unwrap_or(0);
    if have > MIGRATIONS.len() {
        return Err(format!(
            "usage store (postgres): the database has schema version {have}, newer than this \
             modelgate knows ({}); upgrade modelgate",
            MIGRATIONS.len()
        ));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(have) {
        let v = i32::try_from(i + 1).unwrap_or(i32::MAX);
        tx.batch_execute(sql)
            .map_err(|e| pg_err(&format!("migration {v}"), e))?;
        tx.execute("INSERT INTO modelgate_schema (version) VALUES ($1)", &[&v])
            .map_err(|e| pg_err("recording the schema version", e))?;
        tracing::info!(version = v, "usage store (postgres): schema migrated");
    }
    tx.commit().map_err(|e| pg_err("commit", e))
}

pub(super) struct PgEngine {
    config: Config,
    pool: Mutex<Vec<Client>>,
    closed: AtomicBool,
}

impl PgEngine {
    /// Connects, migrates the schema and returns the engine and the writer thread's side.
    pub fn open(url: &str) -> Result<(PgEngine, PgWriter), String> {
        let config = config(url)?;
        let mut client = connect(&config)?;
        migrate(&mut client)?;
        let engine = PgEngine {
            config: config.clone(),
            pool: Mutex::new(vec![client]),
            closed: AtomicBool::new(false),
        };
        Ok((engine, PgWriter::new(config)))
    }

    /// Runs `f` on a pooled connection (opened on demand); one that saw an error or whose
    /// connection closed is not pooled again.
    fn with_client<T>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = loop {
            let c = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match c {
                Some(c) if c.is_closed() => continue,
                other => break other,
            }
        };
        let mut client = match pooled {
            Some(c) => c,
            None => connect(&self.config).map_err(StoreError)?,
        };
        let out = f(&mut client);
        if out.is_ok() && !self.closed.load(Ordering::SeqCst) {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < POOL {
                pool.push(client);
            }
        }
        out
    }
}

impl Engine for PgEngine {
    fn page(&self, q: &Query) -> Result<Page, StoreError> {
        self.with_client(|c| read::page(c, q))
    }

    fn export_csv(
        &self,
        q: &Query,
        sink: &mut dyn FnMut(Bytes) -> bool,
    ) -> Result<u64, StoreError> {
        self.with_client(|c| read::export(c, q, sink))
    }

    fn rollup(&self, q: &RollupQuery) -> Result<Rollup, StoreError> {
        self.with_client(|c| read::rollup(c, q))
    }

    fn spend_totals(&self) -> Result<HashMap<String, f64>, StoreError> {
        self.with_client(|c| {
            let rows = c
                .query("SELECT key_id, spend FROM spend", &[])
                .map_err(StoreError::pg)?;
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<_, postgres::Error>>()
                .map_err(StoreError::pg)
        })
    }

    fn last_used(&self) -> Result<HashMap<String, i64>, StoreError> {
        self.with_client(|c| {
            let rows = c
                .query("SELECT key_id, last_used_ms FROM spend", &[])
                .map_err(StoreError::pg)?;
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<_, postgres::Error>>()
                .map_err(StoreError::pg)
        })
    }

    fn session_put(&self, token_sha256: &str, s: &Session) -> Result<(), StoreError> {
        self.with_client(|c| {
            let mut tx = c.transaction().map_err(StoreError::pg)?;
            // Expired sessions go as new ones come: the table never grows without bound.
            tx.execute(
                "DELETE FROM console_sessions WHERE expires_ms <= $1",
                &[&s.created_ms],
            )
            .map_err(StoreError::pg)?;
            tx.execute(
                "INSERT INTO console_sessions (token_sha256, \"user\", csrf, created_ms, \
                 expires_ms, cred) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (token_sha256) DO UPDATE SET \"user\" = excluded.\"user\", \
                 csrf = excluded.csrf, created_ms = excluded.created_ms, \
                 expires_ms = excluded.expires_ms, cred = excluded.cred",
                &[
                    &token_sha256,
                    &s.user,
                    &s.csrf,
                    &s.created_ms,
                    &s.expires_ms,
                    &s.cred,
                ],
            )
            .map_err(StoreError::pg)?;
            tx.commit().map_err(StoreError::pg)
        })
    }

    fn session_get(&self, token_sha256: &str, now_ms: i64) -> Result<Option<Session>, StoreError> {
        self.with_client(|c| {
            let row = c
                .query_opt(
                    "SELECT \"user\", csrf, created_ms, expires_ms, cred FROM console_sessions \
                     WHERE token_sha256 = $1 AND expires_ms > $2",
                    &[&token_sha256, &now_ms],
                )
                .map_err(StoreError::pg)?;
            row.map(|r| {
                Ok(Session {
                    user: r.try_get(0)?,
                    csrf: r.try_get(1)?,
                    created_ms: r.try_get(2)?,
                    expires_ms: r.try_get(3)?,
                    cred: r.try_get(4)?,
                })
            })
            .transpose()
            .map_err(StoreError::pg)
        })
    }

    fn session_delete(&self, token_sha256: &str) -> Result<(), StoreError> {
        self.with_client(|c| {
            c.execute(
                "DELETE FROM console_sessions WHERE token_sha256 = $1",
                &[&token_sha256],
            )
            .map(drop)
            .map_err(StoreError::pg)
        })
    }

    fn audit_add(&self, e: &AuditEntry) -> Result<(), StoreError> {
        self.with_client(|c| {
            c.execute(
                "INSERT INTO console_audit (time_ms, \"user\", action, key_id, detail) \
                 VALUES ($1, $2, $3, $4, $5)",
                &[&e.time_ms, &e.user, &e.action, &e.key_id, &e.detail],
            )
            .map(drop)
            .map_err(StoreError::pg)
        })
    }

    fn audit_list(&self, limit: usize) -> Result<Vec<AuditEntry>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with_client(|c| {
            let rows = c
                .query(
                    "SELECT time_ms, \"user\", action, key_id, detail FROM console_audit \
                     ORDER BY time_ms DESC, id DESC LIMIT $1",
                    &[&limit],
                )
                .map_err(StoreError::pg)?;
            rows.iter()
                .map(|r| {
                    Ok(AuditEntry {
                        time_ms: r.try_get(0)?,
                        user: r.try_get(1)?,
                        action: r.try_get(2)?,
                        key_id: r.try_get(3)?,
                        detail: r.try_get(4)?,
                    })
                })
                .collect::<Result<_, postgres::Error>>()
                .map_err(StoreError::pg)
        })
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let idle = std::mem::take(&mut *self.pool.lock().unwrap_or_else(|e| e.into_inner()));
        if idle.is_empty() {
            return;
        }
        // Dropping a client waits for its server to end the connection: a server that stopped
        // answering would hold the shutdown forever. They end on a thread of their own, which
        // the exit does not wait for.
        let ended = std::thread::Builder::new()
            .name("pg-close".into())
            .spawn(move || drop(idle));
        if let Err(e) = ended {
            tracing::warn!("usage store (postgres): closing connections: {e}");
        }
    }
}
