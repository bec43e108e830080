#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# SPDX headers: every source file (.c, .h, .py, .sh, meson.build,
# meson_options.txt, .ci/run) opens with "SPDX-License-Identifier: Apache-2.0"
# in its comment syntax, on the first line or, below a "#!" line, the second.
#
#   .ci/spdx.sh          add the line where it is missing
#   .ci/spdx.sh --check  list the files without it and fail (exit 1) if any
#
# Files are those git tracks or would track (build directories are ignored);
# outside a git checkout, every such file below the root not in a meson build
# directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode=add
case "${1:-}" in
  --check) mode=check ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

is_source() {
  case "$1" in
    *.c | *.h | *.py | *.sh | meson.build | */meson.build | meson_options.txt | .ci/run) return 0 ;;
  esac
  return 1
}

list_files() {
  if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git -C "$root" ls-files --cached --others --exclude-standard
  else
    (cd "$root" && find . -type d \( -name .git -o -exec test -d '{}/meson-private' \; \) -prune \
      -o -type f -print | sed 's|^\./||')
  fi
}

spdx_line() {
  case "$1" in
    *.c | *.h) echo '/* SPDX-License-Identifier: Apache-2.0 */' ;;
    *) echo '# SPDX-License-Identifier: Apache-2.0' ;;
  esac
}

has_spdx() { # file, expected line: on line 1, or line 2 below a shebang
  local first second
  { IFS= read -r first || true; IFS= read -r second || true; } <"$1"
  [ "$first" = "$2" ] || { [ "${first:0:2}" = "#!" ] && [ "$second" = "$2" ]; }
}

missing=0
while IFS= read -r f; do
  is_source "$f" || continue
  [ -f "$root/$f" ] || continue
  line="$(spdx_line "$f")"
  has_spdx "$root/$f" "$line" && continue
  if [ "$mode" = check ]; then
    echo "no SPDX line: $f"
    missing=$((missing + 1))
    continue
  fi
  tmp="$(mktemp "$root/$f.spdx.XXXXXX")"
  if [ "$(head -c 2 "$root/$f")" = "#!" ]; then
    { head -n 1 "$root/$f"; echo "$line"; tail -n +2 "$root/$f"; } >"$tmp"
  else
    { echo "$line"; cat "$root/$f"; } >"$tmp"
  fi
  chmod --reference="$root/$f" "$tmp"
  mv "$tmp" "$root/$f"
  echo "added: $f"
done < <(list_files)

if [ "$mode" = check ] && [ "$missing" -gt 0 ]; then
  echo "$missing file(s) without 'SPDX-License-Identifier: Apache-2.0'; run .ci/spdx.sh to add it" >&2
  exit 1
fi
exit 0
