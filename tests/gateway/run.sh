#!/usr/bin/env bash
# The HTTP/JSON gateway with real clients: etcd3gw (PyPI) and Patroni (Debian) with Debian's
# PostgreSQL 15, against three-member cairn clusters. Installs what it needs: Debian's patroni
# and postgresql-15 packages, and etcd3gw into a virtualenv under target/. Takes the cairn
# binary from $CAIRN_BIN or target/debug/cairn.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"

if ! command -v patroni >/dev/null 2>&1 || [ ! -x /usr/lib/postgresql/15/bin/postgres ]; then
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        patroni postgresql-15 >/dev/null
fi
# Debian starts a PostgreSQL cluster as a service; the test runs its own on free ports.
if command -v systemctl >/dev/null 2>&1; then systemctl stop postgresql >/dev/null 2>&1 || true; fi

venv="$root/target/py-gateway"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import etcd3gw' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet etcd3gw==2.4.2
fi

export CAIRN_BIN="${CAIRN_BIN:-$root/target/debug/cairn}"
cd "$here"
"$venv/bin/python" -W ignore::ResourceWarning -m unittest -v test_etcd3gw test_patroni
