#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_headers.py - every public header stands alone, in C and in C++.

The headers are listed from the include directory, so a new one is covered
without editing this file. For each header H:
  - C: a translation unit whose first line is `#include <H>` compiles with
    -std=gnu11 -Wall -Wextra -Werror (and -Wpedantic, -Wstrict-prototypes);
  - C++: the same translation unit compiles with -Wall -Wextra -Werror, takes
    the address of every GCA_API name H declares (found as tests/test_exports.py
    finds them), and links against libgca: a declaration outside `extern "C"`
    would be a mangled name libgca does not define.
Without a C++ compiler the test skips (exit 77) after the C checks.

usage: test_headers.py INCLUDE_DIR LIBGCA_SO TESTS_DIR CC [CXX]
"""
import os
import subprocess
import sys
import tempfile


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def main(argv):
    if len(argv) < 5:
        print(__doc__)
        return 2
    include_dir, libgca, tests_dir, cc = argv[1:5]
    cxx = argv[5] if len(argv) > 5 and argv[5] else None
    sys.path.insert(0, tests_dir)
    from test_exports import declared  # the GCA_API names, header by header

    names, paths = declared(include_dir)
    headers = sorted(os.path.relpath(p, include_dir) for p in paths)
    if "gca.h" not in headers or len(headers) < 2:
        print(f"found only {headers} under {include_dir}")
        return 1
    by_header = {h: sorted(n for n, where in names.items() if where == h) for h in headers}
    libdir = os.path.dirname(os.path.abspath(libgca))
    failures = []
    with tempfile.TemporaryDirectory(prefix="gca-headers-") as tmp:
        for h in headers:
            stem = h.replace("/", "_").replace(".", "_")
            c_src = os.path.join(tmp, stem + ".c")
            with open(c_src, "w") as f:
                f.write(f"#include <{h}>\nint gca_header_test_{stem}(void);\n"
                        f"int gca_header_test_{stem}(void) {{ return 0; }}\n")
            rc, out = run([cc, "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-Wpedantic",
                           "-Wstrict-prototypes", "-I", include_dir, "-c", c_src,
                           "-o", os.path.join(tmp, stem + ".o")])
            if rc != 0:
                failures.append(f"C: <{h}> does not compile alone:\n{out}")
            else:
                print(f"C:   <{h}> compiles alone")
        if cxx is None:
            for msg in failures:
                print(msg)
            if failures:
                return 1
            print("no C++ compiler found: the C++ checks are skipped")
            return 77
        for h in headers:
            stem = h.replace("/", "_").replace(".", "_")
            cpp_src = os.path.join(tmp, stem + ".cpp")
            refs = "".join(f"  reinterpret_cast<const void *>(&{n}),\n" for n in by_header[h])
            with open(cpp_src, "w") as f:
                f.write(f"#include <{h}>\n#include <cstdio>\n"
                        f"static const void *const names[] = {{\n{refs}  nullptr}};\n"
                        "int main() {\n"
                        "  std::printf(\"%zu\\n\", sizeof(names) / sizeof(names[0]));\n"
                        "  return names[0] == nullptr && sizeof(names) > sizeof(names[0]);\n"
                        "}\n")
            exe = os.path.join(tmp, stem + "_cpp")
            # libgca of a sanitizer build leaves the runtime's symbols to the program.
            rc, out = run([cxx, "-Wall", "-Wextra", "-Werror", "-I", include_dir, cpp_src,
                           "-o", exe, "-L" + libdir, "-Wl,-rpath," + libdir, "-lgca",
                           "-Wl,--allow-shlib-undefined"])
            if rc != 0:
                failures.append(f"C++: <{h}> does not compile or link "
                                f"({len(by_header[h])} names):\n{out}")
            else:
                print(f"C++: <{h}> compiles alone and its {len(by_header[h])} names link unmangled")
    for msg in failures:
        print(msg)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
