#!/usr/bin/env bash
# Installs Debian packages, as root or with sudo: `scripts/apt-install.sh wrk valgrind`.
# For the scripts that set up what tests and benchmarks need where it is missing.
set -euo pipefail
(($#)) || exit 0
echo "apt-install.sh: installing $*" >&2
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
