//! Criterion benches of the per-request hot path: the JSON body probe, the model splice, the
//! key lookup and admission, the SSE meter and the metrics at a request's end. Run:
//! `cargo bench --bench hot_paths`.

use bytes::Bytes;
use criterion::{Criterion, black_box, criterion_group, criterion_main};
use modelgate::auth::authenticate;
use modelgate::config::keys::KeyTable;
use modelgate::route::body::{for_upstream, probe_json};

fn chat_body(words: usize) -> Vec<u8> {
    let content = "lorem ipsum ".repeat(words);
    serde_json::to_vec(&serde_json::json!({
        "model": "echo-1",
        "stream": true,
        "temperature": 0.2,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content}
        ]
    }))
    .expect("json")
}

/// A keys file of `n` keys, every tenth with limits and a model glob, like a real one.
fn keys_file(n: usize) -> String {
    let mut text = String::with_capacity(n * 120);
    for i in 0..n {
        text.push_str(&format!(
            "[[keys]]\nid = \"k{i}\"\nsecret = \"sk-bench-{i:08}\"\n"
        ));
        if i % 10 == 0 {
            text.push_str("models = [\"gpt-4o*\", \"echo-*\"]\nrpm = 600\ntpm = 100000\nmax_concurrent = 20\n");
        }
    }
    text
}

fn keys(n: usize) -> KeyTable {
    KeyTable::parse("keys.toml", &keys_file(n)).expect("keys")
}

fn bench(c: &mut Criterion) {
    for (name, words) in [("probe_json 0.5KB", 30), ("probe_json 8KB", 650)] {
        let body = chat_body(words);
        c.bench_function(name, |b| {
            b.iter(|| probe_json(black_box(&body)).expect("probe"))
        });
    }
    let body = Bytes::from(chat_body(30));
    let probe = probe_json(&body).expect("probe");
    c.bench_function("for_upstream 0.5KB (rename + include_usage)", |b| {
        b.iter(|| for_upstream(black_box(&body), &probe, Some("upstream/model-v2"), true))
    });
    let file = keys_file(100_000);
    let mut group = c.benchmark_group("keys file");
    group.sample_size(10);
    group.bench_function("parse + validate + index 100k keys", |b| {
        b.iter(|| KeyTable::parse("keys.toml", black_box(&file)).expect("keys"))
    });
    group.finish();
    let table = keys(100_000);
    let header = b"Bearer sk-bench-00054321".to_vec();
    c.bench_function("authenticate (100k keys)", |b| {
        b.iter(|| authenticate(&table, Some(black_box(&header)), 1_800_000_000).expect("key"))
    });
}

/// The whole per-request decision before routing: auth, permission, limits.
fn admit_path(c: &mut Criterion) {
    let table = keys(100_000);
    let limiter = modelgate::limit::rate::Limiter::default();
    let header = b"Bearer sk-bench-00054320".to_vec(); // a key with rpm/tpm/max_concurrent
    c.bench_function("auth + permission + limits (100k keys)", |b| {
        b.iter(|| {
            let key = authenticate(&table, Some(black_box(&header)), 1_800_000_000).expect("key");
            assert!(key.may_use_model("echo-1"));
            let (slot, _) = limiter.admit(
                &key,
                std::time::Instant::now() - std::time::Duration::from_secs(120),
            );
            drop(slot);
        })
    });
}

/// Metering one streamed reply of 16 content events, as the mock sends it, in pieces.
fn meter(c: &mut Criterion) {
    use modelgate::meter::sse::SseMeter;
    let mut stream = String::new();
    let event = |delta: &str, usage: &str| {
        format!(
            "data: {{\"choices\":[{{\"delta\":{{{delta}}},\"finish_reason\":null,\"index\":0}}],\"created\":1795353265,\"id\":\"chatcmpl-1\",\"model\":\"echo-1\",\"object\":\"chat.completion.chunk\",\"usage\":{usage}}}\n\n"
        )
    };
    for i in 0..16 {
        stream.push_str(&event(&format!("\"content\":\"word{i} \""), "null"));
    }
    stream.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":16,\"total_tokens\":23}}\n\n");
    stream.push_str("data: [DONE]\n\n");
    let pieces: Vec<Bytes> = stream
        .as_bytes()
        .chunks(1460)
        .map(Bytes::copy_from_slice)
        .collect();
    for (name, strip) in [
        ("meter 16-event stream, observe", false),
        ("meter 16-event stream, strip usage", true),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                let mut m = SseMeter::new(strip);
                let last = pieces.len() - 1;
                for (i, p) in pieces.iter().enumerate() {
                    black_box(m.feed(p.clone(), i == last));
                }
                assert_eq!(m.usage.map(|u| u.total_tokens), Some(23));
            })
        });
    }
}

/// What a plain chat request's end costs in metrics: its counters and histograms, found by
/// their labels.
fn metrics(c: &mut Criterion) {
    let m = modelgate::ops::metrics::Metrics::new().expect("metrics");
    let end = modelgate::ops::metrics::RequestEnd {
        listener: "main",
        endpoint: "chat",
        model: "echo-1",
        status: 200,
        refusal: None,
        total: std::time::Duration::from_micros(900),
        upstream: Some(("mock", std::time::Duration::from_micros(700))),
        waited: std::time::Duration::ZERO,
        ttft: None,
        prompt_tokens: 12,
        completion_tokens: 30,
        cost: 0.000_02,
        key: Some("bench"),
    };
    c.bench_function("metrics: a plain request's end (+ one upstream try)", |b| {
        b.iter(|| {
            m.request_end(black_box(&end));
            m.attempt("mock", "http://127.0.0.1:9", "ok", false);
        })
    });
}

criterion_group!(benches, bench, admit_path, meter, metrics);
criterion_main!(benches);
