//! Criterion benches of the per-request hot path: the JSON body probe, the model splice and
//! the key lookup. Run: `cargo bench --bench hot_paths`.

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

fn keys(n: usize) -> KeyTable {
    let mut text = String::with_capacity(n * 60);
    for i in 0..n {
        text.push_str(&format!(
            "[[keys]]\nid = \"k{i}\"\nsecret = \"sk-bench-{i:08}\"\n"
        ));
    }
    KeyTable::parse("keys.toml", &text).expect("keys")
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
    let table = keys(100_000);
    let header = b"Bearer sk-bench-00054321".to_vec();
    c.bench_function("authenticate (100k keys)", |b| {
        b.iter(|| authenticate(&table, Some(black_box(&header)), 1_800_000_000).expect("key"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
