#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gca-bench-churn's command line: each bad value exits 2 naming it, and the
filters (--live, --holes, --peers) run exactly the cases they name, the peers
left out null in --json (gca-slot: recycle_bins:False; gca-tc: the defaults
once a second thread engaged the thread caches, measured after the others).
Usage: test_bench_churn_cli.py GCA_BENCH_CHURN."""
import json
import os
import subprocess
import sys

bench = sys.argv[1]
env = {k: v for k, v in os.environ.items() if k != "MALLOC_PERTURB_"}


def run(*args):
    return subprocess.run([bench, *args], capture_output=True, text=True, timeout=100, env=env)


bad_cases = [
    (["--ops", "0"], "--ops '0' is not a whole number in [1, 2^40]"),
    (["--ops", "-1"], "--ops '-1' is not a whole number in [1, 2^40]"),
    (["--ops", "10k"], "--ops '10k' is not a whole number in [1, 2^40]"),
    (["--live", "0"], "--live '0' is not a whole number in [1, 100000000]"),
    (["--live", ""], "--live '' is not a whole number in [1, 100000000]"),
    (["--max-live", "1e6"], "--max-live '1e6' is not a whole number in [1, 100000000]"),
    (["--holes", "maybe"], "--holes 'maybe' is neither yes nor no"),
    (["--peers", "gca,tcmalloc"], "--peers names 'tcmalloc', not one of gca, gca-exact, gca-slot"),
    (["--peers", "gca,"], "--peers names '', not one of"),
    (["--seed", "-3"], "--seed '-3' is not a whole number"),
    (["stray"], "unexpected argument 'stray'"),
]
for args, message in bad_cases:
    r = run(*args)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    assert message in r.stderr, (args, r.stderr)
    assert r.stdout == "", (args, r.stdout)

keys = ["gca_ns_per_op", "gca_exact_ns_per_op", "gca_slot_ns_per_op", "glibc_ns_per_op",
        "jemalloc_ns_per_op", "gca_tc_ns_per_op"]

# One case: 300 live blocks with holes, gca and glibc only.
r = run("--live", "300", "--holes", "yes", "--peers", "glibc,gca", "--ops", "3000", "--seed",
        "0x2a", "--json")
assert r.returncode == 0, r.stderr
rep = json.loads(r.stdout)
assert rep["seed"] == 42 and rep["ops"] == 3000, rep
assert len(rep["rows"]) == 1, rep["rows"]
row = rep["rows"][0]
assert row["live_blocks"] == 300 and row["holes"] is True, row
assert rep["memory_latency"] is None, rep
assert row["gca_ns_per_op"] > 0 and row["glibc_ns_per_op"] > 0, row
for k in ("gca_exact_ns_per_op", "gca_slot_ns_per_op", "jemalloc_ns_per_op", "gca_tc_ns_per_op"):
    assert row[k] is None, (k, row)

# The live sizes up to --max-live, each without and with holes; every peer
# (jemalloc where it loads: its figure is positive or the header says so).
r = run("--max-live", "1000", "--ops", "2000", "--json")
assert r.returncode == 0, r.stderr
rep = json.loads(r.stdout)
assert [(x["live_blocks"], x["holes"]) for x in rep["rows"]] == [
    (10, False), (10, True), (1000, False), (1000, True)], rep["rows"]
for x in rep["rows"]:
    for k in keys[:4] + keys[5:]:
        assert x[k] > 0, (x, k)
    assert x["jemalloc_ns_per_op"] is None or x["jemalloc_ns_per_op"] > 0, x
# and the machine's memory curve, which a run narrowed by --peers leaves out
assert [m["mib"] for m in rep["memory_latency"]] == [4, 16, 64, 256], rep["memory_latency"]
assert all(m["ns"] > 0 for m in rep["memory_latency"]), rep["memory_latency"]

r = run("--live", "50", "--holes", "no", "--peers", "gca-exact,gca-slot", "--ops", "0500")
assert r.returncode == 0, r.stderr
lines = r.stdout.splitlines()
assert lines[0].startswith("gca-bench-churn: seed 20261125, 500 operations"), lines
cells = lines[2].split()
assert cells[:3] == ["50", "no", "-"] and cells[5:] == ["-", "-", "-"], lines
assert float(cells[3]) > 0 and float(cells[4]) > 0, lines

# gca-tc alone, then beside gca (its column last, both measured).
r = run("--live", "40", "--holes", "no", "--peers", "gca-tc", "--ops", "400", "--json")
assert r.returncode == 0, r.stderr
row = json.loads(r.stdout)["rows"][0]
assert row["gca_tc_ns_per_op"] > 0 and row["gca_ns_per_op"] is None, row
r = run("--live", "40", "--peers", "gca,gca-tc", "--ops", "400")
assert r.returncode == 0, r.stderr
lines = r.stdout.splitlines()
table, streams = lines[: lines.index("")], lines[lines.index("") + 1 :]
assert len(table) == 4, lines
for line in table[2:]:
    cells = line.split()
    assert float(cells[2]) > 0 and float(cells[-1]) > 0 and cells[3:7] == ["-"] * 4, lines
# then a stream's destroy beside the live set: one row per live size
assert streams[0].startswith("stream destroy with a live set") and len(streams) == 3, lines
cells = streams[2].split()
assert cells[0] == "40" and float(cells[1]) > 0 and float(cells[2]) > 0, lines
r = run("--live", "40", "--holes", "no", "--peers", "gca", "--ops", "400", "--json")
assert r.returncode == 0, r.stderr
srow = json.loads(r.stdout)["stream_rows"]
assert len(srow) == 1 and srow[0]["live_blocks"] == 40, srow
assert srow[0]["destroy_ns"] > 0 and srow[0]["bare_destroy_ns"] > 0, srow
# the text report's last section: the memory curve, a row per buffer size
r = run("--live", "20", "--holes", "no", "--ops", "100")
assert r.returncode == 0, r.stderr
lines = r.stdout.splitlines()
mem = lines[lines.index("this machine's memory: ns per dependent read at random over a buffer "
                        "(huge pages)") + 1:]
assert [x.split()[:2] for x in mem] == [["4", "MiB"], ["16", "MiB"], ["64", "MiB"],
                                        ["256", "MiB"]], lines
assert all(float(x.split()[2]) > 0 for x in mem), lines
print("gca-bench-churn command line: ok")
