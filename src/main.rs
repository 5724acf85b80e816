//! The `fga-relay` binary: everything is in the library; see `fga_relay::cli`.

/// mimalloc rather than glibc's malloc: the stream allocates and frees small buffers for every
/// row (its payload, its tuple keys, the Write's body), and glibc's allocator took about a sixth
/// of the relay's CPU in a burn-down's profile (BENCHMARKS.md). Built without transparent huge
/// pages (`no_thp`): with them, its arenas took 7 MiB more resident memory for nothing.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    fga_relay::cli::main()
}
