/// jemalloc: it gives memory back after a burst of streams closes (glibc kept its arenas), and
/// per request it is as fast; see README, Performance.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    modelgate::cli::run()
}
