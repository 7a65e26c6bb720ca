/* safetensors tensor sets: the dtype table, opening one file, a sharded
 * checkpoint (model.safetensors.index.json) or a directory of *.safetensors
 * files, lookup by name, and the writer (see safetensors.h for the format and
 * the validation rules). Not the header parser: safetensors_header.c reads
 * each file's JSON header into the builder this file turns into a set. */
#include "format/safetensors_internal.h"

#include "base/error.h"
#include "base/json.h"
#include "base/log.h"
#include "base/mmap.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct pt_st_file {
    pt_mmap map;
    int mapped; /* 0 for pt_st_open_memory */
};

static const struct {
    const char *name;
    size_t size;
} dtype_info[PT_DTYPE_COUNT] = {
    [PT_DTYPE_F32] = {"F32", 4},     [PT_DTYPE_F16] = {"F16", 2},
    [PT_DTYPE_BF16] = {"BF16", 2},   [PT_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [PT_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [PT_DTYPE_I8] = {"I8", 1},
    [PT_DTYPE_U8] = {"U8", 1},       [PT_DTYPE_I16] = {"I16", 2},
    [PT_DTYPE_U16] = {"U16", 2},     [PT_DTYPE_I32] = {"I32", 4},
    [PT_DTYPE_U32] = {"U32", 4},     [PT_DTYPE_I64] = {"I64", 8},
    [PT_DTYPE_U64] = {"U64", 8},     [PT_DTYPE_F64] = {"F64", 8},
    [PT_DTYPE_BOOL] = {"BOOL", 1},
};

const char *pt_dtype_name(pt_dtype dt) {
    return (unsigned)dt < PT_DTYPE_COUNT ? dtype_info[dt].name : "?";
}
size_t pt_dtype_size(pt_dtype dt) { return (unsigned)dt < PT_DTYPE_COUNT ? dtype_info[dt].size : 0; }
int pt_dtype_from_name(const char *name, size_t len) {
    for (int i = 0; i < PT_DTYPE_COUNT; i++)
        if (strlen(dtype_info[i].name) == len && !memcmp(dtype_info[i].name, name, len)) return i;
    return -1;
}

char *pt_shape_str(const int64_t *shape, int ndim, char *buf, size_t n) {
    size_t o = 0;
    if (n == 0) return buf;
    buf[0] = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (int i = 0; i < ndim && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
    return buf;
}

/* ------------------------------------------------------------------ */
/* Set construction. */

pt_status st_grow(void **p, int *cap, int need, size_t elem) {
    if (need <= *cap) return PT_OK;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*p, (size_t)nc * elem);
    if (!q) return pt_error(PT_ERR_NOMEM, "out of memory reading a safetensors header");
    *p = q;
    *cap = nc;
    return PT_OK;
}

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Builds the hash table; reports duplicates (naming both files). */
static pt_status finish_set(pt_tensor_set *set, builder *b) {
    set->tensors = b->v;
    set->n_tensors = b->n;
    set->meta = b->meta;
    set->n_meta = b->n_meta;
    b->v = NULL;
    b->meta = NULL;
    size_t cap = 16;
    while (cap < (size_t)set->n_tensors * 2) cap *= 2;
    set->hash = malloc(cap * sizeof *set->hash);
    if (!set->hash) return pt_error(PT_ERR_NOMEM, "out of memory");
    set->hash_cap = cap;
    for (size_t i = 0; i < cap; i++) set->hash[i] = -1;
    for (int i = 0; i < set->n_tensors; i++) {
        size_t h = hash_str(set->tensors[i].name) & (cap - 1);
        while (set->hash[h] >= 0) {
            const pt_tensor *o = &set->tensors[set->hash[h]];
            if (!strcmp(o->name, set->tensors[i].name)) {
                const pt_tensor *t = &set->tensors[i];
                if (o->file_index == t->file_index)
                    return pt_error(PT_ERR_FORMAT, "%s: duplicate tensor name '%s'", set->file_paths[t->file_index],
                                    t->name);
                return pt_error(PT_ERR_FORMAT, "tensor '%s' appears in two files: %s and %s", t->name,
                                set->file_paths[o->file_index], set->file_paths[t->file_index]);
            }
            h = (h + 1) & (cap - 1);
        }
        set->hash[h] = i;
    }
    return PT_OK;
}

const pt_tensor *pt_st_find(const pt_tensor_set *set, const char *name) {
    if (!set || !set->hash) return NULL;
    size_t h = hash_str(name) & (set->hash_cap - 1);
    while (set->hash[h] >= 0) {
        const pt_tensor *t = &set->tensors[set->hash[h]];
        if (!strcmp(t->name, name)) return t;
        h = (h + 1) & (set->hash_cap - 1);
    }
    return NULL;
}

const char *pt_st_meta_get(const pt_tensor_set *set, const char *key) {
    for (int i = 0; i < set->n_meta; i++)
        if (!strcmp(set->meta[i].key, key)) return set->meta[i].value;
    return NULL;
}

void pt_st_close(pt_tensor_set *set) {
    if (!set) return;
    for (int i = 0; i < set->n_files; i++) {
        if (set->files && set->files[i]) {
            if (set->files[i]->mapped) pt_mmap_close(&set->files[i]->map);
            free(set->files[i]);
        }
        if (set->file_paths) free(set->file_paths[i]);
    }
    free(set->files);
    free(set->file_paths);
    free(set->tensors);
    free(set->meta);
    free(set->hash);
    if (set->arena) {
        pt_arena_free(set->arena);
        free(set->arena);
    }
    memset(set, 0, sizeof *set);
}

static pt_status set_init(pt_tensor_set *set, int n_files) {
    memset(set, 0, sizeof *set);
    set->arena = calloc(1, sizeof *set->arena);
    set->files = calloc((size_t)(n_files ? n_files : 1), sizeof *set->files);
    set->file_paths = calloc((size_t)(n_files ? n_files : 1), sizeof *set->file_paths);
    if (!set->arena || !set->files || !set->file_paths) {
        free(set->arena);
        free(set->files);
        free(set->file_paths);
        memset(set, 0, sizeof *set);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    pt_arena_init(set->arena, 1 << 16);
    return PT_OK;
}

static pt_status add_file(pt_tensor_set *set, const char *path, builder *b) {
    int idx = set->n_files;
    pt_st_file *f = calloc(1, sizeof *f);
    char *p = strdup(path);
    if (!f || !p) {
        free(f);
        free(p);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    set->files[idx] = f;
    set->file_paths[idx] = p;
    set->n_files++;
    PT_TRY(pt_mmap_open(&f->map, path));
    f->mapped = 1;
    return st_parse_file(f->map.data, f->map.size, path, idx, set->arena, b);
}

static void builder_free(builder *b) {
    free(b->v);
    free(b->meta);
}

pt_status pt_st_open_memory(const void *buf, size_t size, const char *what, pt_tensor_set *out) {
    pt_tensor_set set;
    PT_TRY(set_init(&set, 1));
    builder b = {0};
    pt_st_file *f = calloc(1, sizeof *f);
    char *p = strdup(what ? what : "<memory>");
    pt_status s = PT_OK;
    if (!f || !p) {
        free(f);
        free(p);
        s = pt_error(PT_ERR_NOMEM, "out of memory");
    } else {
        set.files[0] = f;
        set.file_paths[0] = p;
        set.n_files = 1;
        s = st_parse_file(buf, size, p, 0, set.arena, &b);
    }
    if (!s) s = finish_set(&set, &b);
    builder_free(&b);
    if (s) {
        pt_st_close(&set);
        return s;
    }
    *out = set;
    return PT_OK;
}

pt_status pt_st_open_file(const char *path, pt_tensor_set *out) {
    pt_tensor_set set;
    PT_TRY(set_init(&set, 1));
    builder b = {0};
    pt_status s = add_file(&set, path, &b);
    if (!s) s = finish_set(&set, &b);
    builder_free(&b);
    if (s) {
        pt_st_close(&set);
        return s;
    }
    *out = set;
    return PT_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* A shard name must be a plain file name inside the directory. */
static int safe_name(const char *s) {
    return s[0] && !strchr(s, '/') && strcmp(s, ".") && strcmp(s, "..");
}

static pt_status open_index(const char *dir, const char *index_path, pt_tensor_set *out) {
    cJSON *root = NULL;
    PT_TRY(pt_json_load_file(index_path, 1, &root));
    pt_status s = PT_OK;
    char **names = NULL;
    int n_names = 0;
    builder b = {0};
    pt_tensor_set set;
    int set_ok = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        s = pt_error(PT_ERR_FORMAT, "%s: missing or non-object field 'weight_map'", index_path);
        goto done;
    }
    int n_map = cJSON_GetArraySize(wm);
    names = calloc((size_t)n_map + 1, sizeof *names);
    if (!names) {
        s = pt_error(PT_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (const cJSON *e = wm->child; e; e = e->next) {
        if (!cJSON_IsString(e)) {
            s = pt_error(PT_ERR_FORMAT, "%s: weight_map['%s']: expected a file name string", index_path, e->string);
            goto done;
        }
        if (!safe_name(e->valuestring)) {
            s = pt_error(PT_ERR_FORMAT, "%s: weight_map['%s']: shard '%s' is not a file name in the model directory",
                         index_path, e->string, e->valuestring);
            goto done;
        }
        int found = 0;
        for (int i = 0; i < n_names && !found; i++) found = !strcmp(names[i], e->valuestring);
        if (!found) names[n_names++] = e->valuestring;
    }
    if (n_names == 0) {
        s = pt_error(PT_ERR_FORMAT, "%s: weight_map is empty", index_path);
        goto done;
    }
    qsort(names, (size_t)n_names, sizeof *names, cmp_str);
    if ((s = set_init(&set, n_names))) goto done;
    set_ok = 1;
    for (int i = 0; i < n_names && !s; i++) {
        char *p = pt_path_join(dir, names[i]);
        if (!p) {
            s = pt_error(PT_ERR_NOMEM, "out of memory");
            break;
        }
        if (!pt_is_file(p)) s = pt_error(PT_ERR_NOT_FOUND, "%s: shard '%s' named in the index does not exist",
                                          index_path, p);
        else s = add_file(&set, p, &b);
        free(p);
    }
    if (!s) s = finish_set(&set, &b);
    /* every mapped tensor must be where the map says */
    for (const cJSON *e = wm->child; e && !s; e = e->next) {
        const pt_tensor *t = pt_st_find(&set, e->string);
        if (!t) {
            s = pt_error(PT_ERR_NOT_FOUND, "%s: tensor '%s' is mapped to '%s' but that shard does not contain it",
                         index_path, e->string, e->valuestring);
            break;
        }
        const char *fp = set.file_paths[t->file_index];
        const char *base = strrchr(fp, '/');
        base = base ? base + 1 : fp;
        if (strcmp(base, e->valuestring))
            s = pt_error(PT_ERR_FORMAT, "%s: tensor '%s' is mapped to '%s' but found in '%s'", index_path,
                         e->string, e->valuestring, base);
    }
done:
    builder_free(&b);
    free(names);
    cJSON_Delete(root);
    if (s) {
        if (set_ok) pt_st_close(&set);
        return s;
    }
    *out = set;
    return PT_OK;
}

pt_status pt_st_open_dir(const char *dir, pt_tensor_set *out) {
    if (!pt_is_dir(dir)) return pt_error(PT_ERR_NOT_FOUND, "%s: not a directory", dir);
    char *index = pt_path_join(dir, "model.safetensors.index.json");
    if (!index) return pt_error(PT_ERR_NOMEM, "out of memory");
    if (pt_is_file(index)) {
        pt_status s = open_index(dir, index, out);
        free(index);
        return s;
    }
    free(index);
    char *single = pt_path_join(dir, "model.safetensors");
    if (!single) return pt_error(PT_ERR_NOMEM, "out of memory");
    if (pt_is_file(single)) {
        pt_status s = pt_st_open_file(single, out);
        free(single);
        return s;
    }
    free(single);
    /* any *.safetensors files */
    DIR *d = opendir(dir);
    if (!d) return pt_error(PT_ERR_IO, "%s: cannot list directory: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    pt_status s = PT_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l <= 12 || strcmp(de->d_name + l - 12, ".safetensors") || de->d_name[0] == '.') continue;
        if ((s = st_grow((void **)&names, &cap, n + 1, sizeof *names))) break;
        if (!(names[n++] = strdup(de->d_name))) {
            s = pt_error(PT_ERR_NOMEM, "out of memory");
            break;
        }
    }
    closedir(d);
    if (!s && n == 0)
        s = pt_error(PT_ERR_NOT_FOUND, "%s: no weights found (expected model.safetensors, "
                                       "model.safetensors.index.json or *.safetensors files)", dir);
    pt_tensor_set set;
    builder b = {0};
    int set_ok = 0;
    if (!s) {
        qsort(names, (size_t)n, sizeof *names, cmp_str);
        s = set_init(&set, n);
        set_ok = !s;
    }
    for (int i = 0; i < n && !s; i++) {
        char *p = pt_path_join(dir, names[i]);
        if (!p) s = pt_error(PT_ERR_NOMEM, "out of memory");
        else s = add_file(&set, p, &b);
        free(p);
    }
    if (!s) s = finish_set(&set, &b);
    builder_free(&b);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    if (s) {
        if (set_ok) pt_st_close(&set);
        return s;
    }
    *out = set;
    return PT_OK;
}

/* ------------------------------------------------------------------ */
/* Writer. */

typedef struct {
    char *name;
    pt_dtype dtype;
    int ndim;
    int64_t shape[PT_ST_MAX_DIMS];
    uint64_t nbytes;
} wentry;

struct pt_st_writer {
    wentry *v;
    int n, cap;
    char **mk, **mv;
    int n_meta, cap_meta, cap_meta2;
    FILE *f;
    char *path;
    uint64_t total, written;
};

pt_status pt_st_writer_create(pt_st_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? PT_OK : pt_error(PT_ERR_NOMEM, "out of memory");
}

pt_status pt_st_writer_add(pt_st_writer *w, const char *name, pt_dtype dtype, int ndim, const int64_t *shape) {
    if (w->f) return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: add after begin");
    if ((unsigned)dtype >= PT_DTYPE_COUNT || ndim < 0 || ndim > PT_ST_MAX_DIMS || !name || !*name ||
        !strcmp(name, "__metadata__"))
        return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: invalid tensor '%s'", name ? name : "(null)");
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->v[i].name, name))
            return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: duplicate tensor '%s'", name);
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] && n > UINT64_MAX / (uint64_t)shape[i] / 8))
            return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: tensor '%s' has an invalid shape", name);
        n *= (uint64_t)shape[i];
    }
    PT_TRY(st_grow((void **)&w->v, &w->cap, w->n + 1, sizeof *w->v));
    wentry *e = &w->v[w->n];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return pt_error(PT_ERR_NOMEM, "out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    memcpy(e->shape, shape, (size_t)ndim * sizeof *shape);
    e->nbytes = n * pt_dtype_size(dtype);
    w->total += e->nbytes;
    w->n++;
    return PT_OK;
}

pt_status pt_st_writer_set_meta(pt_st_writer *w, const char *key, const char *value) {
    if (w->f) return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: metadata after begin");
    PT_TRY(st_grow((void **)&w->mk, &w->cap_meta, w->n_meta + 1, sizeof *w->mk));
    PT_TRY(st_grow((void **)&w->mv, &w->cap_meta2, w->n_meta + 1, sizeof *w->mv));
    w->mk[w->n_meta] = strdup(key);
    w->mv[w->n_meta] = strdup(value);
    if (!w->mk[w->n_meta] || !w->mv[w->n_meta]) return pt_error(PT_ERR_NOMEM, "out of memory");
    w->n_meta++;
    return PT_OK;
}

uint64_t pt_st_writer_data_bytes(const pt_st_writer *w) { return w->total; }

/* Appends a JSON string literal (escaped) to a growing buffer. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 4096;
        while (nc < b->n + n + 1) nc *= 2;
        char *q = realloc(b->s, nc);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->s = q;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            sb_put(b, e, 6);
        } else {
            sb_put(b, s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

pt_status pt_st_writer_begin(pt_st_writer *w, const char *path) {
    if (w->f) return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: begin called twice");
    sbuf b = {0};
    char num[64];
    sb_str(&b, "{");
    int first = 1;
    if (w->n_meta) {
        sb_str(&b, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) sb_str(&b, ",");
            sb_json_str(&b, w->mk[i]);
            sb_str(&b, ":");
            sb_json_str(&b, w->mv[i]);
        }
        sb_str(&b, "}");
        first = 0;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const wentry *e = &w->v[i];
        if (!first) sb_str(&b, ",");
        first = 0;
        sb_json_str(&b, e->name);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, pt_dtype_name(e->dtype));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < e->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)e->shape[d]);
            sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + e->nbytes));
        sb_str(&b, num);
        off += e->nbytes;
    }
    sb_str(&b, "}");
    while (!b.oom && (8 + b.n) % 8) sb_str(&b, " "); /* data section 8-byte aligned */
    if (b.oom) {
        free(b.s);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    w->path = strdup(path);
    w->f = fopen(path, "wb");
    if (!w->f || !w->path) {
        free(b.s);
        return pt_error(PT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
    int ok = fwrite(len, 1, 8, w->f) == 8 && fwrite(b.s, 1, b.n, w->f) == b.n;
    free(b.s);
    if (!ok) return pt_error(PT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return PT_OK;
}

pt_status pt_st_writer_write(pt_st_writer *w, const void *data, size_t n) {
    if (!w->f) return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: write before begin");
    if (n > w->total - w->written)
        return pt_error(PT_ERR_INVALID_ARG, "%s: more tensor data written than declared (%llu bytes)", w->path,
                        (unsigned long long)w->total);
    if (n && fwrite(data, 1, n, w->f) != n)
        return pt_error(PT_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->written += n;
    return PT_OK;
}

pt_status pt_st_writer_finish(pt_st_writer *w) {
    if (!w->f) return pt_error(PT_ERR_INVALID_ARG, "safetensors writer: finish before begin");
    int bad = w->written != w->total;
    int cerr = fclose(w->f);
    w->f = NULL;
    if (bad)
        return pt_error(PT_ERR_INVALID_ARG, "%s: %llu bytes of tensor data written, %llu declared", w->path,
                        (unsigned long long)w->written, (unsigned long long)w->total);
    if (cerr) return pt_error(PT_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    return PT_OK;
}

void pt_st_writer_free(pt_st_writer **pw) {
    pt_st_writer *w = *pw;
    if (!w) return;
    if (w->f) fclose(w->f);
    for (int i = 0; i < w->n; i++) free(w->v[i].name);
    for (int i = 0; i < w->n_meta; i++) free(w->mk[i]), free(w->mv[i]);
    free(w->v);
    free(w->mk);
    free(w->mv);
    free(w->path);
    free(w);
    *pw = NULL;
}

pt_status pt_st_write_file(const char *path, const pt_st_entry *entries, int n, const pt_st_meta *meta,
                           int n_meta) {
    pt_st_writer *w;
    PT_TRY(pt_st_writer_create(&w));
    pt_status s = PT_OK;
    for (int i = 0; i < n && !s; i++)
        s = pt_st_writer_add(w, entries[i].name, entries[i].dtype, entries[i].ndim, entries[i].shape);
    for (int i = 0; i < n_meta && !s; i++) s = pt_st_writer_set_meta(w, meta[i].key, meta[i].value);
    if (!s) s = pt_st_writer_begin(w, path);
    for (int i = 0; i < n && !s; i++) s = pt_st_writer_write(w, entries[i].data, (size_t)w->v[i].nbytes);
    if (!s) s = pt_st_writer_finish(w);
    pt_st_writer_free(&w);
    return s;
}
