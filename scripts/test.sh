#!/usr/bin/env bash
# Every test of the workspace, the etcd and PostgreSQL ones included (`--all-features`),
# after installing what they need when it is missing (scripts/install-test-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-test-deps.sh

exec cargo test --workspace --all-features "$@"
