//! The command line: `serve` (default), `check`, `key new`, `password-hash`, `mock-upstream`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::config::keys::sha256;
use crate::limit::budget::Spend;
use crate::limit::shared::SharedLimits;
use crate::mock_upstream::{self, MockOptions};
use crate::route::live::Live;
use crate::store::{Store, StoreOptions};

#[derive(Parser)]
#[command(
    name = "modelgate",
    version,
    about = "An OpenAI-compatible gateway in front of hosted AI models"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Config file (for plain `modelgate`, same as `serve`).
    #[arg(long, global = true, default_value = "conf/modelgate.toml")]
    config: PathBuf,
    /// Take the listening sockets over from a running instance (zero-downtime upgrade: start
    /// the new binary with this flag, then send the old process SIGQUIT).
    #[arg(short = 'u', long, global = true)]
    upgrade: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve,
    /// Validate the config and the keys file; name every problem.
    Check,
    /// Key management.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Keys kept in Postgres (`[keys] source = "postgres"`).
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Read a password on stdin, print its argon2id hash for `[console] password_hash`.
    PasswordHash,
    /// Run the stand-in OpenAI-compatible model server.
    MockUpstream {
        #[arg(long)]
        listen: String,
        /// Content chunks per streamed reply.
        #[arg(long, default_value_t = 8)]
        chunks: usize,
        /// Delay between streamed events, in milliseconds.
        #[arg(long, default_value_t = 0)]
        delay_ms: u64,
        /// Serve HTTPS with this certificate (PEM); needs --tls-key.
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<String>,
        /// Private key (PEM) for --tls-cert.
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<String>,
        /// Worker threads (a benchmark of a proxy on several cores needs a mock as wide).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
        threads: u16,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Copy every key of a keys file into the Postgres keys table (a key with the same id is
    /// replaced, others stay; secrets are stored as SHA-256 and hint only).
    Import {
        /// The keys file (default: `[keys] file` of the config).
        file: Option<PathBuf>,
    },
    /// Print the Postgres keys table as a keys file.
    Export,
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Print a fresh random key and the `[[keys]]` entry holding only its SHA-256.
    New {
        #[arg(long, default_value = "new-key", value_parser = key_id)]
        id: String,
        /// Append the entry to this keys file (comments and layout kept; the running gateway
        /// picks it up) and print only the secret.
        #[arg(long, value_name = "KEYS_FILE")]
        append: Option<PathBuf>,
    },
}

/// A key id the keys file takes (an empty one it refuses).
fn key_id(id: &str) -> Result<String, String> {
    if id.is_empty() {
        return Err("a key's id cannot be empty".into());
    }
    Ok(id.to_string())
}

pub fn run() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    // One crypto provider for every TLS client that asks rustls for the process default
    // (rediss:// connections); both providers are compiled into the tree.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => serve(&cli.config, cli.upgrade),
        Command::Check => check(&cli.config),
        Command::Key {
            command: KeyCommand::New { id, append: None },
        } => {
            print!("{}", new_key(&id));
            ExitCode::SUCCESS
        }
        Command::Key {
            command:
                KeyCommand::New {
                    id,
                    append: Some(file),
                },
        } => append_key(&id, &file),
        Command::Keys { command } => keys_command(&cli.config, command),
        Command::PasswordHash => password_hash(),
        Command::MockUpstream {
            listen,
            chunks,
            delay_ms,
            tls_cert,
            tls_key,
            threads,
        } => {
            let tls = tls_cert.zip(tls_key);
            mock_upstream::run_standalone(
                &listen,
                MockOptions {
                    chunks,
                    delay_ms,
                    tls,
                    reuse_port: false,
                },
                threads.into(),
            );
        }
    }
}

