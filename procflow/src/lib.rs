//! procflow (work in progress).
