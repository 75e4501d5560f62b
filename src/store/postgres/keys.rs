//! Store stage, keys kept in Postgres (`[keys] source = "postgres"`): one row per key in the
//! store's `keys` table, holding the key's `[[keys]]` table as a keys file writes it (only the
//! secret's SHA-256 and hint, never the secret). Each row is checked by the keys file's parser
//! (a row that does not pass keeps its version in force, see `table_from`); the console's edits go through the same editor, in a transaction that
//! locks the table, so gateways editing at once never lose each other's changes. A trigger
//! notifies every gateway of any change (also one made by hand in SQL); each reloads within
//! moments, and checks the whole table every `FULL_CHECK` in case a notification was missed.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;
use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use crate::config::keys::{KeyTable, secret_hint, sha256};
use crate::config::keys_file::{Edit, EditError, edit_text};
use crate::config::{Problem, Problems};

/// The name problems and logs give the table.
pub const SOURCE: &str = "postgres keys table";

/// How often a gateway reads the whole table even without a notification.
const FULL_CHECK: Duration = Duration::from_secs(30);

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn problem(m: String) -> Problems {
    Problems::one(Problem::new(SOURCE, None, "keys", m))
}

/// The table as one keys file's text (keys in id order).
fn text_of(c: &mut impl postgres::GenericClient) -> Result<String, String> {
    let rows = c
        .query("SELECT entry FROM keys ORDER BY id", &[])
        .map_err(|e| format!("reading the keys table: {e}"))?;
    let mut text = String::new();
    for r in rows {
        let entry: String = r.try_get(0).map_err(|e| format!("reading a key: {e}"))?;
        text.push_str(&entry);
        text.push('\n');
    }
    Ok(text)
}

/// The table's rows, (id, entry), in id order.
fn rows_of(c: &mut impl postgres::GenericClient) -> Result<Vec<(String, String)>, String> {
    let rows = c
        .query("SELECT id, entry FROM keys ORDER BY id", &[])
        .map_err(|e| format!("reading the keys table: {e}"))?;
    rows.iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, postgres::Error>>()
        .map_err(|e| format!("reading a key: {e}"))
}

/// The keys in force from the table's rows, each row checked on its own as a keys file is (its
/// entry one key whose id is the row's, its secret held by no row before it). A row that does
/// not pass keeps the version of it last in force (`good`), or stays out when it has none: one
/// bad row, written by hand in SQL, neither blocks the other rows' changes (a revocation among
/// them) nor stops a gateway's start. Returns the table, the rows it was made of, and what was
/// wrong.
fn table_from(
    rows: &[(String, String)],
    good: &BTreeMap<String, String>,
) -> Result<Taken, Problems> {
    let mut used = BTreeMap::new();
    let mut wrong = Vec::new();
    let mut secrets: HashMap<[u8; 32], String> = HashMap::new();
    for (id, entry) in rows {
        let taken = match check_row(id, entry, &secrets) {
            Ok(hashes) => Some((entry, hashes)),
            Err(problem) => {
                wrong.push(problem);
                good.get(id)
                    .and_then(|before| Some((before, check_row(id, before, &secrets).ok()?)))
            }
        };
        if let Some((entry, hashes)) = taken {
            secrets.extend(hashes.into_iter().map(|h| (h, id.clone())));
            used.insert(id.clone(), entry.clone());
        }
    }
    let text: String = used.values().map(|e| format!("{e}\n")).collect();
    let table = KeyTable::parse(SOURCE, &text)?;
    Ok(Taken { table, used, wrong })
}

/// One row checked alone; its secret's SHA-256 when it passes.
fn check_row(
    id: &str,
    entry: &str,
    secrets: &HashMap<[u8; 32], String>,
) -> Result<Vec<[u8; 32]>, Problem> {
    let source = format!("{SOURCE}, key '{id}'");
    let wrong = |field: &str, m: String| Problem::new(&source, None, field, m);
    let table = KeyTable::parse(&source, entry).map_err(|p| {
        let first = p.0.into_iter().next();
        first.unwrap_or_else(|| wrong("keys", "does not parse".into()))
    })?;
    match entries(entry) {
        Ok(e) if e.len() == 1 && e.contains_key(id) => {}
        _ => {
            return Err(wrong(
                "id",
                "the entry must be one [[keys]] table whose id is the row's".into(),
            ));
        }
    }
    let hashes: Vec<[u8; 32]> = table.hashes().copied().collect();
    if let Some(other) = hashes.iter().find_map(|h| secrets.get(h)) {
        return Err(wrong(
            "secret_sha256",
            format!("the same secret as key '{other}'"),
        ));
    }
    Ok(hashes)
}

/// The keys a read of the table puts in force (see `table_from`).
struct Taken {
    table: KeyTable,
    /// The rows it was made of, by id.
    used: BTreeMap<String, String>,
    /// The rows not taken, and why.
    wrong: Vec<Problem>,
}

