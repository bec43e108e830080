/* SPDX-License-Identifier: Apache-2.0 */
/* gca.h - umbrella header: a CUDA caching allocator and graph-capture runtime. */
#ifndef GCA_H
#define GCA_H

#include "gca/status.h"
#include "gca/device.h"
#include "gca/allocator.h"
#include "gca/pool.h"
#include "gca/ipc.h"
#include "gca/graphs.h"
#include "gca/collectives.h"
#include "gca/scheduler.h"
#include "gca/host.h"

#endif
