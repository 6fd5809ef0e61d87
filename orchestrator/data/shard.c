/*
 * shard.c - token shard files (atomic write, validated mmap read), datasets
 * over many shards, and corpus preparation. See shard.h for the format.
 */
#include "orchestrator/data/shard.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orchestrator/core/fsio.h"
#include "orchestrator/core/util.h"
#include "orchestrator/data/tokenizer.h"

#define HINT_PREPARE "re-create it with `orch prepare`"

/* ---- checksum ------------------------------------------------------------
 * A 64-bit hash over 8-byte little-endian words (tail zero-padded) with a
 * multiply-rotate step and a final avalanche; fast (several GB/s) and
 * sensitive to any changed, swapped or missing byte. Not cryptographic. */

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t shard_checksum(const unsigned char *p, size_t n) {
    const uint64_t k1 = 0x9e3779b185ebca87ULL, k2 = 0xc2b2ae3d27d4eb4fULL;
    uint64_t h = 0x27d4eb2f165667c5ULL ^ ((uint64_t)n * k1);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        w = le64toh(w);
        h ^= rotl64(w * k2, 31) * k1;
        h = rotl64(h, 27) * k1 + 0x52dce729;
    }
    if (i < n) {
        uint64_t w = 0;
        for (size_t j = 0; i + j < n; j++) w |= (uint64_t)p[i + j] << (8 * j);
        h ^= rotl64(w * k2, 31) * k1;
        h = rotl64(h, 27) * k1 + 0x52dce729;
    }
    h ^= h >> 33;
    h *= k2;
    h ^= h >> 29;
    h *= 0x165667b19e3779f9ULL;
    h ^= h >> 32;
    return h;
}

/* ---- header encode / decode ------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v) {
    v = htole32(v);
    memcpy(p, &v, 4);
}
static void put_u64(unsigned char *p, uint64_t v) {
    v = htole64(v);
    memcpy(p, &v, 8);
}
static uint32_t get_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}
static uint64_t get_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static uint32_t width_for_vocab(uint32_t vocab) { return vocab <= 65536 ? 2 : 4; }

static void header_build(unsigned char h[SHARD_HEADER_SIZE], const char *name,
                         uint32_t vocab, uint64_t n, uint64_t payload_sum) {
    memset(h, 0, SHARD_HEADER_SIZE);
    memcpy(h, SHARD_MAGIC, 8); /* includes the NUL */
    put_u32(h + 8, SHARD_VERSION);
    put_u32(h + 12, SHARD_HEADER_SIZE);
    put_u32(h + 16, width_for_vocab(vocab));
    put_u32(h + 20, vocab);
    memcpy(h + 24, name, strlen(name));
    put_u64(h + 40, n);
    put_u64(h + 48, payload_sum);
    put_u64(h + 56, shard_checksum(h, 56));
}

/* Validate a header against the file size; fills info. */
static int header_parse(const char *path, const unsigned char *h, uint64_t file_size,
                        shard_info *info, char *err, size_t err_cap) {
    if (file_size < 8 || memcmp(h, SHARD_MAGIC, 8) != 0) {
        util_set_err(err, err_cap,
                     "%s is not an orch token shard (bad magic; expected "
                     "\"ORCHTOK\"); " HINT_PREPARE,
                     path);
        return -1;
    }
    if (file_size < SHARD_HEADER_SIZE) {
        util_set_err(err, err_cap,
                     "%s is truncated: %llu bytes, shorter than the %u-byte "
                     "header; " HINT_PREPARE,
                     path, (unsigned long long)file_size, SHARD_HEADER_SIZE);
        return -1;
    }
    uint32_t version = get_u32(h + 8);
    if (version != SHARD_VERSION) {
        util_set_err(err, err_cap,
                     "%s has shard format version %u; this orch reads version "
                     "%u (" HINT_PREPARE " using this orch)",
                     path, version, SHARD_VERSION);
        return -1;
    }
    if (get_u32(h + 12) != SHARD_HEADER_SIZE ||
        get_u64(h + 56) != shard_checksum(h, 56)) {
        util_set_err(err, err_cap,
                     "%s has a corrupt header (checksum mismatch); " HINT_PREPARE, path);
        return -1;
    }
    memset(info, 0, sizeof *info);
    info->version = version;
    info->token_width = get_u32(h + 16);
    info->vocab_size = get_u32(h + 20);
    info->n_tokens = get_u64(h + 40);
    info->payload_checksum = get_u64(h + 48);
    memcpy(info->tokenizer, h + 24, 16);
    if (info->tokenizer[15] != '\0' || info->tokenizer[0] == '\0' ||
        info->vocab_size == 0 || info->vocab_size > (uint32_t)INT32_MAX ||
        info->token_width != width_for_vocab(info->vocab_size)) {
        util_set_err(err, err_cap,
                     "%s has an inconsistent header (tokenizer, vocab size or "
                     "token width); " HINT_PREPARE,
                     path);
        return -1;
    }
    if (info->n_tokens > (UINT64_MAX - SHARD_HEADER_SIZE) / info->token_width) {
        util_set_err(err, err_cap, "%s has an impossible token count; " HINT_PREPARE,
                     path);
        return -1;
    }
    uint64_t want = SHARD_HEADER_SIZE + info->n_tokens * info->token_width;
    if (file_size != want) {
        util_set_err(err, err_cap,
                     "%s is %s: header says %llu tokens (%llu bytes), file "
                     "has %llu bytes; " HINT_PREPARE,
                     path, file_size < want ? "truncated" : "the wrong size",
                     (unsigned long long)info->n_tokens, (unsigned long long)want,
                     (unsigned long long)file_size);
        return -1;
    }
    return 0;
}

