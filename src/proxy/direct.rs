//! The direct path: forwards a request whose body Pingora's pipe cannot re-send (chunked and
//! over 64 KiB, see body.rs) with our own upstream client, and streams the reply back through
//! the same reply stage as the proxy path.

use pingora_core::connectors::http::Connector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_proxy::Session;

use super::ctx::{Ctx, Outcome};
use super::{chosen, reply, respond};
use crate::upstream;

/// Sends the request upstream and the reply to the client. Failures before the reply header
/// become the contract's errors; after it, the client connection is closed.
pub async fn forward(connector: &Connector, session: &mut Session, ctx: &mut Ctx) {
    let Ok((pool, up)) = chosen(ctx) else { return };
    let peer = upstream::peer(pool, up);
    let mut req = session.req_header().clone();
    let result = async {
        upstream::rewrite_request(&mut req, pool, up, ctx.body.len(), &ctx.request_id)?;
        let (mut client, _reused) = connector.get_http_session(&*peer).await?;
        // Pingora's proxy sets these from the peer; our own client must too, or a silent
        // upstream would hold the client (and its limit slot) forever.
        client.set_read_timeout(peer.options.read_timeout);
        client.set_write_timeout(peer.options.write_timeout);
        client.write_request_header(Box::new(req)).await?;
        client.write_request_body(ctx.body.clone(), true).await?;
        client.finish_request_body().await?;
        client.read_response_header().await?;
        Ok::<HttpSession, Box<pingora_error::Error>>(client)
    }
    .await;
    let mut client = match result {
        Ok(c) => c,
        Err(e) => {
            match reply::classify_failure(&e) {
                Some(g) => {
                    let _ = respond::json(session, ctx, g.status(), g.body()).await;
                    ctx.outcome = Outcome::UpstreamFailed(g.status());
                }
                None => ctx.outcome = Outcome::ClientGone,
            }
            return;
        }
    };
    let Some(mut resp) = client.response_header().cloned() else {
        return;
    };
    if let Err(e) = reply::on_upstream_header(ctx, &mut resp) {
        if let Some(g) = reply::classify_failure(&e) {
            let _ = respond::json(session, ctx, g.status(), g.body()).await;
            ctx.outcome = Outcome::UpstreamFailed(g.status());
        }
        return;
    }
    if session
        .write_response_header(Box::new(resp), false)
        .await
        .is_err()
    {
        return;
    }
    loop {
        let mut chunk = match client.read_response_body().await {
            Ok(c) => c,
            Err(_) => {
                // The upstream broke off mid-reply: the client's reply is cut.
                ctx.outcome = Outcome::UpstreamFailed(502);
                session.as_downstream_mut().set_keepalive(None);
                return;
            }
        };
        let done = chunk.is_none() || client.response_done();
        reply::on_body(ctx, &mut chunk, done);
        if session.write_response_body(chunk, done).await.is_err() {
            ctx.outcome = Outcome::ClientGone;
            return;
        }
        if done {
            break;
        }
    }
    connector
        .release_http_session(client, &*peer, peer.options.idle_timeout)
        .await;
}
