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
#define MAX_KEYS 256

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

/* Four hex digits at p as a number; 0 for anything else. */
static inline int hex4(const uint8_t *p, uint32_t *value) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_digit(p[i]);
        if (h < 0) return 0;
        v = v * 16 + (uint32_t)h;
    }
    *value = v;
    return 1;
}

/* The escape at *p (on its backslash) of a JSON string ending before end: its character, *p moved past it.
 * A surrogate pair is one character; 0 for what is not judged here (an unknown escape, a lone surrogate). */
static inline int escape_at(const uint8_t **p, const uint8_t *end, uint32_t *code) {
    const uint8_t *q = *p;
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    if (end - q < 2) return 0;
    const char *at = q[1] ? strchr(from, q[1]) : NULL;
    if (at != NULL) {
        *code = (uint8_t)to[at - from];
        *p = q + 2;
        return 1;
    }
    if (q[1] != 'u' || end - q < 6 || !hex4(q + 2, code)) return 0;
    q += 6;
    if (*code >= 0xD800 && *code <= 0xDFFF) { /* a high surrogate, then a low one */
        uint32_t low;
        if (*code > 0xDBFF || end - q < 6 || q[0] != '\\' || q[1] != 'u' || !hex4(q + 2, &low)) return 0;
        if (low < 0xDC00 || low > 0xDFFF) return 0;
        *code = 0x10000 + ((*code - 0xD800) << 10) + (low - 0xDC00);
        q += 6;
    }
    *p = q;
    return 1;
}

/* A character as UTF-8 at out: the bytes written, 1 to 4. */
static inline int put_utf8(uint8_t *out, uint32_t code) {
    if (code < 0x80) {
        out[0] = (uint8_t)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (uint8_t)(0xC0 | code >> 6);
        out[1] = (uint8_t)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (uint8_t)(0xE0 | code >> 12);
        out[1] = (uint8_t)(0x80 | (code >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | code >> 18);
    out[1] = (uint8_t)(0x80 | (code >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (code >> 6 & 0x3F));
    out[3] = (uint8_t)(0x80 | (code & 0x3F));
    return 4;
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
