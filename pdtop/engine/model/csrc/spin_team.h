/* A team of helper threads that spin between jobs, for the batch-1 decode matmuls (Linux only:
   futexes and per-thread affinity).

   A decode step at batch 1 is ~120 small matmuls (tens of microseconds each) with Python between
   them. Under pdtop's OMP_WAIT_POLICY=PASSIVE every OpenMP region wakes a sleeping thread with a
   futex (tens of microseconds on a VM: as long as the matmul itself), and libgomp's spinning default
   is far worse as soon as the machine is busy. These helpers spin for `team_spin_ns` (100 us) after
   each job, yielding the core now and then, which covers the gaps inside a step, then sleep on a
   futex, so a busy machine loses at most that much per idle gap; and the caller takes the chunks
   of a helper that has not woken (below), so it never waits on one that lost its core.

   One team per calling thread (thread-local: pdmux's prefill and decode threads each have theirs),
   grown to the caller's OpenMP thread count; the helpers follow the caller's CPU affinity (checked
   at every job), as `pin_team` does for its OpenMP team. A caller thread that exits stops its team;
   a forked child starts without one. Header-only: static functions, included by quant.c (which
   defines _GNU_SOURCE first). */
#ifndef PDTOP_SPIN_TEAM_H
#define PDTOP_SPIN_TEAM_H
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TEAM_MAX 63 /* helpers at most */

/* One job: fn(arg, chunk, member) for chunk in [0, chunks), `member` the thread that runs it (the
   caller is 0: for per-thread scratch, such as quant.c's panel packs). Member m owns the m-th of
   `members` contiguous ranges of chunks and takes them in order (each thread streams its own part
   of the weights: the hardware prefetcher follows it), then helps with the others' ranges, so a
   helper that has lost its core (a busy machine) delays the job by at most the chunk it holds, and
   one that has not woken yet by nothing. */
typedef void (*team_fn)(void* arg, int64_t chunk, int member);

typedef struct {
    _Atomic int64_t next; /* the range's next chunk, counted from its start */
    _Atomic int64_t done; /* its chunks finished */
    int64_t lo, len;
} __attribute__((aligned(64))) TeamRange;

typedef struct {
    _Atomic uint32_t gen;      /* bumped per job (and to quit); the futex word */
    _Atomic int32_t sleepers;  /* helpers asleep on gen */
    _Atomic int32_t active;    /* helpers that may read the job's fields: the caller rewrites them at 0 */
    _Atomic uint32_t open;     /* the gen of the job whose fields are complete, 0 while none is */
    _Atomic int32_t quit;
    _Atomic uint32_t cpus_gen; /* bumped when `cpus` changes */
    team_fn fn;
    void* arg;
    int members;               /* the job's ranges */
    int size;                  /* helpers started */
    cpu_set_t cpus;            /* the caller's affinity, which the helpers take */
    pthread_t threads[TEAM_MAX];
    TeamRange ranges[TEAM_MAX + 1];
} Team;

typedef struct {
    Team* team;
    int member;
    uint32_t gen; /* the team's gen when it started: its first job is the next one */
} Helper;

/* Member `me`'s range, then the others', chunk by chunk until none is left. */
static void team_work(Team* t, int me) {
    for (int i = 0; i < t->members; ++i) {
        TeamRange* r = &t->ranges[(me + i) % t->members];
        for (int64_t k; (k = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed)) < r->len;) {
            t->fn(t->arg, r->lo + k, me);
            atomic_fetch_add_explicit(&r->done, 1, memory_order_release);
        }
    }
}

static _Atomic int64_t team_spin_ns = 100000; /* an idle helper spins this long before it sleeps */
static _Thread_local Team* my_team;
static pthread_key_t team_key;
static pthread_once_t team_once = PTHREAD_ONCE_INIT;

static inline void team_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t team_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void team_futex(_Atomic uint32_t* word, int op, uint32_t val) {
    syscall(SYS_futex, (uint32_t*)word, op | FUTEX_PRIVATE_FLAG, val, NULL, NULL, 0);
}