/* Check the payload checksum and that every token is below the vocab. */
static int payload_verify(const char *path, const shard_info *info,
                          const unsigned char *payload, char *err, size_t err_cap) {
    size_t bytes = (size_t)(info->n_tokens * info->token_width);
    if (shard_checksum(payload, bytes) != info->payload_checksum) {
        util_set_err(err, err_cap,
                     "%s is corrupt: payload checksum mismatch; " HINT_PREPARE, path);
        return -1;
    }
    uint32_t max = 0;
    if (info->token_width == 2) {
        for (uint64_t i = 0; i < info->n_tokens; i++) {
            uint16_t v;
            memcpy(&v, payload + 2 * i, 2);
            v = le16toh(v);
            if (v > max) max = v;
        }
    } else {
        for (uint64_t i = 0; i < info->n_tokens; i++) {
            uint32_t v;
            memcpy(&v, payload + 4 * i, 4);
            v = le32toh(v);
            if (v > max) max = v;
        }
    }
    if (info->n_tokens > 0 && max >= info->vocab_size) {
        util_set_err(err, err_cap,
                     "%s holds token id %u, outside its vocabulary of %u; " HINT_PREPARE,
                     path, max, info->vocab_size);
        return -1;
    }
    return 0;
}

/* ---- writing ------------------------------------------------------------ */

int shard_write_file(const char *path, const char *tokenizer_name, uint32_t vocab_size,
                     const int32_t *ids, uint64_t n, char *err, size_t err_cap) {
    if (!tokenizer_name || !*tokenizer_name ||
        strlen(tokenizer_name) > SHARD_TOKENIZER_NAME_MAX) {
        util_set_err(err, err_cap, "shard %s: tokenizer name must be 1..%d characters",
                     path, SHARD_TOKENIZER_NAME_MAX);
        return -1;
    }
    if (vocab_size == 0) {
        util_set_err(err, err_cap, "shard %s: vocab size must be positive", path);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= vocab_size) {
            util_set_err(err, err_cap,
                         "shard %s: token %lld at position %llu is outside "
                         "the vocabulary (0..%u)",
                         path, (long long)ids[i], (unsigned long long)i, vocab_size - 1);
            return -1;
        }
    }
    uint32_t width = width_for_vocab(vocab_size);
    /* Convert to the on-disk width in one buffer (also what we checksum). */
    size_t bytes = (size_t)(n * width);
    unsigned char *payload = malloc(bytes ? bytes : 1);
    if (!payload) {
        util_set_err(err, err_cap, "out of memory writing %s", path);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (width == 2) {
            uint16_t v = htole16((uint16_t)ids[i]);
            memcpy(payload + 2 * i, &v, 2);
        } else {
            uint32_t v = htole32((uint32_t)ids[i]);
            memcpy(payload + 4 * i, &v, 4);
        }
    }
    unsigned char h[SHARD_HEADER_SIZE];
    header_build(h, tokenizer_name, vocab_size, n, shard_checksum(payload, bytes));
    fsio_atomic_file f;
    int rc = fsio_atomic_open(&f, path, err, err_cap);
    if (rc == 0 && (fsio_atomic_write(&f, h, sizeof h, err, err_cap) != 0 ||
                    fsio_atomic_write(&f, payload, bytes, err, err_cap) != 0)) {
        fsio_atomic_abort(&f);
        rc = -1;
    }
    free(payload);
    return rc == 0 ? fsio_atomic_commit(&f, err, err_cap) : -1;
}

