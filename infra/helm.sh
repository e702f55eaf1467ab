#!/usr/bin/env bash
# Helm, for the suite's offline check of the Kubernetes chart (tests/deploy): built
# from the Go module proxy into ~/.cache/threadline/bin once (a few minutes), as
# helm's own docs allow; without Go it says so, and the check skips (fails with CI=true).
set -u
VERSION=v4.3.2
BIN="${THREADLINE_CACHE_DIR:-$HOME/.cache/threadline}/bin"
# A `go install` build has no version stamped in: a file beside it says which it is.
[ -x "$BIN/helm" ] && [ "$(cat "$BIN/helm.version" 2>/dev/null)" = "$VERSION" ] && exit 0
if ! command -v go >/dev/null 2>&1; then
  echo "helm: no Go toolchain to build helm $VERSION; the chart check will skip (fail with CI=true)"
  exit 0
fi
echo "helm: building helm $VERSION from the Go module proxy into $BIN (once)"
mkdir -p "$BIN"
GOBIN="$BIN" go install "helm.sh/helm/v4/cmd/helm@$VERSION" && echo "$VERSION" > "$BIN/helm.version" ||
  echo "helm: the build failed; the chart check will skip (fail with CI=true)"
exit 0
