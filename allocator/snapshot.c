/* allocator/snapshot.c: not yet written. */
