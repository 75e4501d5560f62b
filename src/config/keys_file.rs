//! Config stage, keys-file edits: the one writer of the keys file (the console's create, edit,
//! disable, delete and rotate go through here). Edits are made with `toml_edit`, so comments,
//! order and layout stay as the operator wrote them; the new text is checked by the same parser
//! the hot reload uses before anything is written, then written atomically (a temp file in the
//! same folder, fsync, rename). The reload then applies it: the file stays the one source of
//! truth. Secrets never reach the file in clear: only their SHA-256 and a hint.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use serde_json::{Map, Value};
use toml_edit::{Array, ArrayOfTables, DocumentMut, Item, Table};

use super::keys::KeyTable;

/// Fields the console may set, as in the keys file (`id` and the secret are set apart).
pub const EDITABLE: [&str; 8] = [
    "models",
    "endpoints",
    "rpm",
    "tpm",
    "max_concurrent",
    "budget",
    "disabled",
    "expires_at",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditError {
    /// No key with this id.
    NotFound(String),
    /// A key with this id exists already.
    Exists(String),
    /// The edit would make the file invalid (the message names the field).
    Invalid(String),
    /// The file could not be read or written.
    Io(String),
}

impl std::fmt::Display for EditError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EditError::NotFound(id) => write!(f, "no key with id '{id}'"),
            EditError::Exists(id) => write!(f, "a key with id '{id}' exists already"),
            EditError::Invalid(m) | EditError::Io(m) => f.write_str(m),
        }
    }
}

/// One change to the keys file.
#[derive(Debug, Clone)]
pub enum Edit {
    /// A new `[[keys]]` entry with these fields (checked against `EDITABLE`).
    Create {
        id: String,
        secret_sha256: String,
        hint: String,
        fields: Map<String, Value>,
    },
    /// Sets the given fields; a JSON `null` removes an optional one.
    Update {
        id: String,
        fields: Map<String, Value>,
    },
    Delete {
        id: String,
    },
    /// A new secret for the same key (the old one stops working at the reload).
    Rotate {
        id: String,
        secret_sha256: String,
        hint: String,
    },
}

/// Edits are read-modify-write of one file: one at a time.
static EDITING: Mutex<()> = Mutex::new(());

/// Applies `edit` to the keys file at `path`; nothing is written unless the result is valid.
/// Returns the table the new file holds, for the caller to put in force at once (the file
/// is known to be whole, so the reload's guard against half-written files does not apply:
/// deleting the last key must take effect too).
pub fn apply(path: &Path, edit: &Edit) -> Result<KeyTable, EditError> {
    let _one = EDITING.lock().unwrap_or_else(|e| e.into_inner());
    let text = std::fs::read_to_string(path)
        .map_err(|e| EditError::Io(format!("reading {}: {e}", path.display())))?;
    let new_text = edit_text(&text, edit)?;
    // The problem names the file by its name only: the console shows it to the signed-in
    // user, who has no business with the server's directories.
    let name = path
        .file_name()
        .map_or_else(|| "keys file".into(), |n| n.to_string_lossy());
    let table = KeyTable::parse(&name, &new_text).map_err(|p| EditError::Invalid(p.to_string()))?;
    write_atomically(path, &new_text)?;
    Ok(table)
}

