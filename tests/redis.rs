//! Limits shared through Redis (`[limits] redis`), against a real redis-server started by the
//! test and two gateway processes: rpm exact across both, concurrency and tpm across both, a
//! budget spent on one refused on the other and never overshot by more than the requests in
//! flight, Redis killed (local limits or refusals per `on_redis_down`, counted) and back.
#![allow(clippy::disallowed_methods)] // a test owns the tasks it starts; they end with it

mod common;

use std::time::{Duration, Instant};

use common::redis::Redis;
use common::{Gateway, Setup, chat_body, send, start_with};
use redis::Commands;

const FLEET_KEYS: &str = r#"
[[keys]]
id = "fleet-budget"
secret = "sk-test-fleet-budget-0012"
budget = 100.0
"#;

/// Today's rule for budgets and tpm: counted when a reply ends (no reservation).
const AFTER: &str = "budget_mode = \"after\"\n";

fn fleet(redis: &Redis, extra: &str) -> [Gateway; 2] {
    let setup = || Setup {
        limits_extra: format!(
            "redis = \"{}\"\nredis_timeout_ms = 200\n{extra}",
            redis.url()
        ),
        extra_keys: FLEET_KEYS.into(),
        ..Setup::default()
    };
    [start_with(setup()), start_with(setup())]
}

async fn chat(base: &str, key: &str) -> reqwest::Response {
    send(
        base,
        "/v1/chat/completions",
        Some(key),
        &chat_body("echo-1", false),
        &[],
    )
    .await
}

async fn metric(g: &Gateway, name: &str) -> f64 {
    let text = common::get(&g.admin, "/metrics", None)
        .await
        .text()
        .await
        .expect("metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// `rpm = 100` admits exactly 100 across two gateways under concurrent load, and each 429 says
/// when to come back.
#[tokio::test(flavor = "multi_thread")]
async fn rpm_holds_exactly_across_two_gateways() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "");
    let mut tasks = Vec::new();
    for i in 0..160 {
        let base = gs[i % 2].direct.clone();
        tasks.push(tokio::spawn(async move {
            let r = chat(&base, common::RPM100_KEY).await;
            let status = r.status().as_u16();
            let retry = r
                .headers()
                .get("retry-after")
                .map(|v| v.to_str().unwrap_or("").to_string());
            let remaining = r.headers().get("x-ratelimit-remaining-requests").is_some();
            (status, retry, remaining)
        }));
    }
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        let (status, retry, remaining) = t.await.expect("task");
        assert!(remaining, "x-ratelimit-* on every reply");
        match status {
            200 => ok += 1,
            429 => {
                limited += 1;
                let secs: u64 = retry.expect("Retry-After").parse().expect("seconds");
                assert!((1..=60).contains(&secs), "Retry-After {secs}");
            }
            s => panic!("status {s}"),
        }
    }
    assert_eq!((ok, limited), (100, 60));
}

/// `max_concurrent = 2` counts the requests in flight on both gateways; a slot frees when its
/// request ends.
#[tokio::test(flavor = "multi_thread")]
async fn concurrency_is_counted_across_gateways() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "");
    let slow = |base: String| {
        tokio::spawn(async move {
            let r = send(
                &base,
                "/v1/chat/completions",
                Some(common::CONC_KEY),
                &chat_body("echo-1", true),
                &[("x-mock-delay-ms", "300")],
            )
            .await;
            assert_eq!(r.status(), 200);
            r.bytes().await.expect("stream");
        })
    };
    let a = slow(gs[0].direct.clone());
    let b = slow(gs[1].direct.clone());
    // Both slots are taken once Redis holds both leases.
    let mut c = redis.conn();
    common::eventually_async(Duration::from_secs(5), "leases not taken", async || match c
        .zcard::<_, u64>("mg:{conc}:lease")
        .expect("zcard")
    {
        n if n < 2 => Err(format!("{n} leases")),
        _ => Ok(()),
    })
    .await;
    for g in &gs {
        let refused = chat(&g.main, common::CONC_KEY).await;
        // The fleet's count: no slot left on either gateway.
        assert_eq!(refused.headers()["x-ratelimit-limit-concurrency"], "2");
        assert_eq!(refused.headers()["x-ratelimit-remaining-concurrency"], "0");
        let (status, e) = common::error_of(refused).await;
        assert_eq!(
            (status, e["code"].as_str()),
            (429, Some("rate_limit_exceeded"))
        );
    }
    a.await.expect("a");
    b.await.expect("b");
    common::eventually_async(
        Duration::from_secs(5),
        "leases not released",
        async || match c.zcard::<_, u64>("mg:{conc}:lease").expect("zcard") {
            0 => Ok(()),
            n => Err(format!("{n} leases")),
        },
    )
    .await;
    let free = chat(&gs[1].main, common::CONC_KEY).await;
    assert_eq!(free.status(), 200);
    assert_eq!(free.headers()["x-ratelimit-remaining-concurrency"], "1");
}

