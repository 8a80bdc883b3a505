#!/usr/bin/env bash
# Runs deploy/validate/check.js MODE for a Bazel sh_test (see deploy/BUILD.bazel).
#   run_check.sh manifests | drift | docker
# The checks read the real source tree, found through this script's runfiles symlink: the npm
# packages (deploy/validate/node_modules, installed by tools/setup.sh from the committed
# package-lock.json) are not Bazel targets. The data deps still make Bazel rerun the test when
# any checked file changes.
set -euo pipefail
mode="$1"
script="$(readlink -f deploy/validate/check.js)"
root="$(cd "$(dirname "$script")/../.." && pwd)"

need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "FAIL: $1 not found on PATH ($2)"
    exit 1
  fi
}
need node "node and npm are preinstalled on kvrm's build machines"
if [[ ! -f "$root/deploy/validate/node_modules/kubernetes-models/package.json" ]]; then
  echo "FAIL: $root/deploy/validate/node_modules is missing: run tools/setup.sh" \
       "(it runs npm ci --prefix deploy/validate)"
  exit 1
fi

if [[ "$mode" != docker ]]; then
  need promtool "Debian package prometheus, installed by tools/setup.sh"
  # kubectl is not in tools/setup.sh: Debian's kubernetes-client (1.20) embeds kustomize v2,
  # which cannot build these kustomizations (resources: directories, patches:). Without a
  # kubectl >= 1.21 the rendering checks cannot run at all: say so and skip.
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "SKIPPED: kubectl (>= 1.21, for kustomize >= v4) is not installed; nothing rendered"
    exit 0
  fi
fi

args=("$mode" "$root")
if [[ "$mode" == drift ]]; then args+=("$(readlink -f server/kvrmd)"); fi
exec node "$script" "${args[@]}"
