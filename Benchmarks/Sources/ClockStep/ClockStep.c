// A system clock step, as one process sees it, for the soak's faults case: preloaded
// (LD_PRELOAD=libClockStep.so), it adds the whole seconds in the file named by
// TUSA_CLOCK_STEP_FILE (e.g. "-3600") to the wall clock (CLOCK_REALTIME and its coarse
// variant, gettimeofday, time) and leaves every other clock and every sleep and timer
// alone, which is what stepping the real clock does to a running program. The file is
// read again at most every 100 ms of monotonic time. It calls no setenv: a constructor
// that moves the environment hides a Swift program's arguments from it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

#include "ClockStep.h"

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static _Atomic(clock_gettime_fn) real_clock_gettime;
static _Atomic long step_seconds;
static _Atomic long long next_read_ns;
static pthread_mutex_t reading = PTHREAD_MUTEX_INITIALIZER;

static clock_gettime_fn real(void) {
    clock_gettime_fn f = atomic_load(&real_clock_gettime);
    if (!f) {
        f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        atomic_store(&real_clock_gettime, f);
    }
    return f;
}

static long step(void) {
    struct timespec now;
    clock_gettime_fn f = real();
    if (!f || f(CLOCK_MONOTONIC, &now) != 0) return atomic_load(&step_seconds);
    long long ns = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
    if (ns >= atomic_load(&next_read_ns) && pthread_mutex_trylock(&reading) == 0) {
        const char *path = getenv("TUSA_CLOCK_STEP_FILE");
        FILE *file = path ? fopen(path, "re") : NULL;
        long value = 0;
        if (file) {
            if (fscanf(file, "%ld", &value) == 1) atomic_store(&step_seconds, value);
            fclose(file);
        }
        atomic_store(&next_read_ns, ns + 100000000LL);
        pthread_mutex_unlock(&reading);
    }
    return atomic_load(&step_seconds);
}

int clock_step_seconds(void) { return (int)step(); }

int clock_gettime(clockid_t id, struct timespec *ts) {
    clock_gettime_fn f = real();
    if (!f) return -1;
    int status = f(id, ts);
    if (status == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += step();
    return status;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    if (tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
