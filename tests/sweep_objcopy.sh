#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# sweep_objcopy.sh OBJCOPY AR IN.a OUT.a REDEFS... - copies the archive IN.a
# (thin, as meson builds internal ones, or regular) to a regular archive
# OUT.a with every member passed through `objcopy REDEFS...`
# (Note [Host allocation sweep], tests/meson.build).
set -eu
objcopy=$1 ar=$2 in=$3 out=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/in" "$tmp/out"
first=$("$ar" t "$in" | head -n 1)
if [ -n "$first" ] && [ -f "$first" ]; then
  # a thin archive: GNU ar lists its members as paths from the current directory
  members=$("$ar" t "$in")
else
  # a regular one: its members are extracted (meson's object names are unique)
  case $in in /*) abs=$in ;; *) abs=$(pwd)/$in ;; esac
  (cd "$tmp/in" && "$ar" x "$abs")
  members=$(ls "$tmp/in"/*)
fi
for m in $members; do
  "$objcopy" "$@" "$m" "$tmp/out/$(basename "$m")"
done
rm -f "$out"
"$ar" rcs "$out" "$tmp/out"/*