fn init_logging() {
    let (mut filter, bad) = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    // The file watcher's own trace writes a line per change in the config's folder: a log
    // kept in that folder would feed itself (millions of lines a minute at RUST_LOG=trace).
    // Named in RUST_LOG, it is as asked.
    let named = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("notify"));
    if !named {
        if let Ok(d) = "notify=info".parse() {
            filter = filter.add_directive(d);
        }
    }
    if let Some(e) = bad {
        // Said whatever the filter lets through (it might leave out every warning).
        eprintln!(
            "{}",
            crate::ops::redact::redact(&format!(
                "RUST_LOG: a directive left out ({e}); the others are in force"
            ))
        );
    }
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(crate::ops::redact::RedactingStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// The log's filter from RUST_LOG (`info` without it): a directive that does not parse is left
/// out and the others kept as written (one typo dropped them all, silently); why, to say so.
fn log_filter(rust_log: Option<&str>) -> (tracing_subscriber::EnvFilter, Option<String>) {
    use tracing_subscriber::EnvFilter;
    let Some(v) = rust_log else {
        return (EnvFilter::new("info"), None);
    };
    match EnvFilter::try_new(v) {
        Ok(f) => (f, None),
        Err(e) => {
            let good: Vec<&str> = v
                .split(',')
                .filter(|d| EnvFilter::try_new(d.trim()).is_ok())
                .collect();
            (EnvFilter::new(good.join(",")), Some(e.to_string()))
        }
    }
}

/// SIGHUP asks a running gateway to reload; its default action ends the process, and the
/// config watcher that handles it starts only with the server. A handler is registered here,
/// first, so a SIGHUP during the start (a config manager's reload racing a restart) is taken
/// as the reload the start does anyway. The handler stays for the life of the process.
fn hold_hangups() {
    use tokio::signal::unix::{SignalKind, signal};
    let registered = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(async { signal(SignalKind::hangup()).map(drop) })
                .map_err(|e| e.to_string())
        });
    if let Err(e) = registered {
        tracing::warn!("cannot hold SIGHUP during the start (one would end the process): {e}");
    }
}

fn serve(path: &Path, upgrade: bool) -> ExitCode {
    hold_hangups();
    // Pingora's proxies make their TLS connectors as they are built and panic on a trust
    // store that cannot be loaded: a start that fails, said as such, before anything opens.
    if let Err(e) = crate::upstream::check_trust_store() {
        eprintln!("cannot start: {e}");
        return ExitCode::from(2);
    }
    let mut config = match Config::load(path) {
        Ok(c) => c,
        Err(p) => return failed(p.to_string()),
    };
    // Port 0: a port picked now, and held; said on stderr once the rest is checked.
    let (_held, picked) = match crate::server::ports::pick(&mut config.fixed.listeners, upgrade) {
        Ok(picked) => picked,
        Err(e) => return failed(e),
    };
    let live = match Live::load(config) {
        Ok(l) => Arc::new(l),
        Err(p) => return failed(p.to_string()),
    };
    let c = live.fixed.clone();
    if let Err(e) = ports_free(&c, upgrade, &picked) {
        return failed(e);
    }
    let metrics = match crate::ops::metrics::Metrics::new() {
        Ok(m) => Arc::new(m),
        Err(e) => return failed(format!("cannot make the metrics: {e}")),
    };
    metrics.set_key_label(c.metrics.key_label);
    let (store, where_) = match open_store(&c, &metrics) {
        Ok(opened) => opened,
        Err(e) => return failed(e),
    };
    let spend = std::sync::Arc::new(Spend::from_totals(store.spend_at_open()));
    log_start(&live, &where_);
    if let Some(t) = &c.telemetry {
        if let Err(e) = crate::ops::telemetry::start(t) {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
        tracing::info!(endpoint = %t.otlp_endpoint, "exporting traces over OTLP/HTTP");
    }
    let shared_limits = match &c.limits.redis {
        Some(url) => {
            let (on_down, timeout) = (c.limits.on_redis_down, c.limits.redis_timeout);
            match SharedLimits::start(url.expose(), on_down, timeout, metrics.clone()) {
                Ok(l) => {
                    metrics.redis_up();
                    Some(l)
                }
                Err(e) => return failed(e),
            }
        }
        None => None,
    };
    if let (Some(url), true) = (&c.storage.postgres, c.keys.in_postgres) {
        let live = live.clone();
        let url = url.expose().to_string();
        crate::store::postgres::keys::follow(url, metrics.clone(), move |t| live.set_keys(t));
    }
    let spend_sync = (c.storage.postgres.is_some() || shared_limits.is_some())
        .then(|| sync_spend(store.clone(), shared_limits.clone(), spend.clone()));
    let shared = crate::state::build(
        &c,
        live,
        store.clone(),
        spend.clone(),
        shared_limits,
        metrics,
    );
    let signals =
        crate::ops::lifecycle::Signals::new(shared.lifecycle.clone(), c.server.shutdown_delay);
    let server = match crate::server::build(shared, upgrade, &picked) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot start: {e}");
            store.close();
            return ExitCode::from(2);
        }
    };
    if let Some(line) = picked.said() {
        eprintln!("{line}");
    }
    server.run(pingora_core::server::RunArgs {
        shutdown_signal: Box::new(signals),
    });
    drop(spend_sync);
    // Every runtime has exited, so every request has handed over its record: write them all.
    store.close();
    crate::ops::telemetry::flush();
    tracing::info!(
        written = store.stats().written,
        "usage records drained; bye"
    );
    ExitCode::SUCCESS
}