/// Every key in the table (see `table_from`); a row that does not pass is logged and left out.
pub fn load(url: &str) -> Result<KeyTable, Problems> {
    let mut c = super::migrated_client(url).map_err(problem)?;
    let rows = rows_of(&mut c).map_err(problem)?;
    let Taken { table, wrong, .. } = table_from(&rows, &BTreeMap::new())?;
    for p in &wrong {
        tracing::error!("keys: a row left out: {p}");
    }
    Ok(table)
}

/// id → its `[[keys]]` table as text, for each key of a keys document.
fn entries(doc_text: &str) -> Result<BTreeMap<String, String>, String> {
    let doc: DocumentMut = doc_text
        .parse()
        .map_err(|e| format!("the keys do not parse: {e}"))?;
    let mut out = BTreeMap::new();
    let Some(keys) = doc.get("keys").and_then(Item::as_array_of_tables) else {
        return Ok(out);
    };
    for t in keys.iter() {
        let id = t
            .get("id")
            .and_then(Item::as_str)
            .ok_or("a key without an id")?
            .to_string();
        let mut one = DocumentMut::new();
        let mut arr = ArrayOfTables::new();
        arr.push(t.clone());
        one.insert("keys", Item::ArrayOfTables(arr));
        out.insert(id, one.to_string().trim().to_string());
    }
    Ok(out)
}

/// Writes the rows that differ between `old` and `new` (inserts, updates, deletes).
fn write_diff(
    tx: &mut postgres::Transaction<'_>,
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Result<(), String> {
    let err = |e: postgres::Error| format!("writing the keys table: {e}");
    let now = now_ms();
    for (id, entry) in new {
        if old.get(id) != Some(entry) {
            tx.execute(
                "INSERT INTO keys (id, entry, updated_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET entry = excluded.entry, \
                 updated_ms = excluded.updated_ms",
                &[id, entry, &now],
            )
            .map_err(err)?;
        }
    }
    for id in old.keys().filter(|id| !new.contains_key(*id)) {
        tx.execute("DELETE FROM keys WHERE id = $1", &[id])
            .map_err(err)?;
    }
    Ok(())
}

/// Applies a console edit to the table: nothing is written unless the keys it touches are
/// valid after it. It is made on the rows that pass (`table_from`), so a bad row elsewhere
/// blocks no edit (a bad row itself can be deleted, or replaced by creating its id). Returns
/// the table now in force.
pub fn apply(url: &str, edit: &Edit) -> Result<KeyTable, EditError> {
    let io = |m: String| EditError::Io(m);
    let mut c = super::migrated_client(url).map_err(io)?;
    let mut tx = c.transaction().map_err(|e| io(format!("begin: {e}")))?;
    // One editor at a time across the fleet; readers are not blocked.
    tx.batch_execute("LOCK TABLE keys IN EXCLUSIVE MODE")
        .map_err(|e| io(format!("locking the keys table: {e}")))?;
    let rows = rows_of(&mut tx).map_err(io)?;
    let current: BTreeMap<String, String> = rows.iter().cloned().collect();
    let valid = table_from(&rows, &BTreeMap::new())
        .map_err(|p| EditError::Invalid(p.to_string()))?
        .used;
    let mut new = current.clone();
    match edit {
        Edit::Delete { id } if current.contains_key(id) && !valid.contains_key(id) => {
            new.remove(id);
        }
        _ => {
            let text: String = valid.values().map(|e| format!("{e}\n")).collect();
            let new_text = edit_text(&text, edit)?;
            let before = entries(&text).map_err(EditError::Invalid)?;
            let after = entries(&new_text).map_err(EditError::Invalid)?;
            for (id, entry) in &after {
                if before.get(id) != Some(entry) {
                    new.insert(id.clone(), entry.clone());
                }
            }
            for id in before.keys().filter(|id| !after.contains_key(*id)) {
                new.remove(id);
            }
        }
    }
    let taken = taken_with(&new, &current, &valid).map_err(EditError::Invalid)?;
    write_diff(&mut tx, &current, &new).map_err(io)?;
    tx.commit().map_err(|e| io(format!("commit: {e}")))?;
    Ok(taken.table)
}

/// The rows `new` put in force, if every row that differs from `current` passes.
fn taken_with(
    new: &BTreeMap<String, String>,
    current: &BTreeMap<String, String>,
    valid: &BTreeMap<String, String>,
) -> Result<Taken, String> {
    let rows: Vec<(String, String)> = new.iter().map(|(i, e)| (i.clone(), e.clone())).collect();
    let taken = table_from(&rows, valid).map_err(|p| p.to_string())?;
    for (id, entry) in new {
        if current.get(id) != Some(entry) && taken.used.get(id) != Some(entry) {
            let why = taken
                .wrong
                .iter()
                .find(|p| p.file.ends_with(&format!("'{id}'")))
                .map_or_else(|| format!("key '{id}' is not valid"), ToString::to_string);
            return Err(why);
        }
    }
    Ok(taken)
}

/// A keys file's text with every secret in clear replaced by its SHA-256 and hint.
fn without_secrets(text: &str) -> Result<String, String> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| format!("the keys file does not parse: {e}"))?;
    if let Some(keys) = doc.get_mut("keys").and_then(Item::as_array_of_tables_mut) {
        for t in keys.iter_mut() {
            hash_secret(t);
        }
    }
    Ok(doc.to_string())
}

