//! Everything the kernel programs and the agent must agree on: the types stored in maps, the
//! map and program names, the counter layout and the pure verdict logic.
//!
//! Rules for this crate: `no_std`; every type that crosses the kernel boundary is `#[repr(C)]`
//! with explicit padding and a compile-time size and alignment assert; enum-like fields are
//! stored as plain integers (a value written by another program version must never become an
//! invalid Rust enum); `aya::Pod` impls exist only behind the `user` feature.
#![no_std]

pub mod addr;
pub mod config;
pub mod counters;
pub mod filter;
pub mod iface;
pub mod names;
pub mod probe;
pub mod sample;
pub mod slots;
pub mod verdict;
pub mod watch;

#[cfg(feature = "user")]
mod pod;

#[cfg(all(test, feature = "names"))]
mod vocabulary_tests;

/// Asserts at compile time that a boundary type has exactly the given size and alignment.
#[macro_export]
macro_rules! assert_layout {
    ($ty:ty, size = $size:expr, align = $align:expr) => {
        const _: () = assert!(core::mem::size_of::<$ty>() == $size);
        const _: () = assert!(core::mem::align_of::<$ty>() == $align);
    };
}

/// Asserts at compile time the byte offset of every listed field of a boundary type. List every
/// field: together with `assert_layout!` this pins the whole layout the other side reads.
#[macro_export]
macro_rules! assert_offsets {
    ($ty:ident { $($field:ident : $offset:expr),+ $(,)? }) => {
        $(const _: () = assert!(core::mem::offset_of!($ty, $field) == $offset);)+
        // A field added without an offset assert makes this destructuring fail to compile.
        const _: fn($ty) = |value: $ty| {
            let $ty { $($field: _),+ } = value;
        };
    };
}
