/*
 * model_safetensors.c: one safetensors shard over a memory map. Layout: u64 header length N,
 * N bytes of JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"},
 * then the data; offsets are relative to the end of the header and are checked against both
 * the shape and the file size.
 */
#define _POSIX_C_SOURCE 200809L
#include "model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static mi_status parse_header(mim_st_file *f, char *err, size_t cap) {
    if (f->size < 8)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "safetensors truncated: %zu bytes",
                        f->size);
    uint64_t n;
    memcpy(&n, f->base, 8);
    if (n > f->size - 8)
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "safetensors truncated: header of %llu bytes, file has %zu",
                        (unsigned long long)n, f->size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)f->base + 8, (size_t)n, 0, &jerr);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                        "safetensors header is not a JSON "
                        "object: %s",
                        jerr.text);
    }
    const unsigned char *data = f->base + 8 + n;
    uint64_t data_size = f->size - 8 - n;
    size_t count = json_object_size(root);
    f->tensors = calloc(count ? count : 1, sizeof(*f->tensors));
    if (!f->tensors) {
        json_decref(root);
        return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
    }
    mi_status st = MI_STATUS_SUCCESS;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        json_t *dt = json_object_get(val, "dtype");
        json_t *shape = json_object_get(val, "shape");
        json_t *offs = json_object_get(val, "data_offsets");
        if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
            json_array_size(offs) != 2 || json_array_size(shape) > 4) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "safetensors: bad entry for tensor '%s'",
                          key);
            break;
        }
        mim_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(key);
        if (!t->name) {
            st = mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
            break;
        }
        f->n_tensors++;
        snprintf(t->dtype_name, sizeof(t->dtype_name), "%s", json_string_value(dt));
        uint64_t esize = 0;
        if (strcmp(t->dtype_name, "F32") == 0) {
            t->type = MIM_TYPE_F32;
            esize = 4;
        } else if (strcmp(t->dtype_name, "F16") == 0) {
            t->type = MIM_TYPE_F16;
            esize = 2;
        } else if (strcmp(t->dtype_name, "BF16") == 0) {
            t->type = MIM_TYPE_BF16;
            esize = 2;
        } else {
            t->type = UINT32_MAX;
        }
        t->n_dims = (int)json_array_size(shape);
        uint64_t elems = 1;
        for (int d = 0; d < t->n_dims; d++) {
            json_t *v = json_array_get(shape, (size_t)d);
            if (!json_is_integer(v) || json_integer_value(v) < 0) {
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "safetensors: bad shape for tensor '%s'", key);
                break;
            }
            t->shape[d] = json_integer_value(v);
            if (t->shape[d] && elems > UINT64_MAX / 8 / (uint64_t)t->shape[d]) {
                st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                              "safetensors: shape of '%s' overflows", key);
                break;
            }
            elems *= (uint64_t)t->shape[d];
        }
        if (st != MI_STATUS_SUCCESS) break;
        json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
        if (!json_is_integer(b) || !json_is_integer(e) || json_integer_value(b) < 0 ||
            json_integer_value(e) < json_integer_value(b) ||
            (uint64_t)json_integer_value(e) > data_size) {
            st =
                mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                         "safetensors truncated or corrupt: data of '%s' is outside the file", key);
            break;
        }
        t->nbytes = (uint64_t)(json_integer_value(e) - json_integer_value(b));
        if (esize && t->nbytes != elems * esize) {
            st = mim_fail(err, cap, MI_STATUS_PARSE_ERROR,
                          "safetensors corrupt: '%s' has %llu bytes for %llu %s elements", key,
                          (unsigned long long)t->nbytes, (unsigned long long)elems, t->dtype_name);
            break;
        }
        t->data = data + json_integer_value(b);
    }
    json_decref(root);
    if (st == MI_STATUS_SUCCESS && f->n_tensors > 1) {
        mim_region *r = malloc((size_t)f->n_tensors * sizeof *r);
        if (!r) return mim_fail(err, cap, MI_STATUS_OUT_OF_MEMORY, "out of memory");
        for (size_t i = 0; i < (size_t)f->n_tensors; i++)
            r[i] = (mim_region){f->tensors[i].data, f->tensors[i].nbytes, f->tensors[i].name,
                                (int)strlen(f->tensors[i].name)};
        st = mim_check_regions(r, (size_t)f->n_tensors, "safetensors", err, cap);
        free(r);
    }
    return st;
}

mi_status mim_st_open_memory(const void *data, size_t size, mim_st_file *out, char *err,
                             size_t cap) {
    if (!out || (!data && size))
        return mim_fail(err, cap, MI_STATUS_INVALID_ARGUMENT, "NULL argument");
    memset(out, 0, sizeof(*out));
    out->base = data;
    out->size = size;
    mi_status st = parse_header(out, err, cap);
    if (st != MI_STATUS_SUCCESS) mim_st_close(out, false);
    return st;
}

mi_status mim_st_open(const char *path, mim_st_file *out, char *err, size_t cap) {
    if (!path || !out) return mim_fail(err, cap, MI_STATUS_INVALID_ARGUMENT, "NULL argument");
    memset(out, 0, sizeof(*out));
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size < 8) {
        close(fd);
        return mim_fail(err, cap, MI_STATUS_PARSE_ERROR, "%s: too small for safetensors", path);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return mim_fail(err, cap, MI_STATUS_IO_ERROR, "cannot map %s: %s", path, strerror(errno));
    mi_status st = mim_st_open_memory(map, (size_t)sb.st_size, out, err, cap);
    if (st != MI_STATUS_SUCCESS) munmap(map, (size_t)sb.st_size);
    return st;
}

void mim_st_close(mim_st_file *f, bool unmap) {
    if (!f) return;
    for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (unmap && f->base) munmap((void *)f->base, f->size);
    memset(f, 0, sizeof(*f));
}
