#!/usr/bin/env bash
# Builds the rkube container image from the release binary, with no base image (none can be
# pulled on an offline machine): the binary and the C libraries it links (as `ldd` names them)
# in an otherwise empty root filesystem, imported with `docker import`.
# Usage: deploy/build-image.sh [TAG]   (default rkube:dev; RKUBE_BIN=path uses that binary
# instead of building the release one, as the tests do with their debug build)
set -euo pipefail
cd "$(dirname "$0")/.."
TAG=${1:-rkube:dev}
if [ -n "${RKUBE_BIN:-}" ]; then
  BIN=$RKUBE_BIN
else
  cargo build --release -q -p rkube
  BIN=$PWD/target/release/rkube
fi
ROOT=$(mktemp -d)
trap 'rm -rf "$ROOT"' EXIT
mkdir -p "$ROOT/bin" "$ROOT/tmp" "$ROOT/etc" "$ROOT/var/lib/rkube"
chmod 1777 "$ROOT/tmp"
cp "$BIN" "$ROOT/bin/rkube"
# The dynamic loader and every library the binary needs, at the paths it looks for them.
for lib in $(ldd "$BIN" | grep -o '/[^ ]*'); do
  mkdir -p "$ROOT$(dirname "$lib")"
  cp -L "$lib" "$ROOT$lib"
done
# The public CA bundle (what any base image carries; the Kubernetes client crate loads it even
# when a cluster CA is given).
mkdir -p "$ROOT/etc/ssl/certs"
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"
echo 'root:x:0:0:root:/:/bin/rkube' > "$ROOT/etc/passwd"
echo 'root:x:0:' > "$ROOT/etc/group"
# Names in the cluster's network resolve through Docker's embedded DNS.
echo 'hosts: files dns' > "$ROOT/etc/nsswitch.conf"
tar --sort=name --owner=0 --group=0 --numeric-owner -C "$ROOT" -c . |
  docker import \
    --change 'ENTRYPOINT ["/bin/rkube"]' \
    --change 'WORKDIR /var/lib/rkube' \
    --message "rkube $(git describe --always --dirty 2>/dev/null || echo unknown)" \
    - "$TAG" >/dev/null
echo "built $TAG ($(docker image inspect -f '{{.Size}}' "$TAG") bytes)"