/// `tpm = 20`: the tokens of a reply on one gateway count on the other.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_counted_on_one_gateway_limit_the_other() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, AFTER);
    let mut c = redis.conn();
    let mut used = 0u64;
    // The mock's reply is 12 tokens: two replies reach 24 >= 20.
    for g in &gs {
        assert_eq!(chat(&g.direct, common::TPM_KEY).await.status(), 200);
        used += 12;
        common::eventually_async(Duration::from_secs(5), "tokens not counted", async || {
            let sum = c
                .get::<_, Option<u64>>("mg:{tpm}:toksum")
                .expect("get")
                .unwrap_or(0);
            if sum < used {
                Err(format!("{sum} of {used}"))
            } else {
                Ok(())
            }
        })
        .await;
    }
    let r = chat(&gs[0].direct, common::TPM_KEY).await;
    assert_eq!(r.headers()["x-ratelimit-remaining-tokens"], "0");
    let (status, e) = common::error_of(r).await;
    assert_eq!(status, 429);
    assert!(
        e["message"]
            .as_str()
            .unwrap_or("")
            .contains("tokens per minute"),
        "{e}"
    );
}

/// A budget spent through one gateway is refused on the other; a burst across both overshoots
/// it by at most the requests in flight.
#[tokio::test(flavor = "multi_thread")]
async fn a_budget_holds_across_the_fleet() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, AFTER);
    // priced-model: 0.5 a request + 1 per token (12 tokens): 12.5 a request; budget 100.
    let body = chat_body("priced-model", false);
    let key = "sk-test-fleet-budget-0012";
    let mut c = redis.conn();
    // Four requests in flight at a time, alternating gateways, until refusals come.
    let mut ok = 0;
    let mut refused = 0;
    for round in 0..6 {
        let tasks: Vec<_> = (0..4)
            .map(|i| {
                let base = gs[(round + i) % 2].direct.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    send(&base, "/v1/chat/completions", Some(key), &body, &[])
                        .await
                        .status()
                        .as_u16()
                })
            })
            .collect();
        for t in tasks {
            match t.await.expect("task") {
                200 => ok += 1,
                402 => refused += 1,
                s => panic!("status {s}"),
            }
        }
        // Let the round's costs reach Redis before the next round is admitted.
        common::eventually_async(Duration::from_secs(5), "spend not counted", async || {
            let spend = c
                .get::<_, Option<f64>>("mg:{fleet-budget}:spend")
                .expect("get")
                .unwrap_or(0.0);
            if spend < ok as f64 * 12.5 - 1e-9 {
                Err(format!("spend {spend}"))
            } else {
                Ok(())
            }
        })
        .await;
    }
    let spent: f64 = c.get("mg:{fleet-budget}:spend").expect("spend");
    assert!(
        ok >= 8,
        "the budget admits at least 8 requests of 12.5: {ok}"
    );
    assert!(
        spent <= 100.0 + 4.0 * 12.5,
        "overshoot beyond the 4 in flight: {spent}"
    );
    assert!(refused > 0);
    // Both gateways now refuse, whichever served the requests.
    for g in &gs {
        let (status, e) =
            common::error_of(send(&g.main, "/v1/chat/completions", Some(key), &body, &[]).await)
                .await;
        assert_eq!(
            (status, e["code"].as_str()),
            (402, Some("insufficient_balance"))
        );
    }
}

