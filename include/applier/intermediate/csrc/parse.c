/*
 * Final images parsed in C into a table's typed Arrow columns (applier/engine/identity.py, TableRules.parse).
 *
 * The compile parses only the images that survive netting, one table at a time; doing it in Python made a
 * Python object of every value (a datetime, a Decimal) on the way to Arrow. Here each value goes straight into
 * its column's buffer: integers, doubles (strtod, correctly rounded as msgspec's parser is), booleans, strings
 * (escapes undone), dates as days and timestamps as microseconds since 1970, decimals as 128-bit integers at
 * the column's scale, binaries decoded from base64. A column missing from an image is null, as in Python.
 *
 * Images reach this pass checked. Anything it does not expect (an unknown or repeated column, an escaped
 * surrogate, an escape inside a date) makes it give up on the whole call, and Python parses the images
 * instead: the same values, only slower.
 */

#include "values.h"

typedef struct {
    uint8_t *bytes;
    int64_t size, room;
} grow_t;

static int reserve(grow_t *g, int64_t more) {
    if (g->size + more <= g->room) return 1;
    int64_t room = g->room ? g->room : 4096;
    while (room < g->size + more) room *= 2;
    uint8_t *bytes = realloc(g->bytes, (size_t)room);
    if (bytes == NULL) return 0;
    g->bytes = bytes;
    g->room = room;
    return 1;
}

static int base64_decode(const uint8_t *p, const uint8_t *end, grow_t *out) {
    if ((end - p) % 4 || !reserve(out, (end - p) / 4 * 3)) return 0;
    for (; p < end; p += 4) {
        int n = base64_group(p, p + 4 == end, out->bytes + out->size);
        if (n < 0) return 0;
        out->size += n;
    }
    return 1;
}

/* A JSON string's content [p, end) with its escapes undone, appended to out. */
static int unescape(const uint8_t *p, const uint8_t *end, grow_t *out) {
    if (!reserve(out, end - p)) return 0;
    while (p < end) {
        const uint8_t *slash = memchr(p, '\\', (size_t)(end - p));
        const uint8_t *stop = slash ? slash : end;
        memcpy(out->bytes + out->size, p, (size_t)(stop - p));
        out->size += stop - p;
        p = stop;
        if (p == end) break;
        uint32_t code;
        if (!escape_at(&p, end, &code)) return 0;
        out->size += put_utf8(out->bytes + out->size, code); /* at most 4 bytes for the 6 or 12 of the escape */
    }
    return 1;
}

/* The string at the cursor: [*start, *end) is its content (escapes kept); *escaped if it has any. */
static int string_token(cursor_t *c, const uint8_t **start, const uint8_t **end, int *escaped) {
    if (c->p >= c->end || *c->p != '"') return 0;
    const uint8_t *p = c->p + 1;
    *start = p;
    *escaped = 0;
    for (;;) {
        const uint8_t *quote = memchr(p, '"', (size_t)(c->end - p));
        if (quote == NULL) return 0;
        const uint8_t *s = quote;
        int slashes = 0;
        while (s > *start && s[-1] == '\\') s--, slashes++;
        if (slashes) *escaped = 1;
        if (slashes % 2 == 0) {
            if (!*escaped && memchr(*start, '\\', (size_t)(quote - *start)) != NULL) *escaped = 1;
            *end = quote;
            c->p = quote + 1;
            return 1;
        }
        p = quote + 1;
    }
}

typedef struct {
    uint8_t *values; /* count * width bytes (none for strings and binaries) */
    int32_t *offsets; /* count + 1, strings and binaries */
    uint8_t *valid;   /* count */
    grow_t bytes;     /* strings' and binaries' bytes */
} out_t;