fn hash_secret(t: &mut Table) {
    let Some(secret) = t.get("secret").and_then(Item::as_str).map(str::to_string) else {
        return;
    };
    // `env:NAME` secrets stay as they are: the table holds what the file held.
    if secret.starts_with("env:") {
        return;
    }
    t.remove("secret");
    t.insert(
        "secret_sha256",
        toml_edit::value(hex::encode(sha256(secret.as_bytes()))),
    );
    t.insert("secret_hint", toml_edit::value(secret_hint(&secret)));
}

/// `modelgate keys import`: every key of the file into the table (a key with the same id is
/// replaced; other keys stay), its secret stored as SHA-256 and hint only. Returns how many.
pub fn import(url: &str, file_text: &str, file_name: &str) -> Result<usize, String> {
    let text = without_secrets(file_text)?;
    KeyTable::parse(file_name, &text).map_err(|p| p.to_string())?;
    let incoming = entries(&text)?;
    let mut c = super::migrated_client(url)?;
    let mut tx = c.transaction().map_err(|e| format!("begin: {e}"))?;
    tx.batch_execute("LOCK TABLE keys IN EXCLUSIVE MODE")
        .map_err(|e| format!("locking the keys table: {e}"))?;
    let rows = rows_of(&mut tx)?;
    let old: BTreeMap<String, String> = rows.iter().cloned().collect();
    let valid = table_from(&rows, &BTreeMap::new())
        .map_err(|p| p.to_string())?
        .used;
    let mut new = old.clone();
    new.extend(incoming.clone());
    taken_with(&new, &old, &valid)?;
    write_diff(&mut tx, &old, &new)?;
    tx.commit().map_err(|e| format!("commit: {e}"))?;
    Ok(incoming.len())
}

/// `modelgate keys export`: the table as a keys file.
pub fn export(url: &str) -> Result<String, String> {
    let mut c = super::migrated_client(url)?;
    text_of(&mut c)
}

/// Follows the table: LISTENs for its notifications on a connection of its own and reloads
/// on each (and every `FULL_CHECK`), putting a changed table in force, each row that does not
/// validate logged, counted and kept at its version in force (`table_from`). Runs on
/// its own thread for the life of the process; reconnects when the connection is lost.
pub fn follow(
    url: String,
    metrics: std::sync::Arc<crate::ops::metrics::Metrics>,
    put_in_force: impl Fn(KeyTable) + Send + 'static,
) {
    let run = move || {
        let mut followed = Followed::default();
        loop {
            let mut c = match super::migrated_client(&url) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("keys: {e}; trying again in a second");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            if let Err(e) = c.batch_execute("LISTEN modelgate_keys") {
                tracing::warn!("keys: LISTEN: {e}");
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            // A change may have come while no connection listened: read the table now.
            if follow_once(&mut c, &put_in_force, &metrics, &mut followed).is_err() {
                continue;
            }
            loop {
                let woke = {
                    let mut n = c.notifications();
                    let first = n.timeout_iter(FULL_CHECK).next().map(drop);
                    // A burst of changes: take them all, then read once.
                    while let Ok(Some(_)) = n.iter().next() {}
                    first
                };
                if let Err(e) = woke {
                    tracing::warn!("keys: the notification connection: {e}; reconnecting");
                    break;
                }
                if follow_once(&mut c, &put_in_force, &metrics, &mut followed).is_err() {
                    break;
                }
            }
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("keys-follow".into())
        .spawn(run)
    {
        tracing::error!("keys: starting the follower: {e}");
    }
}

/// What the follower last read and put in force.
#[derive(Default)]
struct Followed {
    rows: Vec<(String, String)>,
    /// The rows the keys in force were made of (a bad row's previous version among them).
    good: BTreeMap<String, String>,
}

/// Reads the table and puts it in force when it changed. Err: the connection failed.
fn follow_once(
    c: &mut Client,
    put_in_force: &impl Fn(KeyTable),
    metrics: &crate::ops::metrics::Metrics,
    followed: &mut Followed,
) -> Result<(), ()> {
    let rows = match rows_of(c) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!("keys: {e}");
            return Err(());
        }
    };
    if rows == followed.rows {
        return Ok(());
    }
    match table_from(&rows, &followed.good) {
        Ok(Taken { table, used, wrong }) => {
            for p in &wrong {
                tracing::error!("keys: a row not taken, its version in force (if any) stays: {p}");
            }
            let n = table.len();
            put_in_force(table);
            followed.good = used;
            tracing::info!(keys = n, "keys reloaded from the postgres keys table");
            metrics.keys.set(n as i64);
            metrics.keys_reloads.inc();
            if !wrong.is_empty() {
                metrics.keys_reload_errors.inc();
            }
        }
        Err(problems) => {
            for p in &problems.0 {
                tracing::error!("keys table rejected, previous keys stay in force: {p}");
            }
            metrics.keys_reload_errors.inc();
        }
    }
    // Not reported again until it changes.
    followed.rows = rows;
    Ok(())
}