/// The start's log line: where it listens, its store, its keys and models.
fn log_start(live: &Live, store: &str) {
    let c = &live.fixed;
    tracing::info!(
        main = ?c.listeners.main,
        main_tls = c.listeners.main_tls.is_some(),
        direct = ?c.listeners.direct,
        direct_tls = c.listeners.direct_tls.is_some(),
        admin = ?c.listeners.admin,
        store = %store,
        keys = live.snapshot().keys.len(),
        models = live.snapshot().config.models.len(),
        "modelgate starting"
    );
}

/// A start that cannot go on: why, on stderr, and exit status 2.
fn failed(why: String) -> ExitCode {
    eprintln!("{why}");
    ExitCode::from(2)
}

/// Whether every address the config listens on is free. Pingora retries a busy port forever
/// (that is how its upgrade hand-over works); a plain start should fail fast instead, or a
/// health check would pass with the API unbound. An upgrade takes over sockets the running
/// instance holds: they are busy by design. Each is held until all are checked, so two of them
/// naming one address fail here too (else one would answer on the other's port).
/// The ports the gateway picked itself (`picked`) are held by it, so not checked; the demo
/// mock's may be held, not listened on, by whoever picked it (a test harness), so it is tried
/// with `SO_REUSEPORT`, as the mock binds it.
fn ports_free(
    c: &crate::config::Fixed,
    upgrade: bool,
    picked: &crate::server::ports::Picked,
) -> Result<(), String> {
    if upgrade {
        return Ok(());
    }
    let addrs = [
        (&c.listeners.main, false),
        (&c.listeners.direct, false),
        (&c.listeners.admin, false),
        (&c.demo_mock_upstream, true),
    ];
    let mut held = Vec::with_capacity(addrs.len());
    for (addr, reuse_port) in addrs {
        let Some(addr) = addr.as_deref().filter(|a| !picked.has(a)) else {
            continue;
        };
        let bound = addr
            .parse::<std::net::SocketAddr>()
            .map_err(std::io::Error::other)
            .and_then(|a| {
                let s = socket2::Socket::new(
                    socket2::Domain::for_address(a),
                    socket2::Type::STREAM,
                    None,
                )?;
                s.set_reuse_address(true)?;
                s.set_reuse_port(reuse_port)?;
                s.bind(&a.into())?;
                s.listen(1)?;
                Ok(s)
            });
        held.push(bound.map_err(|e| format!("cannot listen on {addr}: {e}"))?);
    }
    Ok(())
}

