//! Limits shared by a fleet: rpm, tpm, concurrency and spend counted in Redis, so a key's
//! limits and budget hold across every gateway that uses the same Redis.
//!
//! One Lua script per admission (one round trip) prunes and counts the key's sliding windows
//! on Redis's own clock (`TIME`), so gateways with skewed clocks agree: rpm is a sorted set
//! of admissions, tpm a sorted set of replies' token counts with a running sum, concurrency a
//! sorted set of leases (each gateway renews its own; those of a gateway that died expire),
//! and it returns the key's spend for the budget check. Exact like the local limiter: "rpm =
//! 100" admits exactly 100 in any 60 s across the fleet. When Redis cannot be reached, the
//! gateway falls back per `on_redis_down` (local limits, or refuse), says so once per episode,
//! and tries Redis again every second until it answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use super::rate::{Headroom, Refusal, WINDOW};
use super::reserve::{Ask, Reservation, Short};
use crate::config::keys::Key;

pub use crate::config::OnDown;

/// How long a concurrency lease lives unless its gateway renews it.
const LEASE: Duration = Duration::from_secs(30);
const RENEW_EVERY: Duration = Duration::from_secs(10);
/// After a failure Redis is tried again after this (requests meanwhile fall back at once).
const RETRY: Duration = Duration::from_secs(1);
/// Tries of an `UNDO`, a `RETRY` apart: within the two minutes its mark lasts.
const UNDO_TRIES: usize = 100;
/// `UNDO`s waiting at once, at most.
const UNDO_PENDING: usize = 1_000;

/// The start of every script that reads Redis's own clock: `now`, in ms.
macro_rules! redis_now {
    () => {
        "local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)"
    };
}

/// KEYS: requests, tokens, token sum, leases, spend, given up. ARGV: rpm, tpm, max_concurrent
/// (0 = none), member (the request id), lease ms. Returns {refusal ("" when admitted, "gone"
/// when the gateway gave up on this admission: see `UNDO`), retry_after ms, requests in
/// window, requests reset ms, tokens in window, tokens reset ms, spend, slots taken (this
/// request's own included when admitted; -1 for a key without `max_concurrent`)}.
const ADMIT: &str = concat!(
    redis_now!(),
    r"
if redis.call('ZSCORE', KEYS[6], ARGV[4]) then return {'gone', 0, 0, 0, 0, 0, '0', -1} end
local win = 60000
local rpm, tpm, conc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local refusal, retry = '', 0
local tok_sum, tok_reset = 0, 0
if tpm > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - win)
  if #old > 0 then
    local sub = 0
    for _, m in ipairs(old) do sub = sub + tonumber(string.match(m, ':(%d+)$')) end
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - win)
    redis.call('DECRBY', KEYS[3], sub)
  end
  tok_sum = tonumber(redis.call('GET', KEYS[3]) or '0')
  if tok_sum < 0 or redis.call('ZCARD', KEYS[2]) == 0 then
    tok_sum = 0
    redis.call('DEL', KEYS[3])
  end
  if tok_sum >= tpm then
    local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
    local s = tok_sum
    for i = 1, #entries, 2 do
      s = s - tonumber(string.match(entries[i], ':(%d+)$'))
      if s < tpm then
        tok_reset = tonumber(entries[i + 1]) + win - now
        break
      end
    end
    refusal, retry = 'tpm', tok_reset
  elseif tok_sum > 0 then
    local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if #first == 2 then tok_reset = tonumber(first[2]) + win - now end
  end
end
local used, req_reset = 0, 0
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - win)
  used = redis.call('ZCARD', KEYS[1])
  if refusal == '' and used >= rpm then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    refusal, retry = 'rpm', tonumber(first[2]) + win - now
  end
end
local taken = -1
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  taken = redis.call('ZCARD', KEYS[4])
end
if refusal == '' and conc > 0 then
  if taken >= conc then
    refusal, retry = 'concurrency', 1000
  else
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[5]), ARGV[4])
    redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[5]))
    taken = taken + 1
  end
end
if refusal == '' and rpm > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[4])
  redis.call('PEXPIRE', KEYS[1], win)
  used = used + 1
end
if rpm > 0 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then req_reset = tonumber(first[2]) + win - now end
end
local spend = redis.call('GET', KEYS[5]) or '0'
return {refusal, retry, used, req_reset, tok_sum, tok_reset, spend, taken}
"
);