/// Redis that stalls past `redis_timeout_ms` (frozen; it runs what was sent once it resumes):
/// the requests go on under local limits, and the admissions the gateway gave up on leave no
/// concurrency slot or request taken behind them (they locked the key out for the leases' 30 s).
#[tokio::test(flavor = "multi_thread")]
async fn admissions_given_up_on_a_stalled_redis_take_no_slot_once_it_resumes() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "");
    assert_eq!(chat(&gs[0].main, common::CONC_KEY).await.status(), 200);
    redis.signal("-STOP");
    // max_concurrent = 2: two admissions sent to the frozen Redis, each given up on.
    for _ in 0..2 {
        assert_eq!(chat(&gs[0].main, common::CONC_KEY).await.status(), 200);
    }
    redis.signal("-CONT");
    let leases = || {
        let mut c = redis.conn();
        c.zcard::<_, u64>("mg:{conc}:lease").expect("zcard")
    };
    common::eventually_async(
        Duration::from_secs(5),
        "slots not released",
        async || match leases() {
            0 => Ok(()),
            n => Err(format!("{n} slots held by nothing")),
        },
    )
    .await;
    common::eventually_async(
        Duration::from_secs(5),
        "not served through redis again",
        async || {
            // Redis is tried again a second after it failed.
            let s = chat(&gs[1].main, common::CONC_KEY).await.status();
            let used: bool = redis.conn().exists("mg:{conc}:gone").expect("exists");
            assert!(used, "nothing was given up on");
            if s == 200 && metric(&gs[1], "modelgate_limits_fallback_total").await == 0.0 {
                Ok(())
            } else {
                Err(format!("status {s}"))
            }
        },
    )
    .await;
}

