//! Hierarchical shared/exclusive locks on entity keys (being written).
