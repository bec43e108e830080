/* allocator/config.c: not yet written. */
