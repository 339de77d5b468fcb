//! Workspace root package: owns the examples and the integration tests.