/* ---- reading ------------------------------------------------------------ */

/* Open and mmap path; *map is NULL for an empty file. */
static int map_file(const char *path, const unsigned char **map, size_t *size, char *err,
                    size_t err_cap) {
    *map = NULL;
    *size = 0;
    int fd;
    struct stat st;
    char why[512];
    if (fsio_open_regular(path, &fd, &st, why, sizeof why) != 0) {
        if (errno == EINVAL || errno == EISDIR)
            util_set_err(err, err_cap, "%s is not a regular file", path);
        else
            util_set_err(err, err_cap, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    if (st.st_size > 0) {
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            util_set_err(err, err_cap, "cannot mmap %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        *map = m;
    }
    close(fd);
    *size = (size_t)st.st_size;
    return 0;
}

int shard_read_info(const char *path, int verify_payload, shard_info *info, char *err,
                    size_t err_cap) {
    const unsigned char *map;
    size_t size;
    if (map_file(path, &map, &size, err, err_cap) != 0) return -1;
    static const unsigned char empty[SHARD_HEADER_SIZE];
    int rc = header_parse(path, map ? map : empty, size, info, err, err_cap);
    if (rc == 0 && verify_payload)
        rc = payload_verify(path, info, map + SHARD_HEADER_SIZE, err, err_cap);
    if (map) munmap((void *)map, size);
    return rc;
}

typedef struct ds_shard {
    char *path;
    const unsigned char *map;
    size_t map_size;
    uint32_t width;
    uint64_t n_tokens;
    uint64_t start; /* global offset of the first token */
} ds_shard;

struct dataset {
    ds_shard *shards;
    size_t n_shards;
    uint64_t total;
    uint32_t vocab_size;
    char tokenizer[SHARD_TOKENIZER_NAME_MAX + 1];
};

/* Why glob(3) found no shards: the directory part of the pattern (before
 * its first wildcard) or a plain path does not exist, nothing matches in an
 * existing directory, or the directory cannot be read. */
static void explain_no_match(const char *pattern, int grc, char *err, size_t err_cap) {
    size_t fixed = strcspn(pattern, "*?[\\");
    const char *slash = NULL;
    for (const char *p = pattern; p < pattern + fixed; p++)
        if (*p == '/') slash = p;
    struct stat st;
    char dir[PATH_MAX];
    size_t n = !slash ? 0 : slash == pattern ? 1 : (size_t)(slash - pattern);
    if (n && n < sizeof dir) {
        memcpy(dir, pattern, n);
        dir[n] = '\0';
        int rc = stat(dir, &st);
        int missing = rc != 0 && (errno == ENOENT || errno == ENOTDIR);
        int not_dir = rc == 0 && !S_ISDIR(st.st_mode);
        if (missing || not_dir) {
            util_set_err(err, err_cap,
                         "%s: no such file or directory (%s %s; create the "
                         "shards with `orch prepare`)",
                         pattern, dir, not_dir ? "is not a directory" : "does not exist");
            return;
        }
    }
    if (pattern[fixed] == '\0' && stat(pattern, &st) != 0 && errno == ENOENT) {
        util_set_err(err, err_cap,
                     "%s: no such file or directory (create it with `orch "
                     "prepare`)",
                     pattern);
        return;
    }
    if (grc == 0 || grc == GLOB_NOMATCH)
        util_set_err(err, err_cap,
                     "no token shards match %s (create them with `orch "
                     "prepare`)",
                     pattern);
    else
        util_set_err(err, err_cap, "cannot list %s: %s", pattern,
                     grc == GLOB_NOSPACE ? "out of memory" : "read error");
}

int dataset_open(const char *glob_pattern, dataset **out, char *err, size_t err_cap) {
    return dataset_open_flags(glob_pattern, DATASET_VERIFY_CHECKSUM, out, err, err_cap);
}

int dataset_open_flags(const char *glob_pattern, unsigned flags, dataset **out, char *err,
                       size_t err_cap) {
    *out = NULL;
    if (!glob_pattern || !*glob_pattern) {
        util_set_err(err, err_cap, "no token shard path given");
        return -1;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    int grc = glob(glob_pattern, GLOB_ERR, NULL, &g);
    if (grc != 0 || g.gl_pathc == 0) {
        globfree(&g);
        explain_no_match(glob_pattern, grc, err, err_cap);
        return -1;
    }
    dataset *ds = util_calloc(1, sizeof *ds);
    if (ds) ds->shards = util_calloc(g.gl_pathc, sizeof *ds->shards);
    if (!ds || !ds->shards) {
        free(ds);
        globfree(&g);
        util_set_err(err, err_cap, "out of memory");
        return -1;
    }
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) {
        const char *path = g.gl_pathv[i];
        ds_shard *s = &ds->shards[ds->n_shards];
        s->path = strdup(path);
        if (!s->path) {
            util_set_err(err, err_cap, "out of memory");
            rc = -1;
            break;
        }
        ds->n_shards++;
        if (map_file(path, &s->map, &s->map_size, err, err_cap) != 0) {
            rc = -1;
            break;
        }
        static const unsigned char empty[SHARD_HEADER_SIZE];
        shard_info info;
        rc =
            header_parse(path, s->map ? s->map : empty, s->map_size, &info, err, err_cap);
        if (rc == 0 && (flags & DATASET_VERIFY_CHECKSUM))
            rc = payload_verify(path, &info, s->map + SHARD_HEADER_SIZE, err, err_cap);
        if (rc != 0) break;
        if (i == 0) {
            ds->vocab_size = info.vocab_size;
            memcpy(ds->tokenizer, info.tokenizer, sizeof ds->tokenizer);
        } else if (strcmp(ds->tokenizer, info.tokenizer) != 0 ||
                   ds->vocab_size != info.vocab_size) {
            util_set_err(err, err_cap,
                         "%s was made with tokenizer %s (vocab %u) but %s with "
                         "%s (vocab %u); shards of one dataset must share a "
                         "tokenizer",
                         path, info.tokenizer, info.vocab_size, ds->shards[0].path,
                         ds->tokenizer, ds->vocab_size);
            rc = -1;
            break;
        }
        s->width = info.token_width;
        s->n_tokens = info.n_tokens;
        s->start = ds->total;
        ds->total += info.n_tokens;
        if (s->map) (void)madvise((void *)s->map, s->map_size, MADV_RANDOM);
    }
    globfree(&g);
    if (rc == 0 && ds->total == 0) {
        util_set_err(err, err_cap, "the token shards matching %s hold no tokens",
                     glob_pattern);
        rc = -1;
    }
    if (rc != 0) {
        dataset_close(ds);
        return -1;
    }
    *out = ds;
    return 0;
}

void dataset_close(dataset *ds) {
    if (!ds) return;
    for (size_t i = 0; i < ds->n_shards; i++) {
        if (ds->shards[i].map) munmap((void *)ds->shards[i].map, ds->shards[i].map_size);
        free(ds->shards[i].path);
    }
    free(ds->shards);
    free(ds);
}

uint64_t dataset_total_tokens(const dataset *ds) { return ds->total; }
uint32_t dataset_vocab_size(const dataset *ds) { return ds->vocab_size; }
const char *dataset_tokenizer_name(const dataset *ds) { return ds->tokenizer; }
size_t dataset_shard_count(const dataset *ds) { return ds->n_shards; }
const char *dataset_shard_path(const dataset *ds, size_t i) {
    return i < ds->n_shards ? ds->shards[i].path : NULL;
}

int dataset_read(const dataset *ds, uint64_t global_offset, uint64_t n, int32_t *dst) {
    if (global_offset > ds->total || n > ds->total - global_offset) return -1;
    if (n == 0) return 0;
    /* Last shard whose start <= offset (empty shards are skipped below). */
    size_t lo = 0, hi = ds->n_shards;
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (ds->shards[mid].start <= global_offset)
            lo = mid;
        else
            hi = mid;
    }
    uint64_t off = global_offset - ds->shards[lo].start;
    size_t si = lo;
    while (n > 0) {
        const ds_shard *s = &ds->shards[si];
        if (off >= s->n_tokens) { /* past this shard (or it is empty) */
            off -= s->n_tokens;
            si++;
            continue;
        }
        uint64_t k = s->n_tokens - off < n ? s->n_tokens - off : n;
        const unsigned char *p = s->map + SHARD_HEADER_SIZE + off * s->width;
        if (s->width == 2) {
            for (uint64_t i = 0; i < k; i++) {
                uint16_t v;
                memcpy(&v, p + 2 * i, 2);
                dst[i] = (int32_t)le16toh(v);
            }
        } else {
            for (uint64_t i = 0; i < k; i++) {
                uint32_t v;
                memcpy(&v, p + 4 * i, 4);
                dst[i] = (int32_t)le32toh(v);
            }
        }
        dst += k;
        n -= k;
        off = 0;
        si++;
    }
    return 0;
}

/* ---- corpus preparation ----------------------------------------------- */

enum { DEFAULT_SHARD_TOKENS = 50000000 };

typedef struct prep_state {
    const shard_prepare_opts *o;
    const char *tok_name;
    uint32_t vocab;
    const char *prefix; /* "train" | "val" */
    int32_t *buf;       /* current shard */
    uint64_t buf_n, buf_cap;
    uint32_t shard_no;
    uint64_t tokens;
    uint64_t base_bytes; /* input bytes before this part */
    uint64_t total_bytes;
    uint64_t last_progress;
    char *err;
    size_t err_cap;
} prep_state;

static int prep_flush(prep_state *st) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s_%03u.bin", st->o->out_dir, st->prefix,
                 st->shard_no) >= (int)sizeof path) {
        util_set_err(st->err, st->err_cap, "output path too long: %s", st->o->out_dir);
        return -1;
    }
    if (shard_write_file(path, st->tok_name, st->vocab, st->buf, st->buf_n, st->err,
                         st->err_cap) != 0)
        return -1;
    st->shard_no++;
    st->buf_n = 0;
    return 0;
}