/// The usage store `[storage]` names, and what to call it in the log.
fn open_store(
    c: &crate::config::Fixed,
    metrics: &Arc<crate::ops::metrics::Metrics>,
) -> Result<(Arc<Store>, String), String> {
    let options = StoreOptions {
        retention: c.storage.retention,
        // Postgres away, or SQLite's file locked by another process past its busy timeout:
        // batches wait on disk (the file is made only then).
        spool: Some(c.storage.spool.clone()),
        journal: c.storage.journal.clone(),
        overflow_max: c.storage.memory_max_records,
        refuse_when_full: c.storage.on_store_full == crate::config::OnStoreFull::Refuse,
        spool_max_bytes: c.storage.spool_max_bytes,
        metrics: Some(metrics.clone()),
        ..StoreOptions::default()
    };
    let (store, where_) = match &c.storage.postgres {
        Some(url) => (
            Store::open_postgres(url.expose(), options),
            "postgres".to_string(),
        ),
        None => (
            Store::open(&c.storage.sqlite, options),
            c.storage.sqlite.display().to_string(),
        ),
    };
    match store {
        Ok(s) => Ok((s, where_)),
        Err(e) => Err(format!("cannot open the usage store {where_}: {e}")),
    }
}

fn check(path: &Path) -> ExitCode {
    // Report the keys file's problems too, even when the config has some (or does not
    // deserialize at all: then the file it names, if it can tell).
    let keys_problems = |file: &Path, problems: &mut crate::config::Problems| {
        if let Err(p) = crate::config::keys::KeyTable::load(file) {
            problems.extend(p);
        }
    };
    // The store `serve` opens (SQLite: nothing is written here).
    let store_problem = |config: &Config| match &config.fixed.storage.postgres {
        None => crate::store::check_sqlite_path(&config.fixed.storage.sqlite)
            .err()
            .map(|m| {
                crate::config::Problem::new(&path.display().to_string(), None, "storage.sqlite", m)
            }),
        Some(_) => None,
    };
    let checked = match Config::load_lenient(path) {
        Ok((config, problems)) if problems.0.is_empty() => match store_problem(&config) {
            None => Live::load(config),
            Some(p) => {
                let mut problems = crate::config::Problems::one(p);
                if let Err(more) = Live::load(config) {
                    problems.extend(more);
                }
                Err(problems)
            }
        },
        Ok((config, mut problems)) => {
            problems.extend(crate::config::Problems(
                store_problem(&config).into_iter().collect(),
            ));
            // What only resolving the upstreams finds (a name that does not resolve), too.
            if let Err(found) = crate::route::Router::build(&config.live, &config.fixed.path) {
                for f in found.0 {
                    if !problems.0.contains(&f) {
                        problems.push(f);
                    }
                }
            }
            if !config.fixed.keys.in_postgres {
                keys_problems(&config.fixed.keys.file, &mut problems);
            }
            Err(problems)
        }
        Err(mut problems) => {
            if let Some(file) = Config::keys_file_named(path) {
                keys_problems(&file, &mut problems);
            }
            Err(problems)
        }
    };
    // The trust store `serve` loads first (the environment's, as the SQLite path is).
    let trust = crate::upstream::check_trust_store().err().map(|m| {
        crate::config::Problem::new(&path.display().to_string(), None, "SSL_CERT_FILE", m)
    });
    let checked = match (checked, trust) {
        (checked, None) => checked,
        (Ok(_), Some(t)) => Err(crate::config::Problems::one(t)),
        (Err(mut problems), Some(t)) => {
            problems.push(t);
            Err(problems)
        }
    };
    match checked {
        Ok(live) => {
            println!(
                "{}: ok ({} pools, {} models, {} keys)",
                path.display(),
                live.snapshot().config.pools.len(),
                live.snapshot().config.models.len(),
                live.snapshot().keys.len()
            );
            ExitCode::SUCCESS
        }
        Err(p) => {
            eprintln!("{p}");
            ExitCode::from(1)
        }
    }
}

/// `sk-` + 48 url-safe characters (36 random bytes), and the entry to paste.
pub fn new_key(id: &str) -> String {
    let secret = crate::config::keys::new_secret();
    // The id as a TOML string (quotes and escapes), so any id gives a valid entry.
    let id = toml::Value::String(id.to_string());
    format!(
        "{secret}\n\n[[keys]]\nid = {id}\nsecret_sha256 = \"{}\"\n",
        hex::encode(sha256(secret.as_bytes()))
    )
}

