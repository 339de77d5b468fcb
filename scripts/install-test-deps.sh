#!/usr/bin/env bash
# Installs, from Debian's packages, what the tests need when it is missing: etcd (the etcd
# tests start a real 3-member cluster on 127.0.0.1), protoc (etcd-client's build),
# PostgreSQL's server (the PostgreSQL tests run initdb and a server in a temp dir), and
# Chromium with its ChromeDriver (the admin page's test drives a headless browser), and
# curl (CI reads the admin example's /metrics).
set -euo pipefail
missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# Debian puts the server's binaries in /usr/lib/postgresql/<major>/bin, off the PATH.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# .ci/run reads the admin example's /metrics with curl.
command -v curl >/dev/null 2>&1 || missing+=(curl)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "== apt-get install ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
