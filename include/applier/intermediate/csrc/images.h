/*
 * The C passes over row images (applier/intermediate/native.py loads them with ctypes; no Python API).
 *
 * check.c vouches for images that surely pass the spec's check of their table, leaving any doubt to the exact
 * check in Python (applier/intermediate/images.py); keys.c writes the identity of an image whose key columns are
 * plain integers, booleans or strings, byte for byte as the Python identity (applier/engine/identity.py) does,
 * and leaves every other image to it. Both read an Arrow string column's buffers as they are.
 */
#ifndef APPLIER_IMAGES_H
#define APPLIER_IMAGES_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { T_BOOL, T_INT, T_BIGINT, T_DOUBLE, T_STRING, T_DATE, T_TIMESTAMP, T_BINARY, T_DECIMAL };

#define MAX_COLUMNS 4096
#define MAX_KEYS 32

typedef struct {
    const char *name;
    int32_t length;
    uint8_t type, nullable, required, precision, scale;
} column_t;

typedef struct {
    int32_t count, required;
    int32_t key_count; /* the identity's columns, in key order (0: keys.c writes no identity) */
    int32_t keys[MAX_KEYS];
    char *names;
    column_t columns[];
} rule_t;

typedef struct {
    const uint8_t *p, *end;
} cursor_t;

static inline void skip_ws(cursor_t *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static inline int is_digit(uint8_t b) { return b >= '0' && b <= '9'; }

static inline int hex_digit(uint8_t b) {
    if (b >= '0' && b <= '9') return b - '0';
    if (b >= 'a' && b <= 'f') return b - 'a' + 10;
    if (b >= 'A' && b <= 'F') return b - 'A' + 10;
    return -1;
}

/* A JSON string at the cursor (on its opening quote), any content; 0 for one not vouched for. */
int any_string(cursor_t *c);

/* The column named by the key at the cursor: its index, or -1 (no such column, or a key not judged here). */
int32_t column_named(cursor_t *c, const rule_t *rule, int32_t expected);

/* Image i's bytes in an Arrow string column: 0 when it is null. */
static inline int image_at(const uint8_t *data, const void *offsets, int32_t wide_offsets, const uint8_t *validity,
                           int64_t at, const uint8_t **start, const uint8_t **stop) {
    if (validity != NULL && !((validity[at >> 3] >> (at & 7)) & 1)) return 0;
    int64_t from, to;
    if (wide_offsets) {
        from = ((const int64_t *)offsets)[at];
        to = ((const int64_t *)offsets)[at + 1];
    } else {
        from = ((const int32_t *)offsets)[at];
        to = ((const int32_t *)offsets)[at + 1];
    }
    *start = data + from;
    *stop = data + to;
    return 1;
}

#endif
