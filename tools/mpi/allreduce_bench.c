/* allreduce_bench.c - time MPI_Allreduce (float sum, in place) over message sizes.
 *
 * usage: mpirun -np N build/tools/mpi/allreduce_bench [--json] [BYTES...]
 *
 * For each size (default: 8 KiB to 256 MiB in steps of 4x, then 8 MiB - the
 * orchestrator's default gradient bucket - and 497,759,232 B, the fp32
 * gradients of GPT-2 124M) it runs 2 untimed calls, then R timed ones (R
 * from 3 to 50, fewer for larger sizes), each between barriers, and prints
 * the median time, the algorithm bandwidth bytes / time and the bus bandwidth
 * algbw * 2(N-1)/N (the convention of nccl-tests: what each rank sends over
 * its link in a ring all-reduce, comparable across N). Each timed call's
 * result is checked (every element equals the sum of the ranks' values), so
 * a broken transport cannot report a fast time. Rank 0 prints; the exit
 * status is 1 on a wrong result or a bad argument.
 *
 * Memory: one buffer of the largest size per rank (malloc'd here, freed at
 * exit). Single-threaded.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);

    size_t sizes[MAX_SIZES];
    int n_sizes = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = 1;
            continue;
        }
        char *end = NULL;
        unsigned long long v = strtoull(argv[i], &end, 10);
        if (!end || *end || v < 4 || n_sizes == MAX_SIZES) {
            if (rank == 0)
                fprintf(stderr, "allreduce_bench: bad size '%s' (bytes >= 4)\n", argv[i]);
            MPI_Finalize();
            return 1;
        }
        sizes[n_sizes++] = (size_t)v;
    }
    if (n_sizes == 0) {
        for (size_t s = 8192; s <= (size_t)256 << 20; s *= 4) sizes[n_sizes++] = s;
        sizes[n_sizes++] = (size_t)8 << 20;
        sizes[n_sizes++] = (size_t)124439808 * 4;
    }
    size_t max_bytes = 0;
    for (int i = 0; i < n_sizes; i++)
        if (sizes[i] > max_bytes) max_bytes = sizes[i];
    float *buf = malloc(max_bytes);
    if (!buf) {
        fprintf(stderr, "allreduce_bench: rank %d: cannot allocate %zu bytes\n", rank,
                max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* rank r contributes r + 1 everywhere: the sum is N(N+1)/2, exact in fp32 */
    const float want = (float)world * (float)(world + 1) / 2.0f;
    if (rank == 0 && !json)
        printf("%14s %8s %12s %12s %12s\n", "bytes", "reps", "median_us", "algbw_GB/s",
               "busbw_GB/s");
    int bad = 0;
    for (int si = 0; si < n_sizes; si++) {
        size_t n = sizes[si] / sizeof(float);
        size_t bytes = n * sizeof(float);
        int reps = (int)(((size_t)1 << 28) / bytes);
        if (reps < 3) reps = 3;
        if (reps > 50) reps = 50;
        double t[50] = { 0 };
        for (int r = -2; r < reps; r++) {
            for (size_t k = 0; k < n; k++) buf[k] = (float)(rank + 1);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            double dt = MPI_Wtime() - t0;
            /* the slowest rank's time is the collective's time */
            MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (r >= 0) t[r] = dt;
            if (buf[0] != want || buf[n / 2] != want || buf[n - 1] != want) bad = 1;
        }
        qsort(t, (size_t)reps, sizeof t[0], cmp_double);
        double med = t[reps / 2];
        double alg = (double)bytes / med / 1e9;
        double bus = alg * 2.0 * (world - 1) / world;
        if (rank == 0) {
            if (json)
                printf("{\"bytes\":%zu,\"ranks\":%d,\"reps\":%d,\"median_us\":%.1f,"
                       "\"algbw_GBps\":%.3f,\"busbw_GBps\":%.3f}\n",
                       bytes, world, reps, med * 1e6, alg, bus);
            else
                printf("%14zu %8d %12.1f %12.3f %12.3f\n", bytes, reps, med * 1e6, alg,
                       bus);
            fflush(stdout);
        }
    }
    int any_bad = 0;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (any_bad && rank == 0)
        fprintf(stderr, "allreduce_bench: wrong all-reduce result\n");
    free(buf);
    MPI_Finalize();
    return any_bad ? 1 : 0;
}