static int prep_sink(void *user, const int32_t *ids, size_t n, size_t bytes_done) {
    prep_state *st = user;
    while (n > 0) {
        uint64_t room = st->buf_cap - st->buf_n;
        uint64_t k = n < room ? n : room;
        memcpy(st->buf + st->buf_n, ids, k * sizeof *ids);
        st->buf_n += k;
        st->tokens += k;
        ids += k;
        n -= k;
        if (st->buf_n == st->buf_cap && n > 0 && prep_flush(st) != 0) return -1;
    }
    uint64_t done = st->base_bytes + bytes_done;
    if (st->o->progress && done - st->last_progress >= (64u << 10) &&
        done < st->total_bytes) {
        st->last_progress = done;
        st->o->progress(st->o->progress_user, done, st->total_bytes);
    }
    return 0;
}

/* 1 when NAME is an fsio temp file (prefix_NNN.bin.tmp.PID.N) of a process
 * that is gone: a prepare that died mid-write. */
static int dead_temp(const char *name) {
    long pid;
    return fsio_tmp_name_pid(name, &pid) && (pid_t)pid != getpid() &&
           kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* Remove prefix_NNN.bin files with NNN >= keep (left from a larger run) and
 * dead processes' temp files of prefix_NNN.bin. A stale shard that stays
 * would join the new set's glob, so failing to remove one is an error. */
static int remove_stale(const char *dir, const char *prefix, uint32_t keep, char *err,
                        size_t err_cap) {
    DIR *d = fsio_opendir(dir, err, err_cap);
    if (!d) return -1;
    size_t pl = strlen(prefix);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (strncmp(nm, prefix, pl) != 0 || nm[pl] != '_') continue;
        const char *q = nm + pl + 1;
        size_t digits = strspn(q, "0123456789");
        if (digits < 3 || strncmp(q + digits, ".bin", 4) != 0) continue;
        if (q[digits + 4] ? !dead_temp(nm) : (uint32_t)strtoul(q, NULL, 10) < keep)
            continue;
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/%s", dir, nm) < (int)sizeof path &&
            fsio_unlink(path, err, err_cap) != 0 && errno != ENOENT)
            rc = -1;
    }
    closedir(d);
    return rc;
}

