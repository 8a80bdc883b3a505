#!/usr/bin/env bash
# Installs the Debian packages kvrm builds and tests with. Idempotent: installs only what is
# missing, and does nothing (no network) when everything is there.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-platforms bazel-rules-java bazel-skylib
  g++ pkg-config zlib1g-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libonig-dev libicu-dev nlohmann-json3-dev
  libmicrohttpd-dev prometheus
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
