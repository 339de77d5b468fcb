// A model of the durable executor's pipeline, without the executor (docs/BENCHMARKS.md,
// issue 33 in stop 72). W worker threads take ready procedures, spend STEP_NS of their own
// CPU on each (measured by the thread's CPU clock, so a preempted worker still pays the
// whole step), and queue its commit. One committer takes everything queued, spends
// COMMIT_NS of CPU per commit, writes 225 bytes per commit and fdatasyncs, then makes the
// group ready again. N procedures in all, every one always in flight. One mutex guards
// the two queues (the executor has one queue per worker: the model's own overhead per
// step grows when two workers really run at once).
//
//   gcc -O2 -Wall -pthread scripts/pipeline-model.c -o /tmp/pipeline-model
//   /tmp/pipeline-model W N STEP_NS COMMIT_NS [FLAGS]    # e.g. 2 1024 2500 1000
//
// FLAGS (bits): 1 pins worker i to CPU i%2; 2 pins the committer to CPU 1; 4 runs the
// committer at nice -10 (needs CAP_SYS_NICE). It runs 3 s, writes
// /tmp/pipeline-model.log, and prints steps/s, steps per sync, the threads' CPU, and per
// worker the CPU its steps ran on, its time runnable without a CPU (runq, from
// /proc/thread-self/schedstat) and its time waiting for work (idle).
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 8

static long step_ns, commit_ns, flags;
static volatile int stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t queued_cv = PTHREAD_COND_INITIALIZER;
// Under `mu`: procedures ready for a worker, commits queued for the committer.
static long ready, queued, steps, syncs;

struct stats {
    double cpu, runq, idle;
    long on_cpu[2];
};
static struct stats workers[MAX_WORKERS], committer_stats;

static double clock_s(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Seconds this thread has been runnable without a CPU.
static double runq_s(void) {
    unsigned long long run = 0, wait = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (f) {
        if (fscanf(f, "%llu %llu", &run, &wait) != 2) wait = 0;
        fclose(f);
    }
    return wait * 1e-9;
}

static void spin_cpu(long ns) {
    double start = clock_s(CLOCK_THREAD_CPUTIME_ID);
    while ((clock_s(CLOCK_THREAD_CPUTIME_ID) - start) * 1e9 < ns) {
    }
}

static void pin_to(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *worker(void *arg) {
    struct stats *me = &workers[(long)arg];
    if (flags & 1) pin_to((long)arg % 2);
    double cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID), runq0 = runq_s();
    pthread_mutex_lock(&mu);
    while (!stop) {
        if (ready == 0) {
            double idle0 = clock_s(CLOCK_MONOTONIC);
            pthread_cond_wait(&ready_cv, &mu);
            me->idle += clock_s(CLOCK_MONOTONIC) - idle0;
            continue;
        }
        ready--;
        pthread_mutex_unlock(&mu);
        spin_cpu(step_ns);
        int cpu = sched_getcpu();
        if (cpu == 0 || cpu == 1) me->on_cpu[cpu]++;
        pthread_mutex_lock(&mu);
        queued++;
        steps++;
        if (queued == 1) pthread_cond_signal(&queued_cv);
    }
    pthread_mutex_unlock(&mu);
    me->cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    me->runq = runq_s() - runq0;
    return NULL;
}

static void *committer(void *arg) {
    (void)arg;
    static char buf[1 << 20];
    memset(buf, 1, sizeof buf);
    if (flags & 2) pin_to(1);
    if ((flags & 4) && setpriority(PRIO_PROCESS, gettid(), -10)) perror("setpriority");
    int fd = open("/tmp/pipeline-model.log", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        perror("open /tmp/pipeline-model.log");
        exit(1);
    }
    double cpu0 = clock_s(CLOCK_THREAD_CPUTIME_ID), runq0 = runq_s();
    off_t offset = 0;
    pthread_mutex_lock(&mu);
    while (!stop) {
        if (queued == 0) {
            pthread_cond_wait(&queued_cv, &mu);
            continue;
        }
        long group = queued;
        queued = 0;
        pthread_mutex_unlock(&mu);
        spin_cpu(commit_ns * group);
        long bytes = group * 225 < (long)sizeof buf ? group * 225 : (long)sizeof buf;
        if (pwrite(fd, buf, bytes, offset) != bytes || fdatasync(fd)) perror("write");
        offset = offset + bytes > (1 << 28) ? 0 : offset + bytes;
        pthread_mutex_lock(&mu);
        syncs++;
        ready += group;
        pthread_cond_broadcast(&ready_cv);
    }
    pthread_mutex_unlock(&mu);
    committer_stats.cpu = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    committer_stats.runq = runq_s() - runq0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s W N STEP_NS COMMIT_NS [FLAGS]\n", argv[0]);
        return 2;
    }
    long w = atol(argv[1]);
    ready = atol(argv[2]);
    step_ns = atol(argv[3]);
    commit_ns = atol(argv[4]);
    flags = argc > 5 ? atol(argv[5]) : 0;
    if (w < 1 || w > MAX_WORKERS) {
        fprintf(stderr, "W must be 1 to %d\n", MAX_WORKERS);
        return 2;
    }
    pthread_t threads[MAX_WORKERS], commit_thread;
    for (long i = 0; i < w; i++) pthread_create(&threads[i], NULL, worker, (void *)i);
    pthread_create(&commit_thread, NULL, committer, NULL);
    sleep(3);
    pthread_mutex_lock(&mu);
    stop = 1;
    pthread_cond_broadcast(&ready_cv);
    pthread_cond_broadcast(&queued_cv);
    pthread_mutex_unlock(&mu);
    for (long i = 0; i < w; i++) pthread_join(threads[i], NULL);
    pthread_join(commit_thread, NULL);

    double worker_cpu = 0;
    for (long i = 0; i < w; i++) worker_cpu += workers[i].cpu;
    printf("W=%ld flags=%ld step=%ldns commit=%ldns: %.0f steps/s, %.0f per sync, workers %.2f CPUs, "
           "committer %.2f CPUs (runq %.2fs);",
           w, flags, step_ns, commit_ns, steps / 3.0, (double)steps / (syncs ? syncs : 1),
           worker_cpu / 3, committer_stats.cpu / 3, committer_stats.runq);
    for (long i = 0; i < w; i++)
        printf(" w%ld: cpu0 %ld cpu1 %ld runq %.2fs idle %.2fs", i, workers[i].on_cpu[0],
               workers[i].on_cpu[1], workers[i].runq, workers[i].idle);
    printf("\n");
    return 0;
}
