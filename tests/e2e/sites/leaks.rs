// leaks.rs: Rust leaks that go through the standard library, for heapscope's site tests.
//
// Included as a module by collections.rs (plain rustc, the system allocator: malloc under
// LD_PRELOAD=libjemalloc.so.2) and by rust_rjem/src/bin/sites.rs (jemalloc linked in with
// the `_rjem_` prefix). Every leak is allocated by std (Vec, String, format!, Box, HashMap,
// Arc) on behalf of one line of this file, marked LEAK:<tag>; everything is kept in a
// holder that is leaked, so it is live at exit. A report must name that line, not alloc::
// or hashbrown internals. Sizes are jemalloc size classes, so the truth is a count times a
// usable size:
//
//   tag       function      through                               count  each (usable)
//   vec       load_blobs    vec![0u8; 16384] (Vec from_elem)      1,500  16,384
//   string    collect_text  "x".repeat(4096) (String)             3,000   4,096
//   format    render_lines  format!("{:0>8000}", i) (grows 8..8192) 1,000   8,192
//   boxed     box_parts     Box::new([u8; 6000])                  1,200   6,144
//   hashmap   index_small   HashMap::with_capacity(3), (u64, [u8; 1000])  2,000  4,096 (its table)
//   arc       share_parts   Arc::new([u8; 10000]) (16 B header)    1,000  10,240
use std::collections::HashMap;
use std::sync::Arc;

pub const COUNTS: [(&str, usize, usize); 6] = [
    ("vec", 1500, 16384),
    ("string", 3000, 4096),
    ("format", 1000, 8192),
    ("boxed", 1200, 6144),
    ("hashmap", 2000, 4096),
    ("arc", 1000, 10240),
];

pub struct Keep {
    pub blobs: Vec<Vec<u8>>,
    pub text: Vec<String>,
    pub lines: Vec<String>,
    pub parts: Vec<Box<[u8; 6000]>>,
    pub maps: Vec<HashMap<u64, [u8; 1000]>>,
    pub shared: Vec<Arc<[u8; 10000]>>,
}

#[inline(never)]
pub fn load_blobs(keep: &mut Keep, n: usize) {
    for i in 0..n {
        let mut v = vec![0u8; 16384]; // LEAK:vec
        v[0] = i as u8;
        keep.blobs.push(v);
    }
}

#[inline(never)]
pub fn collect_text(keep: &mut Keep, n: usize) {
    for _ in 0..n {
        keep.text.push("x".repeat(4096)); // LEAK:string
    }
}

#[inline(never)]
pub fn render_lines(keep: &mut Keep, n: usize) {
    for i in 0..n {
        keep.lines.push(format!("{:0>8000}", i)); // LEAK:format
    }
}

#[inline(never)]
pub fn box_parts(keep: &mut Keep, n: usize) {
    for i in 0..n {
        keep.parts.push(Box::new([i as u8; 6000])); // LEAK:boxed
    }
}

#[inline(never)]
pub fn index_small(keep: &mut Keep, n: usize) {
    for i in 0..n {
        let mut m = HashMap::with_capacity(3); // LEAK:hashmap
        for k in 0..3u64 {
            m.insert(k + i as u64, [k as u8; 1000]);
        }
        keep.maps.push(m);
    }
}

#[inline(never)]
pub fn share_parts(keep: &mut Keep, n: usize) {
    for i in 0..n {
        keep.shared.push(Arc::new([i as u8; 10000])); // LEAK:arc
    }
}

/// Runs every leak once and leaks the holder; returns nothing, prints nothing.
pub fn run_all() {
    let keep = Box::leak(Box::new(Keep {
        blobs: Vec::with_capacity(1500),
        text: Vec::with_capacity(3000),
        lines: Vec::with_capacity(1000),
        parts: Vec::with_capacity(1200),
        maps: Vec::with_capacity(2000),
        shared: Vec::with_capacity(1000),
    }));
    load_blobs(keep, COUNTS[0].1);
    collect_text(keep, COUNTS[1].1);
    render_lines(keep, COUNTS[2].1);
    box_parts(keep, COUNTS[3].1);
    index_small(keep, COUNTS[4].1);
    share_parts(keep, COUNTS[5].1);
}
