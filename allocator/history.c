/* allocator/history.c: not yet written. */
