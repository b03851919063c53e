#!/usr/bin/env bash
# Check what scripts/release.sh built in dist/: each binary is
# static, for its architecture and prints its version and commit; each
# Debian package installs the binary, both units (running /usr/bin/gitfleet),
# the examples and a postinst that creates the QEMU user; the checksums hold.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
DIST=dist
fail() { echo "check-release: $*" >&2; exit 1; }

(cd "$DIST" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS does not match"
commit=$(git rev-parse HEAD)
for arch in amd64 arm64; do
  bin=$(ls "$DIST"/gitfleet_*_linux_$arch)
  info=$("$GO" version -m "$bin")
  grep -q "GOARCH=$arch" <<<"$info" || fail "$bin is not built for $arch"
  grep -q "CGO_ENABLED=0" <<<"$info" || fail "$bin is not static (CGO_ENABLED=0)"
  grep -q "vcs.revision=$commit" <<<"$info" || fail "$bin does not record commit $commit"
  version=${bin##*/gitfleet_}
  version=${version%_linux_$arch}
  deb=$(ls "$DIST"/gitfleet_*_$arch.deb)
  ctl=$(dpkg-deb --info "$deb")
  grep -q "^ Package: gitfleet$" <<<"$ctl" || fail "$deb: package name"
  grep -q "^ Version: $version$" <<<"$ctl" || fail "$deb: version is not $version"
  grep -q "^ Architecture: $arch$" <<<"$ctl" || fail "$deb: architecture is not $arch"
  files=$(dpkg-deb --contents "$deb")
  for f in ./usr/bin/gitfleet ./lib/systemd/system/gitfleet-agent.service \
    ./lib/systemd/system/gitfleet-controller.service \
    ./usr/share/doc/gitfleet/examples/agent.yaml ./usr/share/doc/gitfleet/examples/controller.env \
    ./usr/share/doc/gitfleet/examples/fleet/hosts/hv-a.yaml ./usr/share/doc/gitfleet/README.md \
    ./usr/share/doc/gitfleet/operating.md; do
    grep -q " $f\$" <<<"$files" || fail "$deb does not install $f"
  done
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  dpkg-deb --extract "$deb" "$tmp"
  dpkg-deb --control "$deb" "$tmp/DEBIAN"
  for u in gitfleet-agent gitfleet-controller; do
    grep -q '^ExecStart=/usr/bin/gitfleet ' "$tmp/lib/systemd/system/$u.service" || fail "$deb: $u.service does not run /usr/bin/gitfleet"
  done
  # The useradd call spans lines: join them before matching.
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$tmp/DEBIAN/postinst" | grep -q 'useradd --system.*gitfleet-qemu' ||
    fail "$deb: postinst does not create gitfleet-qemu"
  sh -n "$tmp/DEBIAN/postinst" || fail "$deb: postinst is not valid sh"
  if [ "$arch" = "$("$GO" env GOARCH)" ]; then
    out=$("$tmp/usr/bin/gitfleet" version)
    grep -q "$version" <<<"$out" || fail "gitfleet version prints \"$out\", not $version"
  fi
  rm -rf "$tmp"
  trap - EXIT
  echo "check-release: $deb ok"
done
