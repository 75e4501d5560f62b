//! Web stage, pages: the usage-record page (`direct /`), the console (`main /`) and the files
//! they load, embedded in the
//! binary so the page works offline with no CDN. Every page goes out with a strict
//! Content-Security-Policy: scripts and styles only from this origin, nothing inline, no
//! remote origin, no framing.

use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use super::Exchange;
use crate::http1::respond;

pub struct Asset {
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

const USAGE_PAGE: &[u8] = include_bytes!("assets/usage.html");
const CONSOLE_PAGE: &[u8] = include_bytes!("assets/console.html");

static ASSETS: [Asset; 7] = [
    Asset {
        path: "/assets/shared.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/shared.js"),
    },
    Asset {
        path: "/assets/console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/console.js"),
    },
    Asset {
        path: "/assets/usage.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/usage.js"),
    },
    Asset {
        path: "/assets/modelgate.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/modelgate.css"),
    },
    Asset {
        path: "/assets/vendor/uPlot.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/vendor/uPlot.iife.min.js"),
    },
    Asset {
        path: "/assets/vendor/uPlot.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/vendor/uPlot.min.css"),
    },
    Asset {
        path: "/assets/vendor/uPlot.LICENSE",
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("assets/vendor/uPlot.LICENSE"),
    },
];

pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

fn security_headers(h: &mut ResponseHeader, cache: &str) -> pingora_error::Result<()> {
    h.insert_header("content-security-policy", CSP)?;
    h.insert_header("x-content-type-options", "nosniff")?;
    h.insert_header("referrer-policy", "no-referrer")?;
    h.insert_header("x-frame-options", "DENY")?;
    h.insert_header("cache-control", cache)
}

pub async fn send_page(session: &mut Session, ex: &mut Exchange) -> pingora_error::Result<()> {
    send_html(session, ex, USAGE_PAGE).await
}

pub async fn send_console(session: &mut Session, ex: &mut Exchange) -> pingora_error::Result<()> {
    send_html(session, ex, CONSOLE_PAGE).await
}

async fn send_html(
    session: &mut Session,
    ex: &mut Exchange,
    page: &'static [u8],
) -> pingora_error::Result<()> {
    let body = Bytes::from_static(page);
    respond::send(
        session,
        ex.writing(),
        200,
        "text/html; charset=utf-8",
        body,
        |h| security_headers(h, "no-store"),
    )
    .await
}

pub async fn send_asset(
    session: &mut Session,
    ex: &mut Exchange,
    a: &'static Asset,
) -> pingora_error::Result<()> {
    respond::send(
        session,
        ex.writing(),
        200,
        a.content_type,
        Bytes::from_static(a.body),
        |h| security_headers(h, "no-cache"),
    )
    .await
}
