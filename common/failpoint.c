/* SPDX-License-Identifier: Apache-2.0 */
/* failpoint.c - named places where a host allocation can be made to fail, so
 * that tests reach the out-of-host-memory paths (Note [Host fail points]).
 *
 * The one idea: unarmed, a fail point costs one relaxed atomic load; armed,
 * the nth pass through the named place fails once and the point disarms. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common.h"

_Atomic int gca__failpoints_armed;

static pthread_mutex_t fp_lock = PTHREAD_MUTEX_INITIALIZER;
static char fp_name[64];
static unsigned fp_left; /* passes until the failure; 0: none armed */

gca_status_t gca__failpoint_arm(const char *name, unsigned nth) {
  if (name == NULL || !*name || strlen(name) >= sizeof(fp_name) || nth == 0)
    return gca__error(GCA_ERR_INVALID_ARGUMENT,
                      "failpoint_arm: a name shorter than %zu bytes and nth >= 1 are needed",
                      sizeof(fp_name));
  pthread_mutex_lock(&fp_lock);
  strcpy(fp_name, name);
  fp_left = nth;
  atomic_store(&gca__failpoints_armed, 1);
  pthread_mutex_unlock(&fp_lock);
  return GCA_OK;
}

void gca__failpoint_clear(void) {
  pthread_mutex_lock(&fp_lock);
  fp_left = 0;
  fp_name[0] = '\0';
  atomic_store(&gca__failpoints_armed, 0);
  pthread_mutex_unlock(&fp_lock);
}

bool gca__failpoint_hit(const char *name) {
  bool hit = false;
  pthread_mutex_lock(&fp_lock);
  if (fp_left != 0 && strcmp(fp_name, name) == 0 && --fp_left == 0) {
    hit = true;
    fp_name[0] = '\0';
    atomic_store(&gca__failpoints_armed, 0);
  }
  pthread_mutex_unlock(&fp_lock);
  return hit;
}
