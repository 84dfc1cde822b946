// collections.rs: the std-collection leaks of leaks.rs under the system allocator (malloc).
//
// Build:  rustc -g -C opt-level=2 collections.rs -o collections
// Run under LD_PRELOAD=libjemalloc.so.2 with prof:true. Prints "pid=<pid>"; exit 0.
mod leaks;

fn main() {
    println!("pid={}", std::process::id());
    leaks::run_all();
}
