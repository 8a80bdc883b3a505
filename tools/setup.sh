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
  clang libclang-rt-14-dev
  libmicrohttpd-dev prometheus curl
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js and npm for the deploy/ schema checks, from Debian's archive only where no node is
# installed already (a machine with another Node.js, e.g. NodeSource's, keeps it: Debian's npm
# package would conflict with it).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done"
fi

# The offline schema checks of deploy/ (//deploy:manifests_test) use pinned npm packages:
# install them from the committed lock file when missing or older than it (needs npm and the
# npm registry once; a failure here only fails those tests, with a message saying why).
validate="$(dirname "$0")/../deploy/validate"
if [[ ! -f "$validate/node_modules/.package-lock.json" || \
      "$validate/package-lock.json" -nt "$validate/node_modules/.package-lock.json" ]]; then
  if command -v npm >/dev/null 2>&1; then
    npm ci --prefix "$validate" --no-audit --no-fund --loglevel=error ||
      echo "setup: npm ci --prefix deploy/validate failed"
  else
    echo "setup: npm not found: //deploy tests will fail"
  fi
fi

