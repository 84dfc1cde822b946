// rjem_leaky: deterministic leaking Rust program for heapscope's e2e tests.
//
// The global allocator is jemalloc linked statically through jemalloc-sys with the
// tikv-jemallocator `_rjem_` prefix (like tikv-jemallocator's `Jemalloc`): symbols are
// _rjem_mallocx / _rjem_sdallocx / _rjem_rallocx / _rjem_calloc, and jemalloc reads its
// options from _RJEM_MALLOC_CONF (MALLOC_CONF is ignored). No LD_PRELOAD is involved.
// No arguments, no output, exit 0.
//
// Allocation path of the leak: rjem_leaky::app::store::Store::insert -> alloc::... ->
// __rust_alloc -> <rjem_leaky::Jemalloc as GlobalAlloc>::alloc -> _rjem_mallocx ->
// _rjem_je_* internals. A good report prunes everything up to and including the Rust
// allocator shims and names rjem_leaky::app::store::Store::insert.
//
// Truth, live at exit (jemalloc usable sizes):
//
//   function                              what                         objects  usable       bytes
//   rjem_leaky::app::store::Store::insert Box::leak(Box<[u8; 1024]>)    20,000    1024  20,480,000
//
// Freed churn (not live): 50,000 x Vec<u8> of 4096 B, plus a Vec grown by realloc.

use rjem_leaky::Jemalloc;

#[global_allocator]
static GLOBAL: Jemalloc = Jemalloc;

mod app {
    pub mod store {
        pub struct Store {
            pub entries: Vec<&'static [u8; 1024]>,
        }

        impl Store {
            pub fn new() -> Store {
                Store { entries: Vec::new() }
            }

            /// The leak: every entry is a leaked 1 KiB box; the marker is on the Box::new line.
            #[inline(never)]
            pub fn insert(&mut self, seed: u8) {
                let block: &'static mut [u8; 1024] = Box::leak(Box::new([seed; 1024])); // LEAK:insert
                block[1023] = seed.wrapping_add(1);
                self.entries.push(std::hint::black_box(block));
            }
        }
    }

    pub mod churn {
        /// Allocates and frees: nothing of this is live at exit.
        #[inline(never)]
        pub fn churn(rounds: usize) -> usize {
            let mut total = 0usize;
            for i in 0..rounds {
                let mut v: Vec<u8> = Vec::with_capacity(4096);
                v.resize(4096, i as u8);
                total = total.wrapping_add(std::hint::black_box(&v)[i % 4096] as usize);
            }
            let mut grown: Vec<u64> = Vec::new();
            for i in 0..100_000u64 {
                grown.push(i); // realloc (rallocx) as it grows
            }
            total.wrapping_add(std::hint::black_box(&grown).len())
        }
    }
}

fn main() {
    let mut store = app::store::Store::new();
    for i in 0..20_000u32 {
        store.insert(i as u8);
    }
    let n = app::churn::churn(50_000);
    std::hint::black_box(n);
    // RJEM_STAY_SECONDS=N keeps the process alive (for heapscope attach), leaking slowly.
    if let Some(secs) = std::env::var("RJEM_STAY_SECONDS").ok().and_then(|v| v.parse::<u64>().ok()) {
        println!("ready");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < until {
            store.insert(7);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    // The Vec of pointers is freed; the 20,000 boxes it pointed to are not.
    drop(std::hint::black_box(store));
}
