//! Hot reload, a background service: a change to the keys file is picked up within 2 s, with no
//! restart, and so is a change to the config file's pools, models, prices and fallbacks (the
//! router) and its `[console]`. Every other section takes a restart: a reload that changed one
//! names it in a warning. Triggers: the `notify` watcher on the file's folder (so replacement by
//! rename and Kubernetes-style symlink swaps are seen), SIGHUP, and a 1 s check of the file's
//! identity (mtime, length, inode) in case an event is missed. A reload prepares the whole new
//! table first and then swaps it in one store; a file that does not parse or validate is
//! rejected whole, the previous keys stay in force, and the error is logged and counted.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use notify::Watcher;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use super::live::Live;
use crate::config::keys::KeyTable;
use crate::config::{Config, Fingerprint, Problem, Problems, fingerprint};

pub struct KeysReloader {
    live: Arc<Live>,
    metrics: Arc<crate::ops::metrics::Metrics>,
    path: PathBuf,
    /// The config file, whose router part is reloaded too.
    config: PathBuf,
    /// Both files as they were when the gateway loaded them (taken before any listener is up,
    /// so a change made once the gateway answers is never mistaken for the loaded version).
    loaded: (Fingerprint, Fingerprint),
    /// The config file's sections as the gateway started with them, to name those a reload
    /// changed that only a restart puts in force.
    started_with: Option<toml::Table>,
}

/// The config file's sections a reload puts in force; every other one takes a restart.
const LIVE_SECTIONS: [&str; 4] = ["pools", "models", "routing", "console"];

fn sections(path: &Path) -> Option<toml::Table> {
    std::fs::read_to_string(path).ok()?.parse().ok()
}

impl KeysReloader {
    pub fn new(live: Arc<Live>, metrics: Arc<crate::ops::metrics::Metrics>) -> KeysReloader {
        let path = live.fixed.keys.file.clone();
        let config = live.fixed.path.clone();
        let loaded = (fingerprint(&path), fingerprint(&config));
        let started_with = sections(&config);
        KeysReloader {
            live,
            metrics,
            path,
            config,
            loaded,
            started_with,
        }
    }

    /// The sections of the file now that differ from those the gateway started with and that
    /// only a restart puts in force.
    fn awaiting_restart(&self) -> Vec<String> {
        let (Some(before), Some(now)) = (self.started_with.as_ref(), sections(&self.config)) else {
            return Vec::new();
        };
        let mut names: Vec<String> = before
            .keys()
            .chain(now.keys())
            .filter(|k| !LIVE_SECTIONS.contains(&k.as_str()))
            .filter(|k| before.get(*k) != now.get(*k))
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Reads the config file, builds its router (upstream health carried over) and swaps it
    /// in; a file that does not load keeps the router in force. Returns the models in force.
    pub fn reload_router(&self) -> Result<usize, Problems> {
        let config = Config::load(&self.config)?;
        let router = super::Router::build_after(
            &config.live,
            &self.config,
            Some(&self.live.snapshot().router),
        )?;
        let n = router.ordered.len();
        crate::upstream::warm_tls(router.pools.iter().map(|p| &p.cfg)).map_err(|m| {
            Problems::one(Problem::new(
                &self.config.display().to_string(),
                None,
                "pools",
                m,
            ))
        })?;
        self.live.set_router(router, config.live);
        Ok(n)
    }

    fn reload_router_and_report(&self, why: &str) {
        match self.reload_router() {
            Ok(n) => {
                tracing::info!(models = n, file = %self.config.display(), "pools, models and the console reloaded ({why})");
                self.metrics.config_reloads.inc();
                let waiting = self.awaiting_restart();
                if !waiting.is_empty() {
                    tracing::warn!(
                        sections = %waiting.join(", "),
                        "changed in the config file, in force only after a restart"
                    );
                }
            }
            Err(problems) => {
                for p in &problems.0 {
                    tracing::error!(
                        "config file rejected, the pools and models in force stay: {p}"
                    );
                }
                self.metrics.config_reload_errors.inc();
            }
        }
    }

    /// Loads the keys file and swaps it in, or leaves the keys in force and says why.
    /// `Ok(None)`: the file changed while it was read (a write in progress); try again later.
    pub fn reload(&self) -> Result<Option<usize>, Problems> {
        let before = fingerprint(&self.path);
        let table = KeyTable::load(&self.path)?;
        if fingerprint(&self.path) != before {
            return Ok(None);
        }
        if table.is_empty() && !self.live.snapshot().keys.is_empty() {
            // Most likely a file caught between truncate and write. To revoke every key on
            // purpose, set `disabled = true` on them.
            let file = self.path.display().to_string();
            return Err(Problems::one(Problem::new(
                &file,
                None,
                "keys",
                "the file has no keys while keys are in force; treated as a partial write",
            )));
        }
        let n = table.len();
        self.live.set_keys(table);
        Ok(Some(n))
    }

    /// Returns false when the file was mid-write and should be looked at again.
    fn reload_and_report(&self, why: &str) -> bool {
        match self.reload() {
            Ok(None) => return false,
            Ok(Some(n)) => {
                tracing::info!(keys = n, file = %self.path.display(), "keys reloaded ({why})");
                self.metrics.keys.set(n as i64);
                self.metrics.keys_reloads.inc();
            }
            Err(problems) => {
                for p in &problems.0 {
                    tracing::error!("keys file rejected, previous keys stay in force: {p}");
                }
                self.metrics.keys_reload_errors.inc();
            }
        }
        true
    }
}

#[async_trait]
impl BackgroundService for KeysReloader {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<()>();
        let folder = |p: &Path| {
            p.parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."))
        };
        let (keys_folder, config_folder) = (folder(&self.path), folder(&self.config));
        let names: Vec<OsString> = [&self.path, &self.config]
            .iter()
            .filter_map(|p| p.file_name().map(OsString::from))
            .collect();
        // Kept alive for the life of the service; without it the checks below still run.
        let _watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event
                .as_ref()
                .map_or(true, |e| touches(e, &names) || swaps_a_link(e))
            {
                let _ = tx.send(());
            }
        })
        .and_then(|mut w| {
            w.watch(&keys_folder, notify::RecursiveMode::NonRecursive)?;
            if config_folder != keys_folder {
                w.watch(&config_folder, notify::RecursiveMode::NonRecursive)?;
            }
            Ok(w)
        })
        .map_err(|e| {
            tracing::warn!(
                "cannot watch {}: {e}; checking every second instead",
                self.path.display()
            )
        })
        .ok();
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| tracing::warn!("cannot listen for SIGHUP: {e}"))
            .ok();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let (mut seen, mut seen_config) = self.loaded.clone();
        self.metrics
            .keys
            .set(self.live.snapshot().keys.len() as i64);
        loop {
            let forced = tokio::select! {
                _ = shutdown.changed() => return,
                Some(()) = events.recv() => {
                    // Editors and swaps come as bursts of events: let the burst finish.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    while events.try_recv().is_ok() {}
                    false
                }
                Some(()) = async { match hangup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
                _ = tick.tick() => false,
            };
            let why = if forced { "SIGHUP" } else { "file changed" };
            // Keys kept in Postgres are followed by `store::postgres::keys::follow`, not here.
            let now = fingerprint(&self.path);
            if !self.live.fixed.keys.in_postgres
                && (forced || now != seen)
                && self.reload_and_report(why)
            {
                seen = now;
            }
            let now = fingerprint(&self.config);
            if forced || now != seen_config {
                seen_config = now;
                self.reload_router_and_report(why);
            }
        }
    }
}