static int parse_value(cursor_t *c, const column_t *col, out_t *o, int64_t i) {
    const uint8_t *start, *end;
    int escaped;
    if (c->p >= c->end) return 0;
    if (*c->p == 'n') {
        if (c->end - c->p < 4 || memcmp(c->p, "null", 4) != 0) return 0;
        c->p += 4;
        return 1; /* valid stays 0 */
    }
    o->valid[i] = 1;
    switch (col->type) {
        case T_BOOL:
            if (c->end - c->p >= 4 && memcmp(c->p, "true", 4) == 0) return o->values[i] = 1, c->p += 4, 1;
            if (c->end - c->p >= 5 && memcmp(c->p, "false", 5) == 0) return o->values[i] = 0, c->p += 5, 1;
            return 0;
        case T_INT:
        case T_BIGINT: {
            int negative = c->p < c->end && *c->p == '-';
            const uint8_t *p = c->p + negative, *q = p;
            uint64_t v = 0;
            while (q < c->end && is_digit(*q)) v = v * 10 + (uint64_t)(*q++ - '0');
            if (q == p || q - p > 19) return 0;
            int64_t signed_value = negative ? (int64_t)(0 - v) : (int64_t)v;
            if (col->type == T_INT) ((int32_t *)o->values)[i] = (int32_t)signed_value;
            else ((int64_t *)o->values)[i] = signed_value;
            c->p = q;
            return 1;
        }
        case T_DOUBLE: {
            double v;
            if (*c->p != '"') {
                if (!double_value(c, &v)) return 0;
            } else {
                if (!string_token(c, &start, &end, &escaped) || escaped) return 0;
                size_t n = (size_t)(end - start);
                if (n == 3 && memcmp(start, "NaN", 3) == 0) v = NAN;
                else if (n == 8 && memcmp(start, "Infinity", 8) == 0) v = INFINITY;
                else if (n == 9 && memcmp(start, "-Infinity", 9) == 0) v = -INFINITY;
                else return 0;
            }
            ((double *)o->values)[i] = v;
            return 1;
        }
        default:
            break;
    }
    if (!string_token(c, &start, &end, &escaped)) return 0;
    if (col->type == T_STRING) return unescape(start, end, &o->bytes);
    if (escaped) return 0;
    switch (col->type) {
        case T_DATE: {
            int64_t days;
            if (!date_days(start, end, &days)) return 0;
            ((int32_t *)o->values)[i] = (int32_t)days;
            return 1;
        }
        case T_TIMESTAMP:
            return timestamp_micros(start, end, &((int64_t *)o->values)[i]);
        case T_DECIMAL: {
            __int128 v;
            if (!decimal_value(start, end, col->scale, &v)) return 0;
            memcpy(o->values + i * 16, &v, 16);
            return 1;
        }
        case T_BINARY:
            return base64_decode(start, end, &o->bytes);
        default:
            return 0;
    }
}

static int parse_image(const uint8_t *p, const uint8_t *end, const rule_t *rule, out_t *out, int64_t i) {
    uint8_t seen[MAX_COLUMNS];
    cursor_t c = {p, end};
    memset(seen, 0, (size_t)rule->count);
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') return 0;
    c.p++;
    skip_ws(&c);
    int32_t next = 0;
    if (c.p < c.end && *c.p == '}') return 1;
    for (;;) {
        int32_t k = column_named(&c, rule, next);
        if (k < 0 || seen[k]) return 0; /* an unknown column, or one named twice (msgspec keeps the last) */
        seen[k] = 1;
        next = k + 1 == rule->count ? 0 : k + 1;
        skip_ws(&c);
        if (c.p >= c.end || *c.p != ':') return 0;
        c.p++;
        skip_ws(&c);
        if (!parse_value(&c, &rule->columns[k], &out[k], i)) return 0;
        skip_ws(&c);
        if (c.p >= c.end) return 0;
        if (*c.p == '}') return 1;
        if (*c.p != ',') return 0;
        c.p++;
        skip_ws(&c);
    }
}

/*
 * Parse `count` images (an Arrow string column, as ic_first_doubt reads it; none null) into the rule's columns.
 *
 * For column k: `values[k]` (count times its width: 1 boolean, 4 int and date, 8 bigint, double and timestamp,
 * 16 decimal; unused for strings and binaries), `offsets[k]` (count + 1, strings and binaries) and `valid[k]`
 * (count, zeroed by the caller). The strings' and binaries' bytes go to `bytes` one column after another (its
 * room: the images' bytes), column k's from `starts[k]`. Returns 0, or -1 when Python must parse them instead.
 */
int32_t ic_parse(const uint8_t *data, const void *offsets, int32_t wide_offsets, int64_t first, int64_t count,
                 const void *rule_pointer, uint8_t **values, int32_t **out_offsets, uint8_t **valid, uint8_t *bytes,
                 int64_t room, int64_t *starts) {
    const rule_t *rule = rule_pointer;
    if (rule == NULL) return -1;
    out_t *out = calloc((size_t)(rule->count ? rule->count : 1), sizeof(out_t));
    if (out == NULL) return -1;
    for (int32_t k = 0; k < rule->count; k++) {
        out[k].values = values[k];
        out[k].offsets = out_offsets[k];
        out[k].valid = valid[k];
        if (out[k].offsets != NULL) out[k].offsets[0] = 0;
    }
    int32_t failed = 0;
    for (int64_t i = 0; i < count && !failed; i++) {
        const uint8_t *start, *stop;
        image_at(data, offsets, wide_offsets, NULL, first + i, &start, &stop);
        if (!parse_image(start, stop, rule, out, i)) failed = -1;
        for (int32_t k = 0; k < rule->count && !failed; k++) {
            if (out[k].offsets == NULL) continue;
            if (out[k].bytes.size > INT32_MAX) failed = -1;
            out[k].offsets[i + 1] = (int32_t)out[k].bytes.size;
        }
    }
    int64_t at = 0;
    for (int32_t k = 0; k < rule->count; k++) {
        starts[k] = at;
        if (!failed && out[k].bytes.size) {
            if (at + out[k].bytes.size > room) failed = -1;
            else memcpy(bytes + at, out[k].bytes.bytes, (size_t)out[k].bytes.size);
            at += out[k].bytes.size;
        }
        free(out[k].bytes.bytes);
    }
    free(out);
    return failed;
}
