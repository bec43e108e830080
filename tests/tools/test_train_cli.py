#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-train on the cuda backend (a fake driver library with a chosen device
count): thread ranks need a device each, so asking for more ranks than there
are devices exits 2 naming both counts before any collective is set up, and
without --ranks the run does not ask for more than there are; without a
driver library it exits 1 naming it.
Usage: test_train_cli.py GCA_TRAIN FAKE_LIBCUDA."""
import os
import subprocess
import sys

train, fake = sys.argv[1], sys.argv[2]
env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}
env.update({"GCA_DEVICE": "cuda", "GCA_CUDA_LIBRARY": fake, "FAKE_CUDA_DEVICES": "1"})


def run(*args, **extra):
    e = dict(env, **extra)
    return subprocess.run([train, *args], capture_output=True, text=True, timeout=100, env=e)


r = run("--ranks", "4", "--steps", "1", "--mode", "eager")
assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
assert "gca-train: --ranks 4 needs 4 devices on cuda (found 1)" in r.stderr, r.stderr
assert r.stdout == "", r.stdout

r = run("--ranks", "2", "--steps", "1", "--mode", "eager", FAKE_CUDA_DEVICES="2")
assert "needs" not in r.stderr, r.stderr

# the default of 4 ranks shrinks to the one device: whatever the fake driver
# cannot do later, the run never asks for a second device
r = run("--steps", "1", "--mode", "eager")
assert "needs" not in r.stderr and "Invalid device" not in r.stderr, r.stderr
assert "4 ranks" not in r.stdout, r.stdout
# no driver library at all: the backend cannot start, and says why
r = run("--steps", "1", GCA_CUDA_LIBRARY="/nonexistent/libcuda.so.1")
assert r.returncode == 1, (r.returncode, r.stderr)
assert "gca-train: no device:" in r.stderr and "/nonexistent/libcuda.so.1" in r.stderr, r.stderr
print("ok")
