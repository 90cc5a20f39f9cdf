#!/usr/bin/env bash
# Builds two OCI image archives from the host's static busybox (Debian's busybox-static), for
# tests and for `ctr images import`, since no image can be pulled here:
#   OUT/busybox.tar  rkube.local/busybox:1  (every busybox applet on PATH; CMD sh)
#   OUT/busybox2.tar rkube.local/busybox:2  (the same, labelled version 2: an image to roll to)
#   OUT/pause.tar    rkube.local/pause:1    (a sandbox process that sleeps until stopped)
#   OUT/kubectl.tar  rkube.local/kubectl:1  (busybox and the host's kubectl, when that is a static
#                                            binary: a client for pods that use the API)
# Usage: build-busybox.sh OUT
set -euo pipefail
OUT=${1:?usage: build-busybox.sh OUT}
BUSYBOX=${BUSYBOX:-/bin/busybox}
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

layer() { # rootfs -> layer tar in WORK/layer.tar
  mkdir -p "$WORK/rootfs/bin" "$WORK/rootfs/tmp" "$WORK/rootfs/etc" "$WORK/rootfs/www"
  cp "$BUSYBOX" "$WORK/rootfs/bin/busybox"
  for applet in $("$BUSYBOX" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$WORK/rootfs/bin/$applet"
  done
  echo 'root:x:0:0:root:/:/bin/sh' > "$WORK/rootfs/etc/passwd"
  echo 'root:x:0:' > "$WORK/rootfs/etc/group"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$WORK/rootfs" -cf "$WORK/layer.tar" .
}

blob() { # file -> prints digest hex, stores it under WORK/oci/blobs/sha256
  local d
  d=$(sha256sum "$1" | cut -d' ' -f1)
  cp "$1" "$WORK/oci/blobs/sha256/$d"
  echo "$d"
}

image() { # name config-json-fragment out
  local name=$1 cfg=$2 out=$3
  rm -rf "$WORK/oci"
  mkdir -p "$WORK/oci/blobs/sha256"
  local ld ls cd cs md ms
  ld=$(blob "$WORK/layer.tar"); ls=$(stat -c %s "$WORK/layer.tar")
  printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$cfg" "$ld" > "$WORK/config.json"
  cd=$(blob "$WORK/config.json"); cs=$(stat -c %s "$WORK/config.json")
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
    "$cd" "$cs" "$ld" "$ls" > "$WORK/manifest.json"
  md=$(blob "$WORK/manifest.json"); ms=$(stat -c %s "$WORK/manifest.json")
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$md" "$ms" "$name" "${name##*:}" > "$WORK/oci/index.json"
  echo '{"imageLayoutVersion":"1.0.0"}' > "$WORK/oci/oci-layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$WORK/oci" -cf "$out" .
}

layer
image rkube.local/busybox:1 '{"Env":["PATH=/bin"],"Cmd":["sh"]}' "$OUT/busybox.tar"
image rkube.local/busybox:2 '{"Env":["PATH=/bin"],"Cmd":["sh"],"Labels":{"version":"2"}}' "$OUT/busybox2.tar"
image rkube.local/pause:1 \
  '{"Env":["PATH=/bin"],"Entrypoint":["/bin/sh","-c","trap \"exit 0\" TERM INT; sleep 2147483647 & wait"]}' \
  "$OUT/pause.tar"

# kubectl (a Go binary) runs in the image only when it is statically linked.
KUBECTL=${KUBECTL:-$(command -v kubectl || true)}
if [ -n "$KUBECTL" ] && file -L "$KUBECTL" | grep -q 'statically linked'; then
  cp "$(readlink -f "$KUBECTL")" "$WORK/rootfs/bin/kubectl"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$WORK/rootfs" -cf "$WORK/layer.tar" .
  image rkube.local/kubectl:1 '{"Env":["PATH=/bin","HOME=/tmp"],"Cmd":["sh"]}' "$OUT/kubectl.tar"
fi
