#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""libgca.so loads with dlopen() after program start, as PyTorch's pluggable
allocator loads it from Python: its static TLS must fit glibc's small surplus
for such loads (Note [Hook errors], allocator/host_extent.c). The pinned host
allocator then either works or says why jemalloc could not be loaded.

Usage: test_late_dlopen.py LIBGCA B_SANITIZE"""
import ctypes
import os
import sys


def main():
    lib, sanitize = sys.argv[1], sys.argv[2]
    if sanitize != "none":
        print("SKIP: a sanitized libgca needs its runtime loaded first")
        return 77
    if os.environ.get("GLIBC_TUNABLES"):
        # the check is about the default surplus: run again without tunables
        env = dict(os.environ)
        del env["GLIBC_TUNABLES"]
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    os.environ["GCA_DEVICE"] = "sim"
    gca = ctypes.CDLL(lib)  # raises OSError "cannot allocate memory in static TLS block"
    gca.gca_last_error.restype = ctypes.c_char_p
    p = ctypes.c_void_p()
    st = gca.gca_host_alloc(ctypes.byref(p), ctypes.c_size_t(4096))
    detail = gca.gca_last_error().decode()
    if st == 0:
        if gca.gca_host_free(p) != 0:
            print("gca_host_free failed:", gca.gca_last_error().decode())
            return 1
        print("pinned host allocator works after a late dlopen")
        return 0
    if st == 4 and "jemalloc could not be loaded" in detail and "GLIBC_TUNABLES" in detail:
        print("late dlopen ok; the host allocator says why it is unavailable:", detail)
        return 0
    print("unexpected gca_host_alloc status", st, detail)
    return 1


if __name__ == "__main__":
    sys.exit(main())
