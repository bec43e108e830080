/* allocator/device/sim/sim_mem.c: not yet written. */
