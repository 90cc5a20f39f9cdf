//! The allocator of the `rkube` process: the system's (glibc's malloc), except that the buffers
//! sled writes its log through are kept for reuse.
//!
//! sled fills its log one segment buffer at a time: a new allocation of its segment size
//! (512 KiB), aligned to 8 KiB, for every segment, freed once the segment is written. glibc
//! gave the memory of a freed buffer back to the kernel, so every new one was faulted in, page
//! by page, as sled serialized into it. Under `etcdctl check perf --load=l` a member writes
//! about 57 MB/s of sled log; the members took 7,500 page faults a second each, and page faults
//! were 7.6% of the machine's CPU samples (`perf record -a`; two thirds of them in sled's
//! serialization into a new buffer). [`Allocator`] keeps up to [`KEPT`] freed buffers of that
//! shape and hands them out again: 1,750 faults a second, 0.8% of the samples (BENCHMARKS.md,
//! 2026-12-07 21:00). Every other allocation goes to the system allocator as it is. The kept
//! buffers come from the system allocator, allocated with the layout they are handed out for,
//! so any of them can be handed to whoever asks for that layout, or freed to the system.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

/// The alignment of sled's segment buffers (a page of sled's log). Whoever asks for the kept
/// layout may be handed a kept buffer: it is the system allocator's block of that layout.
const ALIGN: usize = 8192;
/// Freed buffers with [`ALIGN`] at least this large are kept.
const MIN_SIZE: usize = 64 * 1024;
/// Most buffers kept: sled has one being filled and a few being written at a time.
pub const KEPT: usize = 4;

/// The system allocator, keeping sled's freed segment buffers (see the module doc).
pub struct Allocator {
    /// Kept buffers; null where there is none.
    slots: [AtomicPtr<u8>; KEPT],
    /// The size of the buffers kept: the first one freed sets it (sled's segment size is one
    /// setting per process); 0 until then.
    size: AtomicUsize,
}

impl Allocator {
    pub const fn new() -> Self {
        Self {
            slots: [const { AtomicPtr::new(ptr::null_mut()) }; KEPT],
            size: AtomicUsize::new(0),
        }
    }

    fn keeps(&self, layout: Layout) -> bool {
        layout.align() == ALIGN && layout.size() == self.size.load(Ordering::Relaxed)
    }

    /// A kept buffer, if there is one.
    fn take(&self) -> Option<*mut u8> {
        self.slots.iter().find_map(|slot| {
            let p = slot.swap(ptr::null_mut(), Ordering::Acquire);
            (!p.is_null()).then_some(p)
        })
    }

    /// Keeps `p` if a slot is free.
    fn keep(&self, p: *mut u8) -> bool {
        self.slots.iter().any(|slot| {
            slot.compare_exchange(ptr::null_mut(), p, Ordering::Release, Ordering::Relaxed)
                .is_ok()
        })
    }

    /// How many buffers are kept now.
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !s.load(Ordering::Relaxed).is_null())
            .count()
    }
}

impl Default for Allocator {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block handed out comes from `System` with the layout asked for (a kept buffer
// was allocated by `System` with the same size and alignment, and is handed out once: `take`
// swaps it out of its slot), and every block is either kept or freed to `System` with the
// layout it was allocated with.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if self.keeps(layout) {
            if let Some(p) = self.take() {
                return p;
            }
        }
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        if layout.align() == ALIGN && layout.size() >= MIN_SIZE {
            // The first buffer of this shape freed sets the size kept.
            let _ =
                self.size
                    .compare_exchange(0, layout.size(), Ordering::Relaxed, Ordering::Relaxed);
            if self.keeps(layout) && self.keep(p) {
                return;
            }
        }
        // SAFETY: `p` was allocated by `System` with `layout` (see the impl's comment).
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, as GlobalAlloc requires.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `p` was allocated by `System` with `layout`, kept buffers included.
        unsafe { System.realloc(p, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT: usize = 512 * 1024;

    fn segment() -> Layout {
        Layout::from_size_align(SEGMENT, ALIGN).expect("layout")
    }

    /// Frees what `a` keeps, as the process's allocator never has to.
    fn drain(a: &Allocator) {
        while let Some(p) = a.take() {
            // SAFETY: kept buffers were allocated by `System` with the kept layout.
            unsafe { System.dealloc(p, segment()) };
        }
    }

    #[test]
    fn a_freed_segment_buffer_is_handed_out_again() {
        let a = Allocator::new();
        // SAFETY: allocations with a valid layout, each freed once with it.
        unsafe {
            let first = a.alloc(segment());
            assert!(!first.is_null());
            first.write_bytes(7, SEGMENT);
            a.dealloc(first, segment());
            assert_eq!(a.kept(), 1);
            let again = a.alloc(segment());
            assert_eq!(again, first, "the kept buffer is reused");
            assert_eq!(a.kept(), 0);
            a.dealloc(again, segment());
        }
        drain(&a);
    }

    #[test]
    fn at_most_kept_buffers_are_kept_and_other_layouts_never() {
        let a = Allocator::new();
        // SAFETY: allocations with valid layouts, each freed once with its own.
        unsafe {
            let bufs: Vec<*mut u8> = (0..KEPT + 3).map(|_| a.alloc(segment())).collect();
            for p in bufs {
                a.dealloc(p, segment());
            }
            assert_eq!(a.kept(), KEPT);
            // Another size with the same alignment, once the size is set, and small or
            // differently aligned blocks go to the system allocator.
            for layout in [
                Layout::from_size_align(2 * SEGMENT, ALIGN).expect("layout"),
                Layout::from_size_align(SEGMENT, 4096).expect("layout"),
                Layout::from_size_align(64, 8).expect("layout"),
            ] {
                let p = a.alloc(layout);
                assert!(!p.is_null());
                a.dealloc(p, layout);
                assert_eq!(a.kept(), KEPT, "{layout:?} was not kept");
            }
            // A kept buffer is reallocated by the system allocator like any other block.
            let p = a.alloc(segment());
            let grown = a.realloc(p, segment(), 2 * SEGMENT);
            assert!(!grown.is_null());
            System.dealloc(
                grown,
                Layout::from_size_align(2 * SEGMENT, ALIGN).expect("layout"),
            );
        }
        drain(&a);
    }
}
