#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-bench's command line: a bad --rounds or --seconds exits 2 naming the
value, and a short run (tiny windows, two rounds) writes JSON that says how
many windows each figure is the median of and has every table with figures
for gca. Usage: test_bench_cli.py GCA_BENCH."""
import json
import os
import subprocess
import sys

bench = sys.argv[1]
# glibc's peer pairs of 8 and 64 MiB map fresh pages each time; meson's
# MALLOC_PERTURB_ would fill every one of them, minutes for a short run
env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}


def run(*args):
    return subprocess.run([bench, *args], capture_output=True, text=True, timeout=100, env=env)


for bad in ["0", "16", "2x", "", "-1"]:
    r = run("--rounds", bad)
    assert r.returncode == 2, (bad, r.returncode, r.stderr)
    assert f"--rounds '{bad}' is not a whole number in [1, 15]" in r.stderr, (bad, r.stderr)
r = run("--seconds", "0")
assert r.returncode == 2 and "--seconds '0' is not in (0, 60]" in r.stderr, r.stderr

r = run("--seconds", "0.002", "--rounds", "2", "--json")
assert r.returncode == 0, r.stderr
rep = json.loads(r.stdout)
assert rep["rounds"] == 2, rep["rounds"]
assert rep["seconds_per_measurement"] == 0.002
assert [row["size"] for row in rep["results"]] == [512, 4096, 65536, 1 << 20, 8 << 20, 64 << 20]
for row in rep["results"]:
    for key in ("gca_ns_1t", "gca_ns_2t", "malloc_ns_1t", "exact_ns_1t"):
        assert row[key] > 0, (row["size"], key, row[key])
assert [t["threads"] for t in rep["threads"]] == [1, 2, 4, 8], rep["threads"]
assert all(t["gca_mpairs_per_s"] > 0 for t in rep["threads"]), rep["threads"]
assert {p["pattern"] for p in rep["patterns"]} == {"alternating_4k_12k", "mixed_512b_1m"}
assert all(p["gca_ns"] > 0 and p["exact_ns"] > 0 for p in rep["patterns"]), rep["patterns"]
r = run("--seconds", "0.002", "--rounds", "1")
assert r.returncode == 0, r.stderr
assert "each figure the median of 1 windows" in r.stdout, r.stdout[:300]
print("gca-bench command line: ok")