static void* team_helper(void* p) {
    Helper h = *(Helper*)p;
    free(p);
    Team* t = h.team;
    uint32_t seen = h.gen, cpus_seen = 0;
    for (;;) {
        uint32_t g;
        int64_t start = team_now_ns();
        for (unsigned spins = 1; (g = atomic_load_explicit(&t->gen, memory_order_acquire)) == seen; ++spins) {
            team_pause();
            if (spins % 64) continue;
            if (team_now_ns() - start < atomic_load_explicit(&team_spin_ns, memory_order_relaxed)) {
                if (spins % 512 == 0) sched_yield(); /* let a busy machine's other threads in */
                continue;
            }
            atomic_fetch_add(&t->sleepers, 1);
            if (atomic_load(&t->gen) == seen) team_futex(&t->gen, FUTEX_WAIT, seen);
            atomic_fetch_sub(&t->sleepers, 1);
            start = team_now_ns();
        }
        seen = g;
        if (atomic_load(&t->quit)) return NULL;
        atomic_fetch_add(&t->active, 1);
        if (atomic_load(&t->open) == g) { /* else that job is over */
            const uint32_t cg = atomic_load(&t->cpus_gen);
            if (cg != cpus_seen) { /* the caller's affinity changed (read while the job's fields hold) */
                cpus_seen = cg;
                sched_setaffinity(0, sizeof t->cpus, &t->cpus);
            }
            team_work(t, h.member);
        }
        atomic_fetch_sub_explicit(&t->active, 1, memory_order_release);
    }
}

static void team_stop(void* p) { /* the caller thread's exit (its key's destructor) */
    Team* t = p;
    if (!t) return;
    my_team = NULL;
    atomic_store(&t->quit, 1);
    atomic_fetch_add(&t->gen, 1);
    team_futex(&t->gen, FUTEX_WAKE, INT_MAX);
    for (int i = 0; i < t->size; ++i) pthread_join(t->threads[i], NULL);
    free(t);
}

static void team_forked(void) { my_team = NULL; } /* the child has none of the parent's threads */

static void team_init(void) {
    pthread_key_create(&team_key, team_stop);
    pthread_atfork(NULL, NULL, team_forked);
}

/* The calling thread's team with at least `helpers` helpers, or NULL (none could start). */
static Team* team_get(int helpers) {
    pthread_once(&team_once, team_init);
    Team* t = my_team;
    if (!t) {
        if (!(t = aligned_alloc(64, (sizeof *t + 63) / 64 * 64))) return NULL; /* TeamRange's alignment */
        memset(t, 0, sizeof *t);
        sched_getaffinity(0, sizeof t->cpus, &t->cpus);
        my_team = t;
        pthread_setspecific(team_key, t);
    }
    while (t->size < helpers && t->size < TEAM_MAX) {
        Helper* h = malloc(sizeof *h);
        if (!h) break;
        *h = (Helper){t, t->size + 1, atomic_load(&t->gen)};
        if (pthread_create(&t->threads[t->size], NULL, team_helper, h)) {
            free(h);
            break;
        }
        pthread_setname_np(t->threads[t->size], "pdtop-team"); /* as /proc/<pid>/task/<tid>/comm shows it */
        ++t->size;
    }
    return t->size ? t : NULL;
}

/* fn(arg, k, member) for k in [0, chunks), on the calling thread and up to `helpers` helpers of its team;
   returns when all are done. Runs everything on the caller where no helper can start. */
static void team_run(team_fn fn, void* arg, int64_t chunks, int helpers) {
    Team* t = helpers > 0 && chunks > 1 ? team_get(helpers) : NULL;
    if (!t) {
        for (int64_t k = 0; k < chunks; ++k) fn(arg, k, 0);
        return;
    }
    /* close the last job, and wait out the helpers that may still read its fields */
    atomic_store(&t->open, 0);
    for (unsigned spins = 1; atomic_load(&t->active) > 0; ++spins) {
        team_pause();
        if (spins % 8192 == 0) sched_yield(); /* a helper that lost this core gets it back */
    }
    cpu_set_t now;
    if (sched_getaffinity(0, sizeof now, &now) == 0 && !CPU_EQUAL(&now, &t->cpus)) {
        t->cpus = now;
        atomic_fetch_add(&t->cpus_gen, 1);
    }
    const int members = helpers < t->size ? helpers + 1 : t->size + 1;
    t->fn = fn, t->arg = arg, t->members = members;
    for (int m = 0; m < members; ++m) {
        TeamRange* r = &t->ranges[m];
        r->lo = chunks * m / members, r->len = chunks * (m + 1) / members - r->lo;
        atomic_store_explicit(&r->next, 0, memory_order_relaxed);
        atomic_store_explicit(&r->done, 0, memory_order_relaxed);
    }
    const uint32_t g = atomic_load(&t->gen) + 1 ? atomic_load(&t->gen) + 1 : 1; /* 0 means none open */
    atomic_store(&t->open, g);
    atomic_store(&t->gen, g);
    if (atomic_load(&t->sleepers)) team_futex(&t->gen, FUTEX_WAKE, INT_MAX);
    team_work(t, 0);
    /* the chunks helpers still hold (a late helper finds none left: it never calls fn after this) */
    for (int m = 0; m < members; ++m)
        for (unsigned spins = 1; atomic_load_explicit(&t->ranges[m].done, memory_order_acquire) < t->ranges[m].len;
             ++spins) {
            team_pause();
            if (spins % 8192 == 0) sched_yield();
        }
}
#endif
