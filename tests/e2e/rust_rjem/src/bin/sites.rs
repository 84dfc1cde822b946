// sites: the std-collection leaks of tests/e2e/sites/leaks.rs under the `_rjem_` jemalloc
// (the crate's global allocator, see lib.rs). Prints "pid=<pid>"; exit 0.
use rjem_leaky::Jemalloc;

#[global_allocator]
static GLOBAL: Jemalloc = Jemalloc;

#[path = "../../../sites/leaks.rs"]
mod leaks;

fn main() {
    println!("pid={}", std::process::id());
    leaks::run_all();
}
