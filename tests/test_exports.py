#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_exports.py - libgca.so exports exactly the public API.

The expected list is derived, not written down: every name declared with
GCA_API in the public headers (include/gca.h, include/gca/*.h). The library's
dynamic symbol table (nm -D --defined-only) must hold each of them and nothing
else: no symbol outside the gca_ prefix, no gca__ internal, no gca_ name the
headers do not declare.

usage: test_exports.py LIBGCA_SO INCLUDE_DIR [NM]
"""
import os
import re
import subprocess
import sys

DECL = re.compile(r"\bGCA_API\b([^;{]*?)\b([A-Za-z_]\w*)\s*(?:\(|\[|;|=)", re.S)


def strip_comments_and_directives(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    # Drop preprocessor lines (with their continuations): `#define GCA_API ...` is no declaration.
    text = re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", " ", text, flags=re.M)
    return text


def declared(include_dir):
    headers = []
    for root, _, files in os.walk(include_dir):
        headers += [os.path.join(root, f) for f in files if f.endswith(".h")]
    names = {}
    for path in sorted(headers):
        with open(path, encoding="utf-8") as f:
            text = strip_comments_and_directives(f.read())
        for m in DECL.finditer(text):
            names.setdefault(m.group(2), os.path.relpath(path, include_dir))
    return names, headers


def exported(lib, nm):
    out = subprocess.run([nm, "-D", "--defined-only", "--format=posix", lib],
                         check=True, capture_output=True, text=True).stdout
    names = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind in ("U", "w", "v"):
            continue
        name = name.split("@", 1)[0]
        if name:
            names.add(name)
    return names


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    lib, include_dir = argv[1], argv[2]
    nm = argv[3] if len(argv) > 3 else "nm"
    want, headers = declared(include_dir)
    if not headers:
        print(f"no headers under {include_dir}")
        return 1
    bad_decl = sorted(n for n in want if not n.startswith("gca_") or n.startswith("gca__"))
    have = exported(lib, nm)

    problems = []
    for n in bad_decl:
        problems.append(f"declared GCA_API without the public gca_ prefix: {n} ({want[n]})")
    for n in sorted(set(want) - have):
        problems.append(f"declared in {want[n]} but not exported: {n}")
    for n in sorted(have - set(want)):
        if not n.startswith("gca_"):
            problems.append(f"exported symbol outside the gca_ prefix: {n}")
        elif n.startswith("gca__"):
            problems.append(f"internal symbol exported: {n}")
        else:
            problems.append(f"exported but declared in no public header: {n}")

    print(f"{len(want)} declared in {len(headers)} headers, {len(have)} exported by {lib}")
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
