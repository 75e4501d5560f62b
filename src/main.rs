/// jemalloc: it gives memory back after a burst of streams closes (glibc kept its arenas), and
/// per request it is as fast; see README, Performance. It also serves the C code's `malloc`
/// (`unprefixed_malloc_on_supported_platforms`): SQLite's page cache, given back when the
/// writer idles, stayed resident in glibc's arenas (tens of MB after a load).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    modelgate::cli::run()
}
