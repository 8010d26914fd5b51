#!/bin/bash
# image.sh OUT.tar
#   Builds the image deploy/ runs, `csi-relay:0.1.0`, under the fully qualified local name
#   localhost/csi-relay:0.1.0 (the test overlay points deploy/ at it), as an OCI archive that `ctr images import`
#   takes, with no registry: FROM scratch, holding
#     - the project's own release binary (CSI_RELAY_BIN, default REPO/target/release/csi-relay;
#       build it with `cargo build --release --locked --bin csi-relay`),
#     - the host's copies of the tools the node plugin runs (src/os/: blkid, mkfs.<fs>,
#       e2fsck, resize2fs, dumpe2fs, xfs_growfs, losetup, mount; plus umount, fsfreeze and
#       mount.nfs when the host has it), with the shared libraries ldd names,
#     - a minimal /etc (passwd, group, nsswitch.conf, hosts, mke2fs.conf, mtab, CA bundle).
#   The repository's Dockerfile is the production recipe; it needs a Debian base image from a
#   registry, which this test machine cannot reach, so the same tools are assembled here from
#   the host (Debian 12: merged /usr, so /bin /sbin /lib /lib64 are symlinks into /usr).
#   Uses Debian's buildah (apt-get install buildah) with its own storage under WORK_DIR and the
#   vfs driver (no overlay or fuse mount is needed, and nothing stays mounted); no RUN step,
#   so no isolation or user namespace is needed either.
# Env: IMAGE_REF [localhost/csi-relay:0.1.0], CSI_RELAY_BIN, WORK_DIR [mktemp],
#      STORAGE_DRIVER [vfs]
set -euo pipefail
OUT=${1:?usage: image.sh OUT.tar}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BIN=${CSI_RELAY_BIN:-$REPO/target/release/csi-relay}
REF=${IMAGE_REF:-localhost/csi-relay:0.1.0}
DRIVER=${STORAGE_DRIVER:-vfs}
[[ -x $BIN ]] || { echo "no release binary at $BIN (cargo build --release --locked --bin csi-relay)" >&2; exit 2; }
command -v buildah >/dev/null || { echo "need buildah (apt-get install -y buildah)" >&2; exit 2; }
OUT=$(readlink -f "$OUT")
OWN_WORK=""
if [[ -z ${WORK_DIR:-} ]]; then WORK_DIR=$(mktemp -d /tmp/csi-relay-image.XXXXXX); OWN_WORK=1; fi
mkdir -p "$WORK_DIR"; WORK_DIR=$(readlink -f "$WORK_DIR")
B=(buildah --root "$WORK_DIR/storage" --runroot "$WORK_DIR/runroot" --storage-driver "$DRIVER")
ROOT=$WORK_DIR/rootfs
rm -rf "$ROOT"; mkdir -p "$ROOT"
ctr_id=""
cleanup() {
  [[ -n $ctr_id ]] && "${B[@]}" rm "$ctr_id" >/dev/null 2>&1 || true
  if [[ -n $OWN_WORK ]]; then "${B[@]}" rmi -a -f >/dev/null 2>&1 || true; rm -rf "$WORK_DIR"; fi
}
trap cleanup EXIT

# ---------- rootfs: merged-/usr layout ----------
mkdir -p "$ROOT"/usr/{bin,sbin,lib,lib64} "$ROOT"/{etc/ssl/certs,tmp,proc,sys,dev,run/mount,csi,var/lib/csi-relay}
chmod 1777 "$ROOT/tmp"
ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"

libs=()
add_libs() { # the shared objects FILE needs, as ldd resolves them on this host
  local f=$1 l
  while read -r l; do libs+=("$l"); done < <(LC_ALL=C ldd "$f" 2>/dev/null | awk '
    $2 == "=>" && $3 ~ /^\// { print $3 }
    $1 ~ /^\// { print $1 }')
}
put() { # put HOSTFILE PATH_IN_IMAGE  (dereferenced copy, mode kept)
  mkdir -p "$ROOT/$(dirname "$2")"
  cp -L --preserve=mode "$1" "$ROOT/$2"
}

put "$BIN" /usr/local/bin/csi-relay
add_libs "$BIN"

REQUIRED=(mount umount losetup blkid mkfs.ext4 mkfs.xfs e2fsck resize2fs dumpe2fs xfs_growfs fsfreeze)
OPTIONAL=(mount.nfs mkfs.ext3 mkfs.ext2 xfs_io xfs_repair)
for t in "${REQUIRED[@]}" "${OPTIONAL[@]}"; do
  p=""
  for d in /usr/sbin /usr/bin /sbin /bin; do [[ -x $d/$t ]] && { p=$d/$t; break; }; done
  if [[ -z $p ]]; then
    if printf '%s\n' "${REQUIRED[@]}" | grep -qxF "$t"; then echo "host lacks $t (e2fsprogs, xfsprogs, util-linux, mount)" >&2; exit 2; fi
    echo "note: host has no $t; not in the image" >&2; continue
  fi
  case $p in /sbin/*|/bin/*) p=/usr$p ;; esac     # merged /usr: one copy, under /usr
  put "$p" "$p"
  add_libs "$p"
done
for l in $(printf '%s\n' "${libs[@]}" | sort -u); do
  case $l in
    /lib64/*) put "$l" "/usr$l" ;;                  # the ELF interpreter, /lib64/ld-linux-x86-64.so.2
    /lib/*) put "$l" "/usr$l" ;;
    *) put "$l" "$l" ;;
  esac
done

# ---------- /etc ----------
printf 'root:x:0:0:root:/root:/nonexistent\nnobody:x:65534:65534:nobody:/nonexistent:/nonexistent\n' > "$ROOT/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$ROOT/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$ROOT/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' > "$ROOT/etc/hosts"
[[ -r /etc/mke2fs.conf ]] && cp /etc/mke2fs.conf "$ROOT/etc/mke2fs.conf"
[[ -r /etc/ssl/certs/ca-certificates.crt ]] && cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/ca-certificates.crt"
ln -s ../proc/self/mounts "$ROOT/etc/mtab"

# ---------- image ----------
ctr_id=$("${B[@]}" from scratch)
"${B[@]}" copy "$ctr_id" "$ROOT/" / >/dev/null
"${B[@]}" config --entrypoint '["/usr/local/bin/csi-relay"]' --cmd '' \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label org.opencontainers.image.title=csi-relay \
  --label org.opencontainers.image.version="$("$BIN" --version | awk '{print $2}')" \
  --os linux --arch amd64 "$ctr_id"
img=$("${B[@]}" commit --quiet --format oci "$ctr_id" "csi-relay-kit-build")
rm -f "$OUT"
"${B[@]}" push --quiet "$img" "oci-archive:$OUT:$REF"
echo "image $REF -> $OUT ($(du -h "$OUT" | cut -f1); $(find "$ROOT" -type f | wc -l) files, $(printf '%s\n' "${libs[@]}" | sort -u | wc -l) shared objects)"