static int prep_part(prep_state *st, const tokenizer *tok, const char *text, size_t len,
                     uint32_t *shards, uint64_t *tokens) {
    st->shard_no = 0;
    st->tokens = 0;
    st->buf_n = 0;
    if (len > 0 &&
        tokenizer_encode_stream(tok, text, len, prep_sink, st, st->err, st->err_cap) != 0)
        return -1;
    if ((st->buf_n > 0 || st->shard_no == 0) && prep_flush(st) != 0) return -1;
    *shards = st->shard_no;
    *tokens = st->tokens;
    return 0;
}

/* Where the validation part starts: the last val_fraction of the input,
   moved forward to the next line start (or back to the last line start if
   there is none after it). Returns len for "no validation part", or
   (size_t)-1 if the input cannot be split on a line boundary. */
static size_t split_point(const char *text, size_t len, double frac) {
    if (frac <= 0) return len;
    size_t want = (size_t)((double)len * frac);
    if (want == 0) want = 1;
    size_t split = len - want;
    size_t p = split;
    while (p < len && !(p > 0 && text[p - 1] == '\n')) p++;
    if (p > 0 && p < len) return p;
    /* Back to the start of the line that holds the split point. */
    p = split;
    while (p > 0 && text[p - 1] != '\n') p--;
    if (p > 0 && p < len) return p;
    /* The input's only line break is its last byte (or there is none). */
    return (size_t)-1;
}

