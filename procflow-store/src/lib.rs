//! Storage for procflow (work in progress).
