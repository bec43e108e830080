#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""test_subproject.py - gca embedded as a meson subproject.

A throwaway project is written to a temporary directory with the source tree
linked as subprojects/gca; its meson.build asks for dependency('gca') with the
subproject as fallback (forced, so an installed gca is not picked up), which
meson.override_dependency() in gca's meson.build answers with gca_dep. It
builds use_gca.c, which sees only the public headers, and runs it on the sim
backend.

usage: test_subproject.py SOURCE_ROOT USE_GCA_C MESON
"""
import os
import shutil
import subprocess
import sys
import tempfile

PROJECT = """project('gca_consumer', 'c', default_options: ['c_std=gnu11'])
gca = dependency('gca', fallback: ['gca', 'gca_dep'],
                 default_options: ['tests=disabled', 'warning_level=0'])
executable('use_gca', 'use_gca.c', dependencies: gca)
"""


def step(cmd, cwd, env=None):
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout + r.stderr)
        raise SystemExit(f"failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def main(argv):
    if len(argv) != 4:
        print(__doc__)
        return 2
    source_root, use_gca_c, meson = (os.path.abspath(a) for a in argv[1:4])
    with tempfile.TemporaryDirectory(prefix="gca-subproject-") as tmp:
        os.makedirs(os.path.join(tmp, "subprojects"))
        os.symlink(source_root, os.path.join(tmp, "subprojects", "gca"))
        with open(os.path.join(tmp, "meson.build"), "w") as f:
            f.write(PROJECT)
        shutil.copy(use_gca_c, tmp)
        step([meson, "setup", "--force-fallback-for=gca", "build"], tmp)
        step([meson, "compile", "-C", "build", "use_gca"], tmp)
        env = dict(os.environ, GCA_DEVICE="sim", GCA_LOG_LEVEL="error")
        print(step([os.path.join(tmp, "build", "use_gca")], tmp, env), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
