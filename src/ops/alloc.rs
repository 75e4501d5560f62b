//! Memory a proxy thread keeps cached goes back once the thread goes idle. jemalloc keeps a
//! cache of freed blocks in each thread and trims it only as that thread allocates (one size
//! class each time another 64 KiB has been allocated: `tcache_gc_incr_bytes`). A proxy thread
//! that goes quiet after a burst of streams allocates nothing more, and its cache holds the
//! pages under it: about 4 MB after 2,000 streams. So each proxy thread, a couple of seconds
//! after its last request, allocates and frees a few large blocks (never touched: no page is
//! written), enough for that trimming to pass over every size class a few times. Emptying the
//! cache directly (`thread.tcache.flush`) would take a foreign call, and this crate has no
//! `unsafe`.

use std::cell::Cell;
use std::time::Duration;

/// How long a proxy thread goes without a new request before its cache is trimmed.
const IDLE: Duration = Duration::from_secs(2);
/// Bytes per block: above the largest size jemalloc caches per thread (64 KiB, `tcache_max` in
/// `.cargo/config.toml`), so the blocks themselves never enter the cache, and exactly one
/// trimming step each.
const BLOCK: usize = 128 * 1024;
/// Blocks per trim: four passes over jemalloc's 45 cached size classes, each taking three
/// quarters of what a class held unused.
const BLOCKS: usize = 4 * 45;

thread_local! {
    static REQUESTS: Cell<u64> = const { Cell::new(0) };
}

/// A request starts on this proxy thread (a runtime of one thread, no work stealing). The
/// first one starts the thread's idle watch, a task that trims the cache once the thread has
/// had no new request for `IDLE` after having had some.
pub fn request_started() {
    let n = REQUESTS.with(|r| {
        let n = r.get() + 1;
        r.set(n);
        n
    });
    if n != 1 {
        return;
    }
    // One per runtime thread, for the process's life.
    #[allow(clippy::disallowed_methods)]
    tokio::spawn(async {
        let mut seen = REQUESTS.with(Cell::get);
        let mut trimmed = false;
        loop {
            tokio::time::sleep(IDLE).await;
            let now = REQUESTS.with(Cell::get);
            if now != seen {
                seen = now;
                trimmed = false;
            } else if !trimmed {
                trim_thread_cache();
                trimmed = true;
            }
        }
    });
}

/// Allocates and frees `BLOCKS` blocks of `BLOCK` bytes on the calling thread (see the module).
pub fn trim_thread_cache() {
    for _ in 0..BLOCKS {
        std::hint::black_box(Vec::<u8>::with_capacity(BLOCK));
    }
}
