#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# sweep_objcopy.sh OBJCOPY AR IN.a OUT.a REDEFS... - copies the (possibly
# thin) archive IN.a to a regular archive OUT.a with every member passed
# through `objcopy REDEFS...` (Note [Host allocation sweep], tests/meson.build).
set -eu
objcopy=$1 ar=$2 in=$3 out=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# GNU ar lists a thin archive's members as paths from the current directory
for m in $("$ar" t "$in"); do
  "$objcopy" "$@" "$m" "$tmp/$(basename "$m")"
done
rm -f "$out"
"$ar" rcs "$out" "$tmp"/*.o