/// The file's text after `edit` (not yet validated).
pub fn edit_text(text: &str, edit: &Edit) -> Result<String, EditError> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| EditError::Invalid(format!("the keys file does not parse: {e}")))?;
    if !doc.contains_key("keys") {
        doc.insert("keys", Item::ArrayOfTables(ArrayOfTables::new()));
    }
    let keys = doc
        .get_mut("keys")
        .and_then(Item::as_array_of_tables_mut)
        .ok_or_else(|| EditError::Invalid("`keys` is not an array of tables".into()))?;
    let find = |keys: &ArrayOfTables, id: &str| {
        keys.iter()
            .position(|t| t.get("id").and_then(Item::as_str) == Some(id))
    };
    match edit {
        Edit::Create {
            id,
            secret_sha256,
            hint,
            fields,
        } => {
            if find(keys, id).is_some() {
                return Err(EditError::Exists(id.clone()));
            }
            let mut t = Table::new();
            t.insert("id", toml_edit::value(id.as_str()));
            t.insert("secret_sha256", toml_edit::value(secret_sha256.as_str()));
            t.insert("secret_hint", toml_edit::value(hint.as_str()));
            set_fields(&mut t, fields)?;
            keys.push(t);
        }
        Edit::Update { id, fields } => {
            let i = find(keys, id).ok_or_else(|| EditError::NotFound(id.clone()))?;
            let t = keys
                .get_mut(i)
                .ok_or_else(|| EditError::NotFound(id.clone()))?;
            set_fields(t, fields)?;
        }
        Edit::Delete { id } => {
            let i = find(keys, id).ok_or_else(|| EditError::NotFound(id.clone()))?;
            keys.remove(i);
        }
        Edit::Rotate {
            id,
            secret_sha256,
            hint,
        } => {
            let i = find(keys, id).ok_or_else(|| EditError::NotFound(id.clone()))?;
            let t = keys
                .get_mut(i)
                .ok_or_else(|| EditError::NotFound(id.clone()))?;
            t.remove("secret");
            t.insert("secret_sha256", toml_edit::value(secret_sha256.as_str()));
            t.insert("secret_hint", toml_edit::value(hint.as_str()));
        }
    }
    Ok(doc.to_string())
}

fn set_fields(t: &mut Table, fields: &Map<String, Value>) -> Result<(), EditError> {
    for (name, v) in fields {
        if !EDITABLE.contains(&name.as_str()) {
            return Err(EditError::Invalid(format!(
                "'{name}' cannot be set here; the fields are: {}",
                EDITABLE.join(", ")
            )));
        }
        if v.is_null() {
            t.remove(name);
            continue;
        }
        let value = to_toml(name, v)?;
        // Keep the position (and any comment) of a field that is already there.
        match t.get_mut(name) {
            Some(Item::Value(old)) => {
                let decor = old.decor().clone();
                *old = value;
                *old.decor_mut() = decor;
            }
            _ => {
                t.insert(name, Item::Value(value));
            }
        }
    }
    Ok(())
}

fn to_toml(name: &str, v: &Value) -> Result<toml_edit::Value, EditError> {
    let bad = || EditError::Invalid(format!("'{name}' has the wrong type: {v}"));
    Ok(match v {
        Value::Bool(b) => (*b).into(),
        // A budget is a number of credits: always a float, so `10` reads back as 10.0.
        Value::Number(n) if name == "budget" => n.as_f64().ok_or_else(bad)?.into(),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i.into(),
            None => return Err(bad()),
        },
        Value::String(s) => s.as_str().into(),
        Value::Array(items) => {
            let mut a = Array::new();
            for item in items {
                a.push(item.as_str().ok_or_else(bad)?);
            }
            toml_edit::Value::Array(a)
        }
        Value::Null | Value::Object(_) => return Err(bad()),
    })
}

fn write_atomically(path: &Path, text: &str) -> Result<(), EditError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io =
        |what: &str, e: std::io::Error| EditError::Io(format!("{what} {}: {e}", path.display()));
    // A symlinked keys file (Kubernetes) is replaced where the link points.
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = target
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "keys.toml".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        // Private until it has the original's mode: a 0600 keys file must not become 0644.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io("creating a temp file beside", e))?;
        if let Ok(meta) = std::fs::metadata(&target) {
            f.set_permissions(meta.permissions())
                .map_err(|e| io("setting the mode of a temp file beside", e))?;
        }
        f.write_all(text.as_bytes())
            .map_err(|e| io("writing a temp file beside", e))?;
        f.sync_all()
            .map_err(|e| io("syncing a temp file beside", e))?;
        std::fs::rename(&tmp, &target).map_err(|e| io("replacing", e))?;
        // The rename itself is durable once the folder is synced.
        if let Ok(d) = std::fs::File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FILE: &str = r#"# Keys of the demo.
# Edited by hand and by the console.

[[keys]]
id = "demo"   # the README's key
secret = "sk-demo-modelgate-local-only"
rpm = 600     # per minute