/// KEYS: token sum, spend, holds (member → expiry), hold amounts (member → "credits
/// tokens"). ARGV: budget (-1: none), tpm (0: none), prompt tokens, output tokens wanted,
/// least output (the output wanted when it cannot be lowered, else 1), price per prompt
/// token, per output token and per request (credits), member, lease ms. Holds a request's
/// worst cost against the key's budget and tpm, after the spend, the window's tokens and every
/// live hold (a hold whose gateway died expires with its lease), lowering the output to what
/// is left. Returns {refusal ("", "budget", "held" (payable but for the holds) or "tpm"), output tokens held, spend, output
/// tokens tpm left (more than those held when the budget lowered them)}.
const RESERVE: &str = concat!(
    redis_now!(),
    r"
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
if #expired > 0 then
  redis.call('HDEL', KEYS[4], unpack(expired))
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
end
local held_c, held_t = 0, 0
for _, v in ipairs(redis.call('HVALS', KEYS[4])) do
  local c, t = string.match(v, '^(%S+) (%S+)$')
  held_c = held_c + tonumber(c)
  held_t = held_t + tonumber(t)
end
local budget, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local prompt, out, least = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local pp, pc, pr = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local spend = redis.call('GET', KEYS[2]) or '0'
if tpm > 0 then
  local left = tpm - tonumber(redis.call('GET', KEYS[1]) or '0') - held_t - prompt
  if left < least then return {'tpm', 0, spend, 0} end
  if left < out then out = left end
end
local after_tpm = out
if budget >= 0 then
  local least_c = least * pc * (1 + 1e-12)
  local left = budget - tonumber(spend) - prompt * pp - pr
  if left < least_c or left < 0 then return {'budget', 0, spend, 0} end
  left = left - held_c
  if left < least_c or left < 0 then return {'held', 0, spend, 0} end
  if pc > 0 and left < out * pc then out = math.floor(left / pc) end
end
local credits = prompt * pp + out * pc + pr
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[10]), ARGV[9])
redis.call('HSET', KEYS[4], ARGV[9], string.format('%.17g %d', credits, prompt + out))
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[10]))
redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[10]))
return {'', out, spend, after_tpm}
"
);

/// KEYS: tokens, token sum, spend, holds, hold amounts. ARGV: tokens, member, cost. A reply
/// that ended: its hold (if any) is replaced by its tokens and cost in one step.
const ENDED: &str = concat!(
    redis_now!(),
    r"
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('HDEL', KEYS[5], ARGV[2])
local n = tonumber(ARGV[1])
if n > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[2] .. ':' .. ARGV[1])
  redis.call('INCRBY', KEYS[2], n)
  redis.call('PEXPIRE', KEYS[1], 60000)
  redis.call('PEXPIRE', KEYS[2], 60000)
end
if tonumber(ARGV[3]) > 0 then redis.call('INCRBYFLOAT', KEYS[3], ARGV[3]) end
return 1
"
);

/// KEYS: spend. ARGV: the store's total. Spend in Redis never drops below the store's (a
/// Redis that restarted empty is filled again from the records).
const RECONCILE: &str = r"
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
";

/// KEYS: requests, leases, given up. ARGV: member. An admission the gateway gave up on (Redis
/// did not answer in time; the request went on under local limits) is taken back: its request
/// and lease are removed, and it is marked given up for two minutes, so that an admission
/// still queued in a stalled Redis, run after this, does nothing. Either order leaves no
/// trace, so a slow Redis costs no key its allowance.
const UNDO: &str = concat!(
    redis_now!(),
    r"
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + 120000, ARGV[1])
redis.call('PEXPIRE', KEYS[3], 120000)
return 1
"
);

/// KEYS: leases (or holds, then the hold amounts). ARGV: lease ms, member. A lease still held
/// gets a new expiry, and so do the sets it lives in (the amounts too: a hold whose amount
/// expired would count as nothing while its request runs on).
const RENEW: &str = concat!(
    redis_now!(),
    r"
local exp = now + tonumber(ARGV[1])
redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[2])
for _, k in ipairs(KEYS) do redis.call('PEXPIRE', k, tonumber(ARGV[1])) end
return 1
"
);

fn keys_of(id: &str) -> [String; 8] {
    // One hash tag per key: a Redis Cluster keeps a key's counters on one node.
    [
        "req", "tok", "toksum", "lease", "spend", "gone", "hold", "holdv",
    ]
    .map(|k| format!("mg:{{{id}}}:{k}"))
}

/// The answer for one admission.
pub struct Decision {
    pub refusal: Option<Refusal>,
    pub headroom: Headroom,
    /// The key's spend across the fleet.
    pub spend: f64,
    pub lease: Option<Lease>,
}

