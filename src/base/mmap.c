/* File mapping and whole-file helpers (see mmap.h). */
#include "base/mmap.h"

#include "base/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

pt_status pt_mmap_open(pt_mmap *m, const char *path) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return pt_error(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return pt_error(PT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return pt_error(PT_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)st.st_size;
    if (m->size > 0) {
        void *p = mmap(NULL, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return pt_error(PT_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
        }
        m->data = p;
    }
    close(fd);
    m->path = strdup(path);
    if (!m->path) {
        pt_mmap_close(m);
        return pt_error(PT_ERR_NOMEM, "out of memory");
    }
    return PT_OK;
}

void pt_mmap_close(pt_mmap *m) {
    if (m->data && m->size) munmap((void *)m->data, m->size);
    free(m->path);
    memset(m, 0, sizeof *m);
}

pt_status pt_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return pt_error(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return pt_error(PT_ERR_NOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        if (cap - n < 4096) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return pt_error(PT_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return pt_error(PT_ERR_IO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return PT_OK;
}

pt_status pt_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) return pt_error(PT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (len && fwrite(data, 1, len, f) != len) {
        int e = errno;
        fclose(f);
        return pt_error(PT_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
    if (fclose(f) != 0) return pt_error(PT_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return PT_OK;
}

int pt_is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int pt_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

char *pt_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}
