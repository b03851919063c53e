#!/usr/bin/env bash
# Build the release artifacts into dist/: a static, versioned
# gitfleet binary for linux/amd64 and linux/arm64, a Debian package of each
# (packaging/nfpm.yaml, built with nfpm), and SHA256SUMS.
#
# The version is the newest v* tag (v1.2.0 -> 1.2.0), or 0.0.0~g<commit>
# between tags, with a ~dirty suffix for uncommitted changes; `gitfleet
# version` prints it with the commit. Override with VERSION=.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
NFPM_VERSION=v2.45.2

if [ -z "${VERSION:-}" ]; then
  if tag=$(git describe --tags --match 'v[0-9]*' --dirty=~dirty 2>/dev/null); then
    VERSION=${tag#v}
    VERSION=${VERSION//-/+}
  else
    VERSION="0.0.0~g$(git rev-parse --short=12 HEAD)"
    git diff --quiet HEAD 2>/dev/null || VERSION="$VERSION~dirty"
  fi
fi
export VERSION

rm -rf dist
mkdir -p dist/stage
# The packaged units run the packaged binary.
for u in gitfleet-agent gitfleet-controller; do
  sed 's|/usr/local/bin/gitfleet|/usr/bin/gitfleet|g' "examples/systemd/$u.service" >"dist/stage/$u.service"
done

nfpm=("$GO" run "github.com/goreleaser/nfpm/v2/cmd/nfpm@$NFPM_VERSION")
for ARCH in amd64 arm64; do
  export ARCH
  # -buildvcs=true: the commit is recorded in the binary (go version -m,
  # gitfleet version) even where GOFLAGS turns stamping off.
  CGO_ENABLED=0 GOOS=linux GOARCH=$ARCH GOFLAGS="${GOFLAGS:-} -buildvcs=true" "$GO" build -trimpath \
    -ldflags "-s -w -X main.version=$VERSION" \
    -o "dist/gitfleet_${VERSION}_linux_$ARCH" ./cmd/gitfleet
  cp "dist/gitfleet_${VERSION}_linux_$ARCH" dist/stage/gitfleet
  "${nfpm[@]}" package --config packaging/nfpm.yaml --packager deb --target dist/
done
rm -rf dist/stage
(cd dist && sha256sum gitfleet_* >SHA256SUMS)
ls -l dist
