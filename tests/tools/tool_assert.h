/* SPDX-License-Identifier: Apache-2.0 */
/* tool_assert.h - assertions on the tools' own error detail (tools/util.h):
 * tool modules report through tool_last_error(), not gca_last_error(). */
#ifndef GCA_TEST_TOOL_ASSERT_H
#define GCA_TEST_TOOL_ASSERT_H

#include "util.h"

/* Asserts a tool call returned `expected` and that the tool detail contains `needle`. */
#define assert_tool_status(call, expected, needle)                                           \
  do {                                                                                       \
    gca_status_t t_st_ = (call);                                                             \
    if (t_st_ != (expected))                                                                 \
      fail_msg("%s -> %s (wanted %s): %s", #call, gca_status_name(t_st_),                    \
               gca_status_name(expected), tool_last_error());                                \
    if (strstr(tool_last_error(), (needle)) == NULL)                                         \
      fail_msg("%s: detail '%s' does not mention '%s'", #call, tool_last_error(), (needle)); \
  } while (0)

#endif
