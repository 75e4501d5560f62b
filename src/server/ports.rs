//! Listeners on port 0: the gateway picks a free port for each and says which on one line of
//! standard error (`listening: main=127.0.0.1:41234 …`), so a test harness (or a supervisor)
//! never has to pick one, release it and hope nobody takes it before the gateway binds it.
//!
//! The picked port is held for the life of the process by a socket bound to it with
//! `SO_REUSEPORT` and never listening (so it takes no connection; the kernel hands ports out to
//! other processes' port-0 binds only when no socket holds them), and Pingora binds the same
//! address with `SO_REUSEPORT` too.

use std::net::SocketAddr;

use socket2::{Domain, Socket, Type};

use crate::config::Listeners;

/// The listeners whose port was picked: (name, address) of each.
#[derive(Default)]
pub struct Picked(Vec<(&'static str, String)>);

impl Picked {
    /// The line that says which ports were picked (`listening: main=127.0.0.1:41234 …`);
    /// None when none was.
    pub fn said(&self) -> Option<String> {
        let words: Vec<String> = self.0.iter().map(|(n, a)| format!("{n}={a}")).collect();
        (!words.is_empty()).then(|| format!("listening: {}", words.join(" ")))
    }

    /// Whether `addr`'s port was picked here (held: Pingora binds it with `SO_REUSEPORT`).
    pub fn has(&self, addr: &str) -> bool {
        self.0.iter().any(|(_, a)| a == addr)
    }
}

/// The sockets holding the picked ports: keep them for the life of the process.
pub struct Held(#[allow(dead_code)] Vec<Socket>);

/// A free port on `addr`'s address, held.
fn bind(addr: SocketAddr) -> std::io::Result<(SocketAddr, Socket)> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    let picked = socket
        .local_addr()?
        .as_socket()
        .ok_or_else(|| std::io::Error::other("not an internet address"))?;
    Ok((picked, socket))
}

/// Each listener that names port 0 given a free port (in place): (name, address) of each,
/// and the sockets holding them. An `upgrade` takes the running instance's sockets over by
/// their addresses: it needs them named, not 0.
pub fn pick(listeners: &mut Listeners, upgrade: bool) -> Result<(Held, Picked), String> {
    let mut held = Vec::new();
    let mut picked = Vec::new();
    for (name, slot) in [
        ("main", &mut listeners.main),
        ("direct", &mut listeners.direct),
        ("admin", &mut listeners.admin),
    ] {
        let Some(addr) = slot.as_deref().and_then(|a| a.parse::<SocketAddr>().ok()) else {
            continue;
        };
        if addr.port() != 0 {
            continue;
        }
        if upgrade {
            return Err(format!(
                "cannot upgrade {name} on {addr}: name the port the running instance listens on"
            ));
        }
        let (at, socket) =
            bind(addr).map_err(|e| format!("cannot pick a port for {name} on {addr}: {e}"))?;
        held.push(socket);
        *slot = Some(at.to_string());
        picked.push((name, at.to_string()));
    }
    Ok((Held(held), Picked(picked)))
}
