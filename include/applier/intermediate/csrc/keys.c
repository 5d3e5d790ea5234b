/*
 * Identities written in C: the bytes applier/engine/identity.py gives an image.
 *
 * An identity is msgspec's JSON encoding of the list of the identity columns' canonical values (the key's, in
 * key order; every column of a table without a key). For an integer, a boolean, a string or null that is the
 * value's own JSON text, with two exceptions handled here or left to Python: -0 is written 0, and a string
 * holding an escape (msgspec writes its own escapes) is left to Python. msgspec escapes nothing else of a
 * string (only the quote and the backslash, which cannot appear unescaped, and control characters, which
 * cannot appear raw in JSON). The other types' canonical values are plain to write: a date's days and a
 * timestamp's microseconds since 1970 and a decimal's integer at its scale, as integers; a double's IEEE bits
 * (0.0 for -0.0, one NaN) and a binary's bytes, as strings of hex digits. Images reach this pass checked, by
 * check.c or by the Python check; an image read here in any way it does not expect is left to Python too.
 */

#include "values.h"

static const char HEX[] = "0123456789abcdef";

/* A signed 128-bit integer's decimal digits at o; where they end. */
static uint8_t *put_int128(uint8_t *o, __int128 v) {
    char digits[48];
    int n = 0;
    unsigned __int128 u = v < 0 ? (unsigned __int128)0 - (unsigned __int128)v : (unsigned __int128)v;
    do digits[n++] = (char)('0' + (int)(u % 10)), u /= 10;
    while (u);
    if (v < 0) *o++ = '-';
    while (n) *o++ = (uint8_t)digits[--n];
    return o;
}

/* A double's canonical identity text at o ("..." of its 16 hex digits, big-endian bits); where it ends. */
static uint8_t *put_double(uint8_t *o, double v) {
    uint64_t bits;
    if (isnan(v)) bits = 0x7ff8000000000000ULL;
    else {
        if (v == 0) v = 0.0;
        memcpy(&bits, &v, 8);
    }
    *o++ = '"';
    for (int shift = 60; shift >= 0; shift -= 4) *o++ = (uint8_t)HEX[(bits >> shift) & 15];
    *o++ = '"';
    return o;
}

/* A base64 text's bytes as hex digits at o (room: 3/2 of the text); where they end, or NULL. */
static uint8_t *put_base64_hex(uint8_t *o, const uint8_t *p, const uint8_t *end) {
    if ((end - p) % 4) return NULL;
    *o++ = '"';
    for (; p < end; p += 4) {
        uint8_t byte[3];
        int n = base64_group(p, p + 4 == end, byte);
        if (n < 0) return NULL;
        for (int k = 0; k < n; k++) *o++ = (uint8_t)HEX[byte[k] >> 4], *o++ = (uint8_t)HEX[byte[k] & 15];
    }
    *o++ = '"';
    return o;
}

/* A typed (non-plain) column's canonical value from its token [p, end), at o; where it ends, or NULL. */
static uint8_t *put_typed(uint8_t *o, const column_t *col, const uint8_t *p, const uint8_t *end) {
    if (col->type == T_DOUBLE) {
        double v;
        if (*p != '"') {
            cursor_t c = {p, end};
            if (!double_value(&c, &v) || c.p != end) return NULL;
            return put_double(o, v);
        }
        size_t n = (size_t)(end - p);
        if (n == 5 && memcmp(p, "\"NaN\"", 5) == 0) return put_double(o, NAN);
        if (n == 10 && memcmp(p, "\"Infinity\"", 10) == 0) return put_double(o, INFINITY);
        if (n == 11 && memcmp(p, "\"-Infinity\"", 11) == 0) return put_double(o, -INFINITY);
        return NULL;
    }
    if (end - p < 2 || *p != '"' || end[-1] != '"') return NULL;
    p++, end--; /* the string's content (no escapes: skip_value said so) */
    switch (col->type) {
        case T_DATE: {
            int64_t days;
            if (end - p != 10 || !date_days(p, end, &days)) return NULL;
            return put_int128(o, days);
        }
        case T_TIMESTAMP: {
            int64_t micros;
            if (end - p < 20 || end - p > 27 || end[-1] != 'Z' || (end - p > 20 && p[19] != '.')) return NULL;
            if (!timestamp_micros(p, end, &micros)) return NULL;
            return put_int128(o, micros);
        }
        case T_DECIMAL: {
            __int128 v;
            if (!decimal_value(p, end, col->scale, &v)) return NULL;
            return put_int128(o, v);
        }
        case T_BINARY:
            return put_base64_hex(o, p, end);
        default:
            return NULL;
    }
}

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

/* The identity of one image into out, up to limit: its length, or -1 (left to Python, or no room). */
static int64_t identity(const uint8_t *p, const uint8_t *end, const rule_t *rule, uint8_t *out, const uint8_t *limit) {
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
        size_t n = (size_t)(token_end[k] - token[k]);
        if (limit - o < (ptrdiff_t)(2 * n + 48)) return -1; /* the longest a value's canonical text can be */
        if (k) *o++ = ',';
        const column_t *col = &rule->columns[rule->keys[k]];
        int plain = col->type == T_BOOL || col->type == T_INT || col->type == T_BIGINT || col->type == T_STRING;
        if (n == 4 && memcmp(token[k], "null", 4) == 0) plain = 1;
        if (!plain) {
            o = put_typed(o, col, token[k], token_end[k]);
            if (o == NULL) return -1;
            continue;
        }
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
 * `out_offsets` (count + 1 of them) and `out_data`, of `room` bytes (a row that does not fit is left). Row i
 * follows rules[rule_of[i]]; `done[i]` says whether it was written here (0: a null image, a negative rule_of, a
 * rule without plain keys, or an image left to Python, each written as no bytes). Returns the bytes written.
 */
int64_t ic_typed_identities(const uint8_t *data, const void *offsets, int32_t wide_offsets, const uint8_t *validity,
                      int64_t first, int64_t count, const int32_t *rule_of, void *const *rules, int32_t *out_offsets,
                      uint8_t *out_data, int64_t room, uint8_t *done) {
    int64_t written = 0;
    out_offsets[0] = 0;
    for (int64_t i = 0; i < count; i++) {
        const uint8_t *start, *stop;
        done[i] = 0;
        const rule_t *rule = rule_of[i] < 0 ? NULL : rules[rule_of[i]];
        if (rule != NULL && rule->key_count > 0 &&
            image_at(data, offsets, wide_offsets, validity, first + i, &start, &stop)) {
            int64_t n = identity(start, stop, rule, out_data + written, out_data + room);
            if (n >= 0) {
                written += n;
                done[i] = 1;
            }
        }
        out_offsets[i + 1] = (int32_t)written;
    }
    return written;
}