# A partner; keep the budget low.
[[keys]]
id = "partner"
secret_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
budget = 5.0
"#;

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn comments_and_layout_survive_an_edit() {
        let out = edit_text(
            FILE,
            &Edit::Update {
                id: "demo".into(),
                fields: fields(serde_json::json!({"rpm": 5, "models": ["echo-*"], "tpm": null})),
            },
        )
        .unwrap();
        assert!(out.starts_with("# Keys of the demo.\n# Edited by hand and by the console.\n"));
        assert!(out.contains("rpm = 5     # per minute"), "{out}");
        assert!(out.contains("id = \"demo\"   # the README's key"));
        assert!(out.contains("# A partner; keep the budget low.\n[[keys]]\nid = \"partner\""));
        assert!(out.contains("models = [\"echo-*\"]"));
        KeyTable::parse("k.toml", &out).unwrap();
    }

    #[test]
    fn create_rotate_delete_and_refusals() {
        let sha = "1".repeat(64);
        let create = Edit::Create {
            id: "new".into(),
            secret_sha256: sha.clone(),
            hint: "sk-abc…wxyz".into(),
            fields: fields(serde_json::json!({"budget": 10, "endpoints": ["chat"]})),
        };
        let out = edit_text(FILE, &create).unwrap();
        let table = KeyTable::parse("k.toml", &out).unwrap();
        assert_eq!(table.len(), 3);
        assert!(out.contains("budget = 10.0"), "{out}");
        assert_eq!(
            edit_text(&out, &create).unwrap_err(),
            EditError::Exists("new".into())
        );
        let rotated = edit_text(
            FILE,
            &Edit::Rotate {
                id: "demo".into(),
                secret_sha256: sha,
                hint: "h".into(),
            },
        )
        .unwrap();
        assert!(!rotated.contains("sk-demo-modelgate-local-only"));
        KeyTable::parse("k.toml", &rotated).unwrap();
        let gone = edit_text(
            FILE,
            &Edit::Delete {
                id: "partner".into(),
            },
        )
        .unwrap();
        assert!(!gone.contains("partner"));
        assert!(gone.contains("# Keys of the demo."));
        assert_eq!(
            edit_text(
                FILE,
                &Edit::Delete {
                    id: "nobody".into()
                }
            )
            .unwrap_err(),
            EditError::NotFound("nobody".into())
        );
        for bad in [
            serde_json::json!({"secret": "sk-x"}),
            serde_json::json!({"id": "other"}),
            serde_json::json!({"rpm": "fast"}),
        ] {
            let r = edit_text(
                FILE,
                &Edit::Update {
                    id: "demo".into(),
                    fields: fields(bad.clone()),
                },
            )
            .and_then(|t| {
                KeyTable::parse("k.toml", &t)
                    .map_err(|p| EditError::Invalid(p.to_string()))
                    .map(|_| t)
            });
            assert!(r.is_err(), "{bad}");
        }
    }

    #[test]
    fn an_invalid_edit_leaves_the_file_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.toml");
        std::fs::write(&path, FILE).unwrap();
        let e = apply(
            &path,
            &Edit::Update {
                id: "demo".into(),
                fields: fields(serde_json::json!({"endpoints": ["nope"]})),
            },
        )
        .unwrap_err();
        assert!(
            matches!(e, EditError::Invalid(ref m) if m.contains("endpoints")),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), FILE);
        apply(
            &path,
            &Edit::Update {
                id: "demo".into(),
                fields: fields(serde_json::json!({"disabled": true})),
            },
        )
        .unwrap();
        let table = KeyTable::load(&path).unwrap();
        assert!(table.keys().any(|k| k.id == "demo" && k.disabled));
        let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let last = apply(&path, &Edit::Delete { id: "demo".into() }).unwrap();
        assert_eq!(last.len(), 1);
        let none = apply(
            &path,
            &Edit::Delete {
                id: "partner".into(),
            },
        )
        .unwrap();
        assert!(
            none.is_empty(),
            "deleting the last key yields a table with none, to put in force"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the file keeps its mode");
    }
}