int shard_prepare_corpus(const shard_prepare_opts *o, shard_prepare_result *result,
                         char *err, size_t err_cap) {
    memset(result, 0, sizeof *result);
    double t0 = util_now();
    if (!o || (!o->tokenizer && !o->tok) || !o->input || !o->out_dir) {
        util_set_err(err, err_cap,
                     "prepare needs a tokenizer, an input file and an output "
                     "directory");
        return -1;
    }
    if (!(o->val_fraction >= 0 && o->val_fraction <= 0.5)) {
        util_set_err(err, err_cap, "validation fraction %g is outside [0, 0.5]",
                     o->val_fraction);
        return -1;
    }
    tokenizer *owned = NULL;
    const tokenizer *tok = o->tok;
    if (!tok) {
        if (tokenizer_open(o->tokenizer, o->vocab_dir, &owned, err, err_cap) != 0)
            return -1;
        tok = owned;
    }
    const unsigned char *map = NULL;
    size_t size = 0;
    int rc = -1;
    prep_state st;
    memset(&st, 0, sizeof st);
    if (map_file(o->input, &map, &size, err, err_cap) != 0) goto done;
    if (size == 0) {
        util_set_err(err, err_cap, "%s is empty: nothing to prepare", o->input);
        goto done;
    }
    const char *text = (const char *)map;
    size_t split = split_point(text, size, o->val_fraction);
    if (split == (size_t)-1) {
        util_set_err(err, err_cap,
                     "%s has a single line, so it cannot be split into train "
                     "and validation parts on a line boundary (use a larger "
                     "corpus or --val-fraction 0)",
                     o->input);
        goto done;
    }
    if (fsio_mkdir_p(o->out_dir, err, err_cap) != 0) goto done;
    (void)madvise((void *)map, size, MADV_SEQUENTIAL);

    uint64_t shard_tokens = o->shard_tokens ? o->shard_tokens : DEFAULT_SHARD_TOKENS;
    /* Every token covers at least one byte: no part has more tokens than
       bytes, which bounds the buffer. */
    st.buf_cap = shard_tokens < size ? shard_tokens : size;
    st.buf = malloc((size_t)st.buf_cap * sizeof *st.buf);
    if (!st.buf) {
        util_set_err(err, err_cap, "out of memory for a %llu-token shard",
                     (unsigned long long)st.buf_cap);
        goto done;
    }
    st.o = o;
    st.tok_name = tokenizer_name(tok);
    st.vocab = tokenizer_vocab_size(tok);
    st.total_bytes = size;
    st.err = err;
    st.err_cap = err_cap;

    st.prefix = "train";
    st.base_bytes = 0;
    if (prep_part(&st, tok, text, split, &result->train_shards, &result->train_tokens) !=
        0)
        goto done;
    if (remove_stale(o->out_dir, "train", result->train_shards, err, err_cap) != 0)
        goto done;
    st.prefix = "val";
    st.base_bytes = split;
    if (split < size) {
        if (prep_part(&st, tok, text + split, size - split, &result->val_shards,
                      &result->val_tokens) != 0)
            goto done;
    }
    if (remove_stale(o->out_dir, "val", result->val_shards, err, err_cap) != 0) goto done;
    if (o->progress) o->progress(o->progress_user, size, size);
    result->input_bytes = size;
    result->train_bytes = split;
    result->val_bytes = size - split;
    result->vocab_size = st.vocab;
    rc = 0;
done:
    free(st.buf);
    if (map) munmap((void *)map, size);
    tokenizer_free(owned);
    result->seconds = util_now() - t0;
    return rc;
}
