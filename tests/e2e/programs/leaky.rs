// leaky.rs: deterministic leaking Rust program for heapscope's e2e tests.
//
// Build (plain rustc, no crates):
//     rustc -g -C opt-level=1 leaky.rs -o leaky_rust_legacy             (legacy mangling, _ZN...)
//     rustc -g -C opt-level=1 -C symbol-mangling-version=v0 leaky.rs -o leaky_rust_v0   (_R...)
// It uses Rust's default System allocator, i.e. libc malloc/calloc/free, so
// LD_PRELOAD=libjemalloc.so.2 profiles it. No arguments, no output, exit 0.
//
// Allocation path: app::cache::Store::insert -> alloc::... / __rust_alloc ->
// __rdl_alloc -> <std::alloc::System as GlobalAlloc>::alloc -> malloc. A good
// report prunes everything up to and including the Rust allocator shims and
// shows app::cache::Store::insert (demangled, legacy hash suffix removed).
//
// Truth, live at exit (jemalloc usable sizes):
//
//   function                          what                              objects  usable      bytes
//   leaky::app::cache::Store::insert  Box::leak(Box<[u8; 200]>)           1,000     224    224,000
//   leaky::app::cache::Store::insert  Vec<u8> with_capacity(1000),          500    1024    512,000
//                                     mem::forget
//   leaky::app::cache::Store::grow    Vec<u64> pushed 10,000 times,           1  131,072    131,072
//                                     mem::forget (capacity 16,384 * 8 B;
//                                     smaller buffers freed by growth)
//   -----------------------------------------------------------------------------------------
//   program total                                                         1,501              867,072
//
// plus the runtime's own live allocations: one 640 B block from the Rust std
// runtime and libstdc++'s 81,920 B emergency pool (Debian's libjemalloc.so.2
// links libstdc++), so jeprof's in-use total is 949,632 B in 1,503 objects.
// The crate is named "leaky" (rustc derives it from the file name), so the
// full paths are leaky::app::cache::Store::insert / ::grow.

mod app {
    pub mod cache {
        pub struct Store {
            pub inserted: usize,
        }

        impl Store {
            pub fn new() -> Store {
                Store { inserted: 0 }
            }

            #[inline(never)]
            pub fn insert(&mut self, key: u8) {
                // Box::leak: a [u8; 200] that is never freed.
                let b: &'static mut [u8; 200] = Box::leak(Box::new([key; 200])); // LEAK:box
                b[1] = key.wrapping_add(1);
                // black_box: otherwise LLVM deletes the unused allocation.
                std::hint::black_box(&*b);
                if self.inserted % 2 == 0 {
                    // Vec leaked with mem::forget.
                    let mut v: Vec<u8> = Vec::with_capacity(1000); // LEAK:vec
                    v.push(key);
                    std::hint::black_box(v.as_ptr());
                    std::mem::forget(v);
                }
                self.inserted += 1;
            }

            #[inline(never)]
            pub fn grow(&mut self, n: u64) {
                let mut v: Vec<u64> = Vec::new();
                for i in 0..n {
                    v.push(i); // LEAK:grow
                }
                std::hint::black_box(v.as_ptr());
                std::mem::forget(v);
            }
        }
    }
}

fn main() {
    let mut store = app::cache::Store::new();
    for i in 0..1000u32 {
        store.insert((i % 251) as u8);
    }
    store.grow(10_000);
    std::hint::black_box(&store);
}