/// `key new --append FILE`: the entry goes into the keys file through the one keys-file
/// writer (checked, atomic); only the secret is printed.
fn append_key(id: &str, file: &Path) -> ExitCode {
    let secret = crate::config::keys::new_secret();
    let edit = crate::config::keys_file::Edit::Create {
        id: id.to_string(),
        secret_sha256: hex::encode(sha256(secret.as_bytes())),
        hint: crate::config::keys::secret_hint(&secret),
        fields: serde_json::Map::new(),
    };
    match crate::config::keys_file::apply(file, &edit) {
        Ok(_) => {
            println!("{secret}");
            eprintln!("key '{id}' appended to {}", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            ExitCode::from(1)
        }
    }
}

fn password_hash() -> ExitCode {
    use argon2::PasswordHasher;
    let mut input = String::new();
    if std::io::stdin().read_to_string(&mut input).is_err() {
        eprintln!("cannot read the password from stdin");
        return ExitCode::from(1);
    }
    let password = input.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        eprintln!("empty password");
        return ExitCode::from(1);
    }
    let salt =
        argon2::password_hash::SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    match argon2::Argon2::default().hash_password(password.as_bytes(), &salt) {
        Ok(h) => {
            println!("{h}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot hash: {e}");
            ExitCode::from(1)
        }
    }
}

/// Keeps spend agreeing across a fleet, every `SPEND_SYNC`: each gateway's in-memory spend is
/// raised to the store's totals (what every gateway's records add up to), and Redis's shared
/// spend too (so a Redis that restarted empty is filled again from the records).
struct SpendSync {
    stop: Arc<std::sync::atomic::AtomicBool>,
}

const SPEND_SYNC: std::time::Duration = std::time::Duration::from_secs(2);

impl Drop for SpendSync {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn sync_spend(
    store: Arc<Store>,
    limits: Option<Arc<SharedLimits>>,
    spend: Arc<crate::limit::budget::Spend>,
) -> SpendSync {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sync = SpendSync { stop: stop.clone() };
    let run = move || {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            match store.spend_totals() {
                Ok(totals) => {
                    spend.raise_to(&totals);
                    if let Some(l) = &limits {
                        l.reconcile(&totals);
                    }
                }
                Err(e) => tracing::warn!("spend: reading the store's totals: {e}"),
            }
            std::thread::sleep(SPEND_SYNC);
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("spend-sync".into())
        .spawn(run)
    {
        tracing::error!("spend: starting the sync thread: {e}");
    }
    sync
}

/// `keys import` / `keys export`: between a keys file and the Postgres keys table named by the
/// config's `[storage] postgres`.
fn keys_command(config: &Path, command: KeysCommand) -> ExitCode {
    let c = match Config::load(config) {
        Ok(c) => c,
        Err(p) => {
            eprintln!("{p}");
            return ExitCode::from(2);
        }
    };
    let Some(url) = c.fixed.storage.postgres.as_ref() else {
        eprintln!(
            "{}: keys import/export need [storage] postgres",
            config.display()
        );
        return ExitCode::from(2);
    };
    match command {
        KeysCommand::Export => match crate::store::postgres::keys::export(url.expose()) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("keys export: {e}");
                ExitCode::FAILURE
            }
        },
        KeysCommand::Import { file } => {
            let file = file.unwrap_or_else(|| c.fixed.keys.file.clone());
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("keys import: reading {}: {e}", file.display());
                    return ExitCode::from(2);
                }
            };
            match crate::store::postgres::keys::import(
                url.expose(),
                &text,
                &file.display().to_string(),
            ) {
                Ok(n) => {
                    eprintln!("imported {n} keys from {}", file.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("keys import: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_rust_log_directive_is_left_out_and_the_others_kept_as_written() {
        let (f, bad) = super::log_filter(Some("modelgate=debug,pingora=nonsense"));
        assert_eq!(f.to_string(), "modelgate=debug");
        assert!(bad.is_some());
        let (f, bad) = super::log_filter(Some("warn,modelgate=trace"));
        assert!(bad.is_none());
        assert!(f.to_string().contains("modelgate=trace"), "{f}");
        assert_eq!(super::log_filter(None).0.to_string(), "info");
    }
}
