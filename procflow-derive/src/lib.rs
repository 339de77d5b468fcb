//! Derive macro for procflow (work in progress).
