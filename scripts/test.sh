#!/usr/bin/env bash
# Runs every test of the workspace, then the Python bindings' tests. Installs what the tests
# need where it is missing (Debian packages: redis-server, redis-tools, memcached, curl,
# faketime, openssl, postgresql, and chromium for the live page's browser test; Python packages:
# grpcio, xds-protos, redis; a virtual environment in target/python-venv with
# bindings/python/requirements-test.txt and the sluice wheel built from this checkout);
# tests start their own servers on free ports and stop them by PID.
# Arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v memcached >/dev/null || missing+=(memcached)
command -v curl >/dev/null || missing+=(curl)
command -v faketime >/dev/null || missing+=(faketime)
command -v openssl >/dev/null || missing+=(openssl)
command -v chromium >/dev/null || missing+=(chromium)
# PostgreSQL's programs are off PATH on Debian (/usr/lib/postgresql/N/bin).
command -v pg_ctl >/dev/null || [[ -x $(ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | head -1) ]] ||
    missing+=(postgresql)
if ((${#missing[@]})); then
    scripts/apt-install.sh "${missing[@]}"
fi

# Python clients for the cross-language tests (Envoy's protocol via grpcio + xds-protos,
# the Redis protocol via redis-py).
python3 -c "import grpc, envoy.service.ratelimit.v3.rls_pb2, redis" 2>/dev/null ||
    python3 -m pip install --quiet grpcio xds-protos redis

cargo test --workspace --locked "$@"
# The tower layer without its default features (axum, the proof-of-work challenge), as a
# service built on hyper alone would use it.
cargo test -p sluice-tower --no-default-features --locked --tests

# The Python package, built from this checkout into its own virtual environment (maturin
# develop: the wheel is built and installed there), then its pytest suites. They use the
# `sluice` binary the cargo tests just built.
venv=target/python-venv
[[ -x $venv/bin/python ]] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r bindings/python/requirements-test.txt
VIRTUAL_ENV="$PWD/$venv" "$venv/bin/maturin" develop --quiet --locked \
    --manifest-path bindings/python/Cargo.toml
(cd bindings/python && SLUICE_BIN="$PWD/../../target/debug/sluice" "../../$venv/bin/python" -m pytest -q)
