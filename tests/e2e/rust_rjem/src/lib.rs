// The `_rjem_` jemalloc global allocator shared by the crate's programs (main.rs, bin/sites.rs):
// jemalloc-sys linked statically with the tikv-jemallocator prefix, called the way
// tikv-jemallocator's `Jemalloc` calls it.
use core::alloc::{GlobalAlloc, Layout};
use jemalloc_sys as ffi;
use std::os::raw::{c_int, c_void};

/// The alignment every jemalloc allocation has without flags (x86-64: 16).
const MIN_ALIGN: usize = 16;

/// jemallocator's flag logic: ask for alignment only when the default is not enough.
fn layout_to_flags(align: usize, size: usize) -> c_int {
    if align <= MIN_ALIGN && align <= size {
        0
    } else {
        ffi::MALLOCX_ALIGN(align)
    }
}

/// The global allocator: every Rust allocation goes to _rjem_mallocx & co.
pub struct Jemalloc;

unsafe impl GlobalAlloc for Jemalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let flags = layout_to_flags(layout.align(), layout.size());
        ffi::mallocx(layout.size(), flags) as *mut u8
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let flags = layout_to_flags(layout.align(), layout.size());
        if flags == 0 {
            ffi::calloc(1, layout.size()) as *mut u8
        } else {
            ffi::mallocx(layout.size(), flags | ffi::MALLOCX_ZERO) as *mut u8
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let flags = layout_to_flags(layout.align(), layout.size());
        ffi::sdallocx(ptr as *mut c_void, layout.size(), flags)
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let flags = layout_to_flags(layout.align(), new_size);
        ffi::rallocx(ptr as *mut c_void, new_size, flags) as *mut u8
    }
}

