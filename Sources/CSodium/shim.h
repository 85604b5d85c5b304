#pragma once
#include <sodium.h>

/* A hint that the cache line at `p` is read soon; never faults, waits for nothing.
   SecureEndpoint.sealMedia(toEach:...) fetches the next peer's state while the copy
   before it is encrypted (a party relay's copies of one frame). */
static inline void tusa_prefetch(const void *p) { __builtin_prefetch(p, 0, 3); }
