/* allocator/allocator.c: not yet written. */
