/* common/json.c: not yet written. */