/// Redis restarted empty (its spend figures gone): a key that spent its budget stays refused,
/// the gateway's own figure counting as much as Redis's (it took Redis's alone, and let the
/// key on until the figures were filled again).
#[tokio::test(flavor = "multi_thread")]
async fn a_spent_budget_stays_refused_when_redis_comes_back_empty() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, AFTER);
    let g = &gs[0];
    // priced-model costs 12.5 a request; "budgeted" has 10.
    let body = chat_body("priced-model", false);
    let status = || async {
        send(
            &g.main,
            "/v1/chat/completions",
            Some(common::BUDGET_KEY),
            &body,
            &[],
        )
        .await
        .status()
        .as_u16()
    };
    assert_eq!(status().await, 200);
    common::eventually_async(
        Duration::from_secs(5),
        "the budget never ran out",
        async || match status().await {
            402 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
    let _: () = redis::cmd("FLUSHALL")
        .query(&mut redis.conn())
        .expect("flush");
    for _ in 0..5 {
        assert_eq!(status().await, 402);
    }
}

/// Redis killed: with `on_redis_down = "local"` requests go on under each gateway's own limits
/// (counted in the metrics); Redis back: limits are shared again.
#[tokio::test(flavor = "multi_thread")]
async fn redis_down_falls_back_to_local_limits_and_recovers() {
    let Some(mut redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "on_redis_down = \"local\"\n");
    assert_eq!(chat(&gs[0].direct, common::RPM100_KEY).await.status(), 200);
    assert_eq!(metric(&gs[0], "modelgate_redis_up").await, 1.0);
    redis.down();
    for _ in 0..5 {
        for g in &gs {
            assert_eq!(chat(&g.direct, common::RPM100_KEY).await.status(), 200);
        }
    }
    assert_eq!(metric(&gs[0], "modelgate_redis_up").await, 0.0);
    assert!(metric(&gs[0], "modelgate_limits_fallback_total").await >= 5.0);
    redis.up();
    // Within a few retries the gateways count in Redis again.
    let mut c = redis.conn();
    common::eventually_async(
        Duration::from_secs(10),
        "limits not shared again",
        async || {
            assert_eq!(chat(&gs[1].direct, common::RPM100_KEY).await.status(), 200);
            if c.zcard::<_, u64>("mg:{rpm100}:req").expect("zcard") > 0 {
                Ok(())
            } else {
                Err(String::new())
            }
        },
    )
    .await;
    assert_eq!(metric(&gs[1], "modelgate_redis_up").await, 1.0);
}

/// `on_redis_down = "deny"`: keys with limits are refused with 503 and Retry-After while Redis
/// is away; a key without limits is served.
#[tokio::test(flavor = "multi_thread")]
async fn redis_down_with_deny_refuses_limited_keys() {
    let Some(mut redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "on_redis_down = \"deny\"\n");
    redis.down();
    let r = chat(&gs[0].direct, common::RPM100_KEY).await;
    assert_eq!(r.headers()["retry-after"], "1");
    let (status, e) = common::error_of(r).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (503, Some("rate_limiter_unavailable"))
    );
    assert_eq!(chat(&gs[0].direct, common::KEY).await.status(), 200);
    redis.up();
    common::eventually_async(
        Duration::from_secs(10),
        "still refused after redis came back",
        async || match chat(&gs[0].direct, common::RPM100_KEY)
            .await
            .status()
            .as_u16()
        {
            200 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
}

/// `budget_mode = "reserve"` (the default): 200 clients across two gateways hold their worst
/// cost in Redis, so together they spend at most the budget, and use it; a hold lives as a
/// lease (it expires if its gateway dies) and is gone once its request ends.
#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_clients_on_two_gateways_spend_at_most_the_budget() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "");
    // priced-model: 0.5 a request + 1 per token (12 tokens): 12.5 a request; budget 100.
    let key = "sk-test-fleet-budget-0012";
    let mut c = redis.conn();
    // A slow stream holds its reservation while it runs, as a lease of at most 30 s.
    let slow = {
        let base = gs[0].main.clone();
        tokio::spawn(async move {
            let r = send(
                &base,
                "/v1/chat/completions",
                Some(key),
                &chat_body("priced-model", true),
                &[("x-mock-delay-ms", "100")],
            )
            .await;
            assert_eq!(r.status(), 200);
            r.bytes().await.expect("stream")
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while c.hlen::<_, u64>("mg:{fleet-budget}:holdv").expect("hlen") == 0 {
        assert!(Instant::now() < deadline, "no hold");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let leases: Vec<(String, f64)> = c
        .zrange_withscores("mg:{fleet-budget}:hold", 0, -1)
        .expect("zrange");
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(&mut c).expect("time");
    let now_ms = (secs * 1000 + micros / 1000) as f64;
    assert_eq!(leases.len(), 1);
    assert!(leases[0].1 - now_ms <= 30_000.0, "{leases:?}");
    slow.await.expect("slow");
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let base = gs[i % 2].direct.clone();
            tokio::spawn(async move {
                let body = chat_body("priced-model", false);
                loop {
                    let r = send(&base, "/v1/chat/completions", Some(key), &body, &[]).await;
                    match r.status().as_u16() {
                        200 => {
                            r.bytes().await.expect("body");
                        }
                        429 => tokio::time::sleep(Duration::from_millis(20 + i as u64 % 30)).await,
                        402 => return,
                        s => panic!("status {s}"),
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    common::eventually_async(
        Duration::from_secs(5),
        "holds left behind",
        async || match c.hlen::<_, u64>("mg:{fleet-budget}:holdv").expect("hlen") {
            0 => Ok(()),
            n => Err(format!("{n} holds")),
        },
    )
    .await;
    let spent: f64 = c.get("mg:{fleet-budget}:spend").expect("spend");
    assert!(spent <= 100.0 + 1e-9, "spent {spent} of 100");
    assert!(spent >= 75.0, "the budget was used: {spent}");
}

/// A hold outlives its first lease while its request runs: the gateway renews both the hold
/// and its amount (an amount left to expire would count as nothing, and let other requests
/// spend what the running one holds).
#[tokio::test(flavor = "multi_thread")]
async fn a_long_request_keeps_its_hold_and_its_amount() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "");
    let key = "sk-test-fleet-budget-0012";
    let mut c = redis.conn();
    // 12 chunks 1.5 s apart: past the first renewal (10 s after the hold).
    let slow = {
        let base = gs[0].main.clone();
        tokio::spawn(async move {
            let r = send(
                &base,
                "/v1/chat/completions",
                Some(key),
                &chat_body("priced-model", true),
                &[("x-mock-chunks", "12"), ("x-mock-delay-ms", "1500")],
            )
            .await;
            assert_eq!(r.status(), 200);
            r.bytes().await.expect("stream")
        })
    };
    let first = common::eventually_async(Duration::from_secs(5), "no hold", async || {
        let holds: Vec<(String, f64)> = c
            .zrange_withscores("mg:{fleet-budget}:hold", 0, -1)
            .expect("zrange");
        holds.first().map(|h| h.1).ok_or_else(|| "none".to_string())
    })
    .await;
    common::eventually_async(
        Duration::from_secs(15),
        "the hold was not renewed",
        async || {
            let holds: Vec<(String, f64)> = c
                .zrange_withscores("mg:{fleet-budget}:hold", 0, -1)
                .expect("zrange");
            match holds.first() {
                Some(h) if h.1 > first + 5_000.0 => Ok(()),
                h => Err(format!("{h:?}")),
            }
        },
    )
    .await;
    let amounts: i64 = redis::cmd("PTTL")
        .arg("mg:{fleet-budget}:holdv")
        .query(&mut c)
        .expect("pttl");
    assert!(amounts > 25_000, "the amounts expire in {amounts} ms");
    assert_eq!(
        c.hlen::<_, u64>("mg:{fleet-budget}:holdv").expect("hlen"),
        1
    );
    slow.await.expect("slow");
}

/// 200 plain clients and 20 streams from an upstream that ignores the output limit, across
/// two gateways sharing Redis: together they spend at most the budget plus one output event's
/// cost a stream (1.0 here), and use it.
#[tokio::test(flavor = "multi_thread")]
async fn plain_clients_and_cut_streams_on_two_gateways_spend_at_most_the_budget() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let gs = fleet(&redis, "");
    let key = "sk-test-fleet-budget-0012";
    let client = |i: usize, stream: bool| {
        let base = gs[i % 2].direct.clone();
        tokio::spawn(async move {
            let mut body = chat_body("priced-model", stream);
            let headers: &[(&str, &str)] = if stream {
                body["max_tokens"] = serde_json::json!(10);
                &[("x-mock-chunks", "5000"), ("x-mock-ignore-max-tokens", "1")]
            } else {
                &[]
            };
            loop {
                let r = send(&base, "/v1/chat/completions", Some(key), &body, headers).await;
                match r.status().as_u16() {
                    200 => {
                        r.bytes().await.expect("body");
                    }
                    429 => tokio::time::sleep(Duration::from_millis(20 + i as u64 % 30)).await,
                    402 => return,
                    s => panic!("status {s}"),
                }
            }
        })
    };
    let tasks: Vec<_> = (0..20)
        .map(|i| client(i, true))
        .chain((0..200).map(|i| client(i, false)))
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let mut c = redis.conn();
    common::eventually_async(
        Duration::from_secs(5),
        "holds left behind",
        async || match c.hlen::<_, u64>("mg:{fleet-budget}:holdv").expect("hlen") {
            0 => Ok(()),
            n => Err(format!("{n} holds")),
        },
    )
    .await;
    let spent: f64 = c.get("mg:{fleet-budget}:spend").expect("spend");
    assert!(spent <= 100.0 + 20.0 + 1e-9, "spent {spent} of 100");
    assert!(spent >= 75.0, "the budget was used: {spent}");
}

/// The holds of a gateway that died are released within their lease (30 s): until then
/// another gateway answers 429 `budget_held`, then serves the key again.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_gateways_holds_expire_with_their_lease() {
    let Some(redis) = Redis::start_or_skip() else {
        return;
    };
    let [mut dying, other] = fleet(&redis, "");
    let key = "sk-test-fleet-budget-0012";
    // A slow stream that names no limit holds what is left of the budget.
    let slow = {
        let base = dying.main.clone();
        tokio::spawn(async move {
            let r = send(
                &base,
                "/v1/chat/completions",
                Some(key),
                &chat_body("priced-model", true),
                &[("x-mock-chunks", "100"), ("x-mock-delay-ms", "1000")],
            )
            .await;
            assert_eq!(r.status(), 200);
            let _ = r.bytes().await;
        })
    };
    let mut c = redis.conn();
    common::eventually_async(Duration::from_secs(5), "no hold", async || {
        match c.hlen::<_, u64>("mg:{fleet-budget}:holdv").expect("hlen") {
            0 => Err("none".to_string()),
            _ => Ok(()),
        }
    })
    .await;
    let chat = async || {
        send(
            &other.direct,
            "/v1/chat/completions",
            Some(key),
            &chat_body("priced-model", false),
            &[],
        )
        .await
    };
    let r = chat().await;
    let (status, e) = common::error_of(r).await;
    assert_eq!(
        (status, e["code"].as_str()),
        (429, Some("rate_limit_exceeded")),
        "{e}"
    );
    let killed = Instant::now();
    dying.signal("-KILL");
    let _ = slow.await;
    common::eventually_async(
        Duration::from_secs(40),
        "the hold outlived its lease",
        async || match chat().await.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("status {s}")),
        },
    )
    .await;
    assert!(
        killed.elapsed() <= Duration::from_secs(31),
        "{:?}",
        killed.elapsed()
    );
}
