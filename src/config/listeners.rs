//! `[listeners]`: its raw form as serde reads it, and its check.

use serde::Deserialize;
use toml::Spanned;

use super::*;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListeners {
    pub(super) main: Option<Spanned<String>>,
    pub(super) direct: Option<Spanned<String>>,
    pub(super) admin: Option<Spanned<String>>,
    pub(super) tls: Option<RawListenersTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawListenersTls {
    pub(super) main: Option<Spanned<RawTlsFiles>>,
    pub(super) direct: Option<Spanned<RawTlsFiles>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTlsFiles {
    pub(super) cert: String,
    pub(super) key: String,
}

/// `[listeners]`: the addresses (each its own port), TLS on `main` and `direct`; also the
/// ports taken, for the demo's mock to avoid.
pub(super) fn check(
    raw: &RawListeners,
    src: &Src<'_>,
    p: &mut Problems,
) -> (Listeners, Vec<(&'static str, std::net::SocketAddr)>) {
    let (file, dir) = (src.file, src.dir);
    let at = |s: std::ops::Range<usize>| src.at(s);
    let mut listeners = Listeners::default();
    let mut bound: Vec<(&str, std::net::SocketAddr)> = Vec::new();
    for (field, v, slot) in [
        ("listeners.main", &raw.main, &mut listeners.main),
        ("listeners.direct", &raw.direct, &mut listeners.direct),
        ("listeners.admin", &raw.admin, &mut listeners.admin),
    ] {
        if let Some(v) = v {
            match v.get_ref().parse::<std::net::SocketAddr>() {
                Err(_) => p.push(Problem::new(
                    file,
                    at(v.span()),
                    field,
                    "must be IP:PORT, e.g. 0.0.0.0:8080",
                )),
                // Two listeners on one port cannot both bind.
                Ok(addr) => match bound.iter().find(|(_, b)| one_port(b, &addr)) {
                    Some((other, _)) if addr.port() != 0 => p.push(Problem::new(
                        file,
                        at(v.span()),
                        field,
                        format!("{addr} is also `{other}`'s: each listener needs its own"),
                    )),
                    _ => bound.push((field, addr)),
                },
            }
            *slot = Some(v.get_ref().clone());
        }
    }
    let tls = raw.tls.as_ref();
    for (name, raw_files, on, slot) in [
        (
            "main",
            tls.and_then(|t| t.main.as_ref()),
            listeners.main.is_some(),
            &mut listeners.main_tls,
        ),
        (
            "direct",
            tls.and_then(|t| t.direct.as_ref()),
            listeners.direct.is_some(),
            &mut listeners.direct_tls,
        ),
    ] {
        let Some(raw_files) = raw_files else { continue };
        let field = format!("listeners.tls.{name}");
        let line = at(raw_files.span());
        if !on {
            p.push(Problem::new(
                file,
                line,
                &field,
                format!("there is no `listeners.{name}` to put TLS on"),
            ));
            continue;
        }
        let files = TlsFiles {
            cert: dir.join(&raw_files.get_ref().cert),
            key: dir.join(&raw_files.get_ref().key),
        };
        if let Err(e) = load_tls(&files) {
            p.push(Problem::new(file, line, &field, e));
        }
        *slot = Some(files);
    }
    if listeners.main.is_none() && listeners.direct.is_none() {
        p.push(Problem::new(
            file,
            None,
            "listeners",
            "needs at least `main` or `direct`",
        ));
    }
    (listeners, bound)
}

/// A listener's certificate chain and private key files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A usable pair, and when its certificate expires (Unix seconds).
pub struct Loaded {
    pub key: Arc<CertifiedKey>,
    pub not_after: i64,
}

/// Reads and checks a certificate chain and its key: both parse, the chain is not empty, and
/// the key is the certificate's.
pub fn load_tls(files: &TlsFiles) -> Result<Loaded, String> {
    let chain = read_chain(&files.cert)?;
    let not_after = match x509_parser::parse_x509_certificate(&chain[0]) {
        Ok((_, leaf)) => leaf.validity().not_after.timestamp(),
        Err(e) => {
            return Err(format!(
                "{}: the first certificate does not parse: {e}",
                files.cert.display()
            ));
        }
    };
    let key = read_key(&files.key)?;
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        format!(
            "{} and {} do not make a usable pair: {e}",
            files.cert.display(),
            files.key.display()
        )
    })?;
    Ok(Loaded {
        key: Arc::new(certified),
        not_after,
    })
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not a PEM certificate chain: {e}", path.display()))?;
    if chain.is_empty() {
        return Err(format!("{} holds no certificate", path.display()));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| format!("{} holds no PEM private key: {e}", path.display()))
}

/// `[demo] mock_upstream`: the address the in-process mock model server listens on; not a
/// port a listener has (`bound`, from `check`).
pub(super) fn demo(
    raw: Option<&super::raw::RawDemo>,
    bound: &[(&'static str, std::net::SocketAddr)],
    src: &Src<'_>,
    p: &mut Problems,
) -> Option<String> {
    let m = raw?.mock_upstream.as_ref()?;
    let problem = match m.get_ref().parse::<std::net::SocketAddr>() {
        Err(_) => Some("must be IP:PORT".to_string()),
        Ok(addr) => bound
            .iter()
            .find(|(_, b)| addr.port() != 0 && one_port(b, &addr))
            .map(|(other, _)| format!("{addr} is also `{other}`'s: it needs its own")),
    };
    if let Some(message) = problem {
        p.push(Problem::new(
            src.file,
            src.at(m.span()),
            "demo.mock_upstream",
            message,
        ));
    }
    Some(m.get_ref().clone())
}

/// Which API listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Main,
    Direct,
}

impl Listener {
    pub fn name(self) -> &'static str {
        match self {
            Listener::Main => "main",
            Listener::Direct => "direct",
        }
    }
}