/// A concurrency slot held in Redis; released (asynchronously) when it drops.
#[derive(Debug)]
pub struct Lease {
    limits: Arc<SharedLimits>,
    key_id: String,
    member: String,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.limits.leases.remove(&self.member);
        let limits = Arc::clone(&self.limits);
        let (key, member) = (
            keys_of(&self.key_id)[3].clone(),
            std::mem::take(&mut self.member),
        );
        self.limits.rt.spawn(async move {
            let mut c = limits.conn.clone();
            let _: Result<i64, _> = c.zrem(key, member).await;
        });
    }
}

pub struct SharedLimits {
    conn: ConnectionManager,
    rt: tokio::runtime::Handle,
    admit: Script,
    reserve: Script,
    ended: Script,
    reconcile: Script,
    renew: Script,
    undo: Script,
    pub on_down: OnDown,
    down: AtomicBool,
    /// Unix ms after which a down Redis is tried again.
    retry_at_ms: AtomicU64,
    /// Leases this gateway holds (member → key id), renewed while their requests run.
    leases: DashMap<String, String>,
    /// Budget and tpm holds this gateway holds (member → key id), renewed likewise.
    holds: DashMap<String, String>,
    /// `UNDO`s waiting for Redis.
    undos: AtomicUsize,
    started: Instant,
    metrics: Arc<crate::ops::metrics::Metrics>,
}

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits")
            .field("on_down", &self.on_down)
            .finish()
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl SharedLimits {
    /// Starts the thread whose runtime owns the Redis connection (reconnecting on its own)
    /// and renews leases. Connects lazily: a gateway starts while Redis is down.
    pub fn start(
        url: &str,
        on_down: OnDown,
        timeout: Duration,
        metrics: Arc<crate::ops::metrics::Metrics>,
    ) -> Result<Arc<SharedLimits>, String> {
        let client = redis::Client::open(url).map_err(|e| format!("limits: the redis URL: {e}"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("redis-limits")
            .build()
            .map_err(|e| format!("limits: a runtime for redis: {e}"))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = {
            let _in = rt.enter();
            ConnectionManager::new_lazy_with_config(client, config)
                .map_err(|e| format!("limits: redis: {e}"))?
        };
        let limits = Arc::new(SharedLimits {
            conn,
            rt: rt.handle().clone(),
            admit: Script::new(ADMIT),
            reserve: Script::new(RESERVE),
            ended: Script::new(ENDED),
            reconcile: Script::new(RECONCILE),
            renew: Script::new(RENEW),
            undo: Script::new(UNDO),
            on_down,
            down: AtomicBool::new(false),
            retry_at_ms: AtomicU64::new(0),
            leases: DashMap::new(),
            holds: DashMap::new(),
            undos: AtomicUsize::new(0),
            started: Instant::now(),
            metrics,
        });
        // The first connection is made on this runtime (later ones are, by the manager), not
        // on whichever request's runtime asks first.
        let first = limits.conn.clone();
        rt.spawn(async move {
            let mut c = first;
            let _: Result<String, _> = redis::cmd("PING").query_async(&mut c).await;
        });
        let renewer = Arc::downgrade(&limits);
        std::thread::Builder::new()
            .name("redis-limits".into())
            .spawn(move || {
                rt.block_on(async move {
                    loop {
                        tokio::time::sleep(RENEW_EVERY).await;
                        let Some(l) = renewer.upgrade() else { return };
                        l.renew().await;
                    }
                });
            })
            .map_err(|e| format!("limits: starting the redis thread: {e}"))?;
        Ok(limits)
    }

    fn now_ms(&self) -> u64 {
        ms(self.started.elapsed())
    }

    /// Whether Redis is to be asked now (up, or due for another try).
    pub fn usable(&self) -> bool {
        !self.down.load(Ordering::Relaxed)
            || self.now_ms() >= self.retry_at_ms.load(Ordering::Relaxed)
    }

    fn failed(&self, e: &redis::RedisError) {
        self.retry_at_ms
            .store(self.now_ms() + ms(RETRY), Ordering::Relaxed);
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                on_redis_down = ?self.on_down,
                "limits: redis cannot be reached ({e}); limits are {} until it is back",
                match self.on_down {
                    OnDown::Local => "counted by each gateway alone",
                    OnDown::Deny => "refused",
                }
            );
            self.metrics.redis_down();
        }
    }

    fn answered(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::warn!("limits: redis is back; limits are shared again");
            self.metrics.redis_up();
        }
    }

    /// Admits one request of `key` across the fleet, or says why not. Err when Redis did not
    /// answer (the caller falls back per `on_down`).
    pub async fn admit(self: &Arc<Self>, key: &Key, request_id: &str) -> Result<Decision, ()> {
        let keys = keys_of(&key.id);
        let mut inv = self.admit.prepare_invoke();
        for k in &keys[..6] {
            inv.key(k);
        }
        inv.arg(key.rpm.unwrap_or(0))
            .arg(key.tpm.unwrap_or(0))
            .arg(key.max_concurrent.unwrap_or(0))
            .arg(request_id)
            .arg(ms(LEASE));
        let mut c = self.conn.clone();
        let out: (String, i64, u64, i64, u64, i64, String, i64) =
            match inv.invoke_async(&mut c).await {
                Ok(v) => v,
                Err(e) => {
                    self.failed(&e);
                    // Only an admission that may have reached Redis (it did not answer in
                    // time) can run there later; a refused or lost connection sent nothing.
                    if e.is_timeout() && (key.rpm.is_some() || key.max_concurrent.is_some()) {
                        self.undo(&key.id, request_id);
                    }
                    return Err(());
                }
            };
        self.answered();
        let (refusal, retry, used, req_reset, tok_sum, tok_reset, spend, taken) = out;
        if refusal == "gone" {
            return Err(());
        }
        let dur = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
        let mut headroom = Headroom::default();
        if let Some(rpm) = key.rpm.map(u64::from) {
            headroom.requests = Some((rpm, rpm.saturating_sub(used), dur(req_reset).min(WINDOW)));
        }
        if let Some(tpm) = key.tpm {
            headroom.tokens = Some((tpm, tpm.saturating_sub(tok_sum), dur(tok_reset).min(WINDOW)));
        }
        if let (Some(max), Ok(taken)) = (key.max_concurrent, u32::try_from(taken)) {
            headroom.concurrency = Some((max, max.saturating_sub(taken)));
        }
        let refusal = match refusal.as_str() {
            "" => None,
            "rpm" => Some(super::rate::refusal_rpm(key.rpm.unwrap_or(0), dur(retry))),
            "tpm" => Some(super::rate::refusal_tpm(key.tpm.unwrap_or(0), dur(retry))),
            _ => Some(super::rate::refusal_concurrency(
                key.max_concurrent.unwrap_or(0),
            )),
        };
        let lease = (refusal.is_none() && key.max_concurrent.is_some()).then(|| {
            self.leases.insert(request_id.to_string(), key.id.clone());
            Lease {
                limits: Arc::clone(self),
                key_id: key.id.clone(),
                member: request_id.to_string(),
            }
        });
        Ok(Decision {
            refusal,
            headroom,
            spend: spend.parse().unwrap_or(0.0),
            lease,
        })
    }

    /// Takes back an admission Redis did not answer in time (`UNDO`), trying again each second
    /// while Redis does not answer, for as long as the mark lasts. Never waits.
    /// At most `UNDO_PENDING` wait at once: past it (a long stall under load) the rest are left
    /// to their leases' expiry (30 s) and their requests to the rpm window.
    fn undo(self: &Arc<Self>, key_id: &str, request_id: &str) {
        if self.undos.fetch_add(1, Ordering::AcqRel) >= UNDO_PENDING {
            self.undos.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let keys = keys_of(key_id);
        let member = request_id.to_string();
        let limits = Arc::clone(self);
        self.rt.spawn(async move {
            for _ in 0..UNDO_TRIES {
                let mut inv = limits.undo.prepare_invoke();
                inv.key(&keys[0]).key(&keys[3]).key(&keys[5]).arg(&member);
                let mut c = limits.conn.clone();
                if inv.invoke_async::<i64>(&mut c).await.is_ok() {
                    break;
                }
                tokio::time::sleep(RETRY).await;
            }
            limits.undos.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Counts a reply that ended: its tokens (tpm) and its cost (spend), in place of its hold
    /// when it has one. Never waits.
    pub fn ended(
        self: &Arc<Self>,
        key_id: &str,
        request_id: &str,
        tokens: u64,
        cost: f64,
        hold: Option<FleetHold>,
    ) {
        let held = hold.is_some_and(|mut h| {
            h.settled = true;
            true
        });
        if tokens == 0 && cost <= 0.0 && !held {
            return;
        }
        self.holds.remove(request_id);
        let keys = keys_of(key_id);
        let member = request_id.to_string();
        let limits = Arc::clone(self);
        self.rt.spawn(async move {
            let mut inv = limits.ended.prepare_invoke();
            inv.key(&keys[1]).key(&keys[2]).key(&keys[4]);
            inv.key(&keys[6]).key(&keys[7]);
            inv.arg(tokens).arg(member).arg(cost.max(0.0));
            let mut c = limits.conn.clone();
            if let Err(e) = inv.invoke_async::<i64>(&mut c).await {
                limits.failed(&e);
            }
        });
    }

    /// Raises each key's spend in Redis to at least the store's total. Blocking: for a thread
    /// that is not a runtime's.
    pub fn reconcile(&self, totals: &std::collections::HashMap<String, f64>) {
        let mut c = self.conn.clone();
        let script = &self.reconcile;
        let result: Result<(), redis::RedisError> = self.rt.block_on(async {
            for (key, total) in totals {
                let mut inv = script.prepare_invoke();
                inv.key(&keys_of(key)[4]).arg(*total);
                let _: i64 = inv.invoke_async(&mut c).await?;
            }
            Ok(())
        });
        match result {
            Ok(()) => self.answered(),
            Err(e) => self.failed(&e),
        }
    }

    /// Pushes the expiry of every lease and hold this gateway holds (on Redis's clock).
    async fn renew(&self) {
        let leases = self.leases.iter().map(|e| {
            let k = keys_of(e.value());
            (vec![k[3].clone()], e.key().clone())
        });
        let holds = self.holds.iter().map(|e| {
            let k = keys_of(e.value());
            (vec![k[6].clone(), k[7].clone()], e.key().clone())
        });
        let members: Vec<(Vec<String>, String)> = leases.chain(holds).collect();
        let mut c = self.conn.clone();
        for (keys, member) in members {
            let mut inv = self.renew.prepare_invoke();
            for k in keys {
                inv.key(k);
            }
            inv.arg(ms(LEASE)).arg(member);
            if let Err(e) = inv.invoke_async::<i64>(&mut c).await {
                self.failed(&e);
                return;
            }
        }
    }
}

/// A request's hold in Redis of its key's budget and tpm: replaced by its real cost when it
/// ends (`SharedLimits::ended`), released if dropped unsettled; renewed while it runs, so
/// that it expires `LEASE` after its gateway died.
#[derive(Debug)]
pub struct FleetHold {
    limits: Arc<SharedLimits>,
    key_id: String,
    member: String,
    settled: bool,
}

impl Drop for FleetHold {
    fn drop(&mut self) {
        if !self.settled {
            let member = std::mem::take(&mut self.member);
            self.limits.holds.remove(&member);
            let limits = Arc::clone(&self.limits);
            let keys = keys_of(&self.key_id);
            self.limits.rt.spawn(async move {
                let mut c = limits.conn.clone();
                let _: Result<i64, _> = c.zrem(&keys[6], &member).await;
                let _: Result<i64, _> = c.hdel(&keys[7], &member).await;
            });
        }
    }
}

impl SharedLimits {
    /// Holds a request's worst cost against its key's budget and tpm across the fleet.
    /// Err(None) when Redis did not answer (the caller falls back per `on_down`).
    pub async fn reserve(
        self: &Arc<Self>,
        key: &Key,
        request_id: &str,
        ask: Ask,
    ) -> Result<Reservation, Option<Short>> {
        let keys = keys_of(&key.id);
        let mut inv = self.reserve.prepare_invoke();
        inv.key(&keys[2]).key(&keys[4]).key(&keys[6]).key(&keys[7]);
        inv.arg(key.budget.unwrap_or(-1.0))
            .arg(key.tpm.unwrap_or(0))
            .arg(ask.prompt)
            .arg(ask.output)
            .arg(ask.least())
            .arg(ask.price.prompt / 1e6)
            .arg(ask.price.completion / 1e6)
            .arg(ask.price.request)
            .arg(request_id)
            .arg(ms(LEASE));
        let mut c = self.conn.clone();
        let (refusal, output, _spend, after_tpm): (String, u64, String, u64) =
            match inv.invoke_async(&mut c).await {
                Ok(v) => v,
                Err(e) => {
                    self.failed(&e);
                    return Err(None);
                }
            };
        self.answered();
        match refusal.as_str() {
            "" => {}
            "tpm" => {
                let tpm = key.tpm.unwrap_or(0);
                let refusal = super::rate::refusal_tpm(tpm, Duration::from_secs(1));
                return Err(Some(Short::Tpm(refusal)));
            }
            "held" => return Err(Some(Short::Held)),
            _ => return Err(Some(Short::Budget)),
        }
        self.holds.insert(request_id.to_string(), key.id.clone());
        let hold = FleetHold {
            limits: Arc::clone(self),
            key_id: key.id.clone(),
            member: request_id.to_string(),
            settled: false,
        };
        Ok(Reservation {
            output,
            lowered: output < ask.output,
            budget_limited: output < after_tpm,
            fleet: Some(hold),
            ..Reservation::default()
        })
    }
}
