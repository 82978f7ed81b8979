#!/usr/bin/env bash
# Runs every test of the workspace. Installs what the tests need where it is missing
# (Debian packages: redis-server, redis-tools, memcached, curl, faketime, openssl; Python
# packages: grpcio, xds-protos, redis);
# tests start their own servers on free ports and stop them by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v memcached >/dev/null || missing+=(memcached)
command -v curl >/dev/null || missing+=(curl)
command -v faketime >/dev/null || missing+=(faketime)
command -v openssl >/dev/null || missing+=(openssl)
if ((${#missing[@]})); then
    scripts/apt-install.sh "${missing[@]}"
fi

# Python clients for the cross-language tests (Envoy's protocol via grpcio + xds-protos,
# the Redis protocol via redis-py).
python3 -c "import grpc, envoy.service.ratelimit.v3.rls_pb2, redis" 2>/dev/null ||
    python3 -m pip install --quiet grpcio xds-protos redis

cargo test --workspace --locked "$@"
