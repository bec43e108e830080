#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_install.py - what `meson install` puts in place.

Installs the build into a temporary DESTDIR and checks: the include tree holds
exactly the public headers (include/gca.h, include/gca/*.h, byte for byte;
no internal header), libgca needs no CUDA library (Note [CUDA partial
dependency]), and the pkg-config file builds use_gca.c, which runs on the sim
backend against the installed libgca.

usage: test_install.py BUILD_DIR SOURCE_INCLUDE_DIR USE_GCA_C MESON PKG_CONFIG CC [SANITIZE]

SANITIZE is the build's b_sanitize (e.g. address,undefined): the program is
built with the same runtime as the libgca it links.
"""
import filecmp
import glob
import os
import subprocess
import sys
import tempfile


def step(cmd, env=None):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def tree(root):
    out = set()
    for d, _, files in os.walk(root):
        out |= {os.path.relpath(os.path.join(d, f), root) for f in files}
    return out


def main(argv):
    if len(argv) not in (7, 8):
        print(__doc__)
        return 2
    build, src_inc, use_gca_c, meson, pkg_config, cc = argv[1:7]
    sanitize = argv[7] if len(argv) == 8 and argv[7] != "none" else None
    with tempfile.TemporaryDirectory(prefix="gca-install-") as dest:
        step([meson, "install", "-C", build, "--no-rebuild", "--quiet", "--destdir", dest])
        pcs = glob.glob(os.path.join(dest, "**", "pkgconfig", "gca.pc"), recursive=True)
        incs = [d for d in glob.glob(os.path.join(dest, "**", "include"), recursive=True)
                if os.path.exists(os.path.join(d, "gca.h"))]
        if len(pcs) != 1 or len(incs) != 1:
            print(f"expected one gca.pc and one include dir with gca.h, found {pcs} and {incs}")
            return 1
        installed, wanted = tree(incs[0]), tree(src_inc)
        if installed != wanted:
            print(f"installed headers differ from {src_inc}:")
            print(f"  not installed: {sorted(wanted - installed)}")
            print(f"  installed but not public: {sorted(installed - wanted)}")
            return 1
        for h in sorted(wanted):
            if not filecmp.cmp(os.path.join(incs[0], h), os.path.join(src_inc, h), shallow=False):
                print(f"installed {h} differs from the source")
                return 1
        print(f"include tree: exactly the {len(wanted)} public headers")

        pcdir = os.path.dirname(pcs[0])
        prefix_rel = step([pkg_config, "--variable=prefix", pcs[0]]).strip()
        env = dict(os.environ, PKG_CONFIG_PATH=pcdir, PKG_CONFIG_LIBDIR=pcdir)
        flags = step([pkg_config, "--define-variable=prefix=" + dest + prefix_rel,
                      "--cflags", "--libs", "gca"], env).split()
        libdirs = [f[2:] for f in flags if f.startswith("-L")]
        libgca = glob.glob(os.path.join(libdirs[0], "libgca.so.*")) if libdirs else []
        if not libgca:
            print(f"pkg-config flags {flags} name no directory with libgca")
            return 1
        needed = step(["readelf", "-d", libgca[0]])
        if "libcuda" in needed:
            print(f"{libgca[0]} needs a CUDA library:\n{needed}")
            return 1
        exe = os.path.join(dest, "use_gca")
        step([cc, use_gca_c, "-o", exe] + flags + ["-Wl,-rpath," + libdirs[0]] +
             (["-fsanitize=" + sanitize] if sanitize else []))
        env = dict(os.environ, GCA_DEVICE="sim", GCA_LOG_LEVEL="error")
        print("pkg-config: " + " ".join(flags))
        print(step([exe], env), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