/// Whether a change in a watched folder may concern the keys or config file: an event that
/// names one of them (written in place, or renamed over it), or names nothing (a rescan). The
/// folder may hold other busy files (the usage database and its WAL beside the keys file):
/// their writes do not wake the reloader.
fn touches(event: &notify::Event, names: &[OsString]) -> bool {
    event.paths.is_empty()
        || event
            .paths
            .iter()
            .any(|p| p.file_name().is_some_and(|n| names.iter().any(|m| m == n)))
}

/// Whether a change in a watched folder put a symbolic link in place, as a Kubernetes volume
/// update does: it renames a new `..data` link over the old one, and the keys file, a link
/// through `..data`, then names other contents without an event naming it. Such a swap wakes the
/// reloader at once rather than at its next check of the file's identity; a wake that changed
/// nothing costs one look at the file. Writes (the usage database's) are not looked at.
fn swaps_a_link(event: &notify::Event) -> bool {
    use notify::event::{EventKind, ModifyKind};
    matches!(
        event.kind,
        EventKind::Create(_) | EventKind::Modify(ModifyKind::Name(_))
    ) && event.paths.iter().any(|p| {
        p.symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink())
    })
}

#[cfg(test)]
mod watch_tests {
    use super::*;
    use notify::event::{EventKind, ModifyKind, RenameMode};

    #[test]
    fn only_changes_naming_the_keys_or_config_file_wake_the_reloader() {
        let names = vec![
            OsString::from("keys.toml"),
            OsString::from("modelgate.toml"),
        ];
        let event = |kind, paths: &[&str]| {
            let mut e = notify::Event::new(kind);
            for p in paths {
                e = e.add_path(PathBuf::from(p));
            }
            e
        };
        let write = EventKind::Modify(ModifyKind::Any);
        assert!(touches(&event(write, &["/etc/mg/keys.toml"]), &names));
        assert!(touches(&event(write, &["/etc/mg/modelgate.toml"]), &names));
        // An editor's or a script's atomic save: a temporary file renamed over the keys file.
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::Both));
        assert!(touches(
            &event(rename, &["/etc/mg/.keys.tmp", "/etc/mg/keys.toml"]),
            &names
        ));
        assert!(touches(&event(EventKind::Any, &[]), &names));
        // The usage database beside it, written on every batch.
        assert!(!touches(&event(write, &["/etc/mg/usage.db-wal"]), &names));
        assert!(!touches(&event(write, &["/etc/mg/usage.db"]), &names));
    }

    #[test]
    fn a_link_renamed_into_place_wakes_the_reloader_and_a_write_does_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("..v2")).expect("mkdir");
        let link = dir.path().join("..data");
        std::os::unix::fs::symlink("..v2", &link).expect("symlink");
        let file = dir.path().join("usage.db");
        std::fs::write(&file, b"").expect("write");
        let event = |kind, p: &Path| notify::Event::new(kind).add_path(p.to_path_buf());
        let renamed = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(swaps_a_link(&event(renamed, &link)));
        assert!(swaps_a_link(&event(
            EventKind::Create(notify::event::CreateKind::Any),
            &link
        )));
        assert!(!swaps_a_link(&event(renamed, &file)), "not a link");
        let write = EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any));
        assert!(!swaps_a_link(&event(write, &link)), "not a swap");
        assert!(!swaps_a_link(&event(renamed, &dir.path().join("gone"))));
    }
}
