/*
 * Identities written in C: the bytes applier/engine/identity.py gives an image whose key is plain.
 *
 * An identity is msgspec's JSON encoding of the list of the key columns' canonical values, in key order. For
 * an integer, a boolean, a string or null that is the value's own JSON text, with two exceptions handled here
 * or left to Python: -0 is written 0, and a string holding an escape (msgspec writes its own escapes) is left
 * to Python. msgspec escapes nothing else of a string (only the quote and the backslash, which cannot appear
 * unescaped, and control characters, which cannot appear raw in JSON). Images reach this pass checked, by
 * check.c or by the Python check; an image read here in any way it does not expect is left to Python too.
 */

#include "images.h"

/* Skip the value at the cursor: its token is [*start, c->p); 0 for what is not a scalar. */
static int skip_value(cursor_t *c, const uint8_t **start, int *escaped) {
    *start = c->p;
    *escaped = 0;
    if (c->p >= c->end) return 0;
    if (*c->p == '"') {
        const uint8_t *p = c->p + 1;
        for (;;) {
            const uint8_t *quote = memchr(p, '"', (size_t)(c->end - p));
            if (quote == NULL) return 0;
            if (memchr(p, '\\', (size_t)(quote - p)) == NULL) {
                c->p = quote + 1;
                return 1;
            }
            *escaped = 1;
            cursor_t s = {c->p, c->end};
            if (!any_string(&s)) return 0;
            c->p = s.p;
            return 1;
        }
    }
    if (*c->p == '{' || *c->p == '[') return 0;
    while (c->p < c->end && *c->p != ',' && *c->p != '}' && *c->p != ' ' && *c->p != '\t' && *c->p != '\n' &&
           *c->p != '\r')
        c->p++;
    return c->p > *start;
}

/* The identity of one image into out (room for the image's length + 2 bytes): its length, or -1 (left to Python). */
static int64_t identity(const uint8_t *p, const uint8_t *end, const rule_t *rule, uint8_t *out) {
    const uint8_t *token[MAX_KEYS], *token_end[MAX_KEYS];
    int32_t found = 0;
    cursor_t c = {p, end};
    for (int32_t k = 0; k < rule->key_count; k++) token[k] = NULL;
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') return -1;
    c.p++;
    skip_ws(&c);
    int32_t next = 0;
    if (c.p < c.end && *c.p == '}') return -1; /* no key column */
    for (;;) { /* every column: a key column named twice leaves the image to Python (msgspec keeps the last) */
        int32_t i = column_named(&c, rule, next);
        if (i < 0) return -1;
        next = i + 1 == rule->count ? 0 : i + 1;
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':') return -1;
        c.p++;
        skip_ws(&c);
        const uint8_t *start;
        int escaped;
        if (!skip_value(&c, &start, &escaped)) return -1;
        for (int32_t k = 0; k < rule->key_count; k++) {
            if (rule->keys[k] != i) continue;
            if (escaped || token[k] != NULL) return -1;
            token[k] = start;
            token_end[k] = c.p;
            found++;
        }
        skip_ws(&c);
        if (c.p >= c.end) return -1;
        if (*c.p == '}') break;
        if (*c.p != ',') return -1;
        c.p++;
        skip_ws(&c);
    }
    if (found < rule->key_count) return -1;
    uint8_t *o = out;
    *o++ = '[';
    for (int32_t k = 0; k < rule->key_count; k++) {
        if (k) *o++ = ',';
        size_t n = (size_t)(token_end[k] - token[k]);
        if (n == 2 && token[k][0] == '-' && token[k][1] == '0') {
            *o++ = '0';
            continue;
        }
        memcpy(o, token[k], n);
        o += n;
    }
    *o++ = ']';
    return o - out;
}

/*
 * The identities of `count` images (an Arrow string column, as ic_first_doubt reads it) into a binary column:
 * `out_offsets` (count + 1 of them) and `out_data`, whose room must be the images' bytes plus 2 a row. Row i
 * follows rules[rule_of[i]]; `done[i]` says whether it was written here (0: a null image, a negative rule_of, a
 * rule without plain keys, or an image left to Python, each written as no bytes). Returns the bytes written.
 */
int64_t ic_identities(const uint8_t *data, const void *offsets, int32_t wide_offsets, const uint8_t *validity,
                      int64_t first, int64_t count, const int32_t *rule_of, void *const *rules, int32_t *out_offsets,
                      uint8_t *out_data, uint8_t *done) {
    int64_t written = 0;
    out_offsets[0] = 0;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *start, *stop;
        done[i] = 0;
        const rule_t *rule = rule_of[i] < 0 ? NULL : rules[rule_of[i]];
        if (rule != NULL && rule->key_count > 0 &&
            image_at(data, offsets, wide_offsets, validity, first + i, &start, &stop)) {
            int64_t n = identity(start, stop, rule, out_data + written);
            if (n >= 0) {
                written += n;
                done[i] = 1;
            }
        }
        out_offsets[i + 1] = (int32_t)written;
    }
    return written;
}
