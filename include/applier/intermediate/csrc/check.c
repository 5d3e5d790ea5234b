/*
 * A first pass over row images: is every image of a column surely right?
 *
 * The spec's check of an image (section 3) is made in Python with msgspec
 * (applier/intermediate/images.py): a strict decoder per table, then the
 * text-encoded values matched against their forms. This pass reads the same
 * images straight from an Arrow string column, without making a Python object,
 * and answers one question: the first row whose image it cannot vouch for.
 *
 * It is conservative. It accepts an image only if the Python check surely
 * accepts it; anything unusual (an escaped character in a date, a number too
 * long to judge cheaply, a duplicate column, an unknown one) is "not vouched
 * for", and the caller sends that row and the rest of the batch to the Python
 * check, which decides and words any refusal. So a doubt here costs time,
 * never a verdict.
 */

#include "images.h"

static int literal(cursor_t *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* One UTF-8 sequence of a non-ASCII character, strictly (no overlong form, no surrogate, at most U+10FFFF). */
static int utf8_sequence(cursor_t *c) {
    const uint8_t *p = c->p;
    size_t left = (size_t)(c->end - p);
    uint8_t b = p[0];
    if (b >= 0xC2 && b <= 0xDF) {
        if (left < 2 || (p[1] & 0xC0) != 0x80) return 0;
        c->p += 2;
        return 1;
    }
    if (b >= 0xE0 && b <= 0xEF) {
        if (left < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (b == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (b == 0xED && p[1] >= 0xA0) return 0; /* a surrogate */
        c->p += 3;
        return 1;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (left < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if (b == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (b == 0xF4 && p[1] >= 0x90) return 0; /* above U+10FFFF */
        c->p += 4;
        return 1;
    }
    return 0;
}


/* Any JSON string; a lone escaped surrogate is not vouched for (images.h). */
int any_string(cursor_t *c) {
    c->p++;
    while (c->p < c->end) {
        uint8_t b = *c->p;
        if (b == '"') {
            c->p++;
            return 1;
        }
        if (b < 0x20) return 0;
        if (b == '\\') {
            uint32_t code;
            if (!escape_at(&c->p, c->end, &code)) return 0;
        } else if (b < 0x80) {
            c->p++;
        } else if (!utf8_sequence(c)) {
            return 0;
        }
    }
    return 0;
}

/* The content of a JSON string without escapes (the cursor on its opening quote): [*start, *end). */
static int plain_string(cursor_t *c, const uint8_t **start, const uint8_t **end) {
    const uint8_t *q = c->p + 1;
    while (q < c->end && *q != '"') {
        if (*q == '\\' || *q < 0x20 || *q >= 0x80) return 0; /* the text forms are ASCII without escapes */
        q++;
    }
    if (q >= c->end) return 0;
    *start = c->p + 1;
    *end = q;
    c->p = q + 1;
    return 1;
}

static int digits_at(const uint8_t *p, int n) {
    for (int i = 0; i < n; i++)
        if (!is_digit(p[i])) return 0;
    return 1;
}

static int number_at(const uint8_t *p, int n) {
    int v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (p[i] - '0');
    return v;
}

/* YYYY-MM-DD, years 0001-9999, a day that exists in its month. Year 0000 is left to the Python check. */
static int date_form(const uint8_t *p, const uint8_t *end) {
    if (end - p != 10 || p[4] != '-' || p[7] != '-') return 0;
    if (!digits_at(p, 4) || !digits_at(p + 5, 2) || !digits_at(p + 8, 2)) return 0;
    int year = number_at(p, 4), month = number_at(p + 5, 2), day = number_at(p + 8, 2);
    if (year < 1 || month < 1 || month > 12 || day < 1) return 0;
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    int most = days[month - 1] + (month == 2 && leap);
    return day <= most;
}

/* A date, T, HH:MM:SS, an optional fraction of 1 to 6 digits, then Z. */
static int timestamp_form(const uint8_t *p, const uint8_t *end) {
    if (end - p < 20 || !date_form(p, p + 10) || p[10] != 'T' || p[13] != ':' || p[16] != ':') return 0;
    if (!digits_at(p + 11, 2) || !digits_at(p + 14, 2) || !digits_at(p + 17, 2)) return 0;
    if (number_at(p + 11, 2) > 23 || number_at(p + 14, 2) > 59 || number_at(p + 17, 2) > 59) return 0;
    const uint8_t *q = p + 19;
    if (*q == '.') {
        const uint8_t *f = ++q;
        while (q < end && is_digit(*q)) q++;
        if (q - f < 1 || q - f > 6) return 0;
    }
    return q + 1 == end && *q == 'Z';
}

static inline int base64_char(uint8_t b) {
    return (b >= 'A' && b <= 'Z') || (b >= 'a' && b <= 'z') || is_digit(b) || b == '+' || b == '/';
}

/* Standard base64: groups of four, the last one padded with = or ==. */
static int binary_form(const uint8_t *p, const uint8_t *end) {
    ptrdiff_t n = end - p;
    if (n % 4) return 0;
    for (ptrdiff_t i = 0; i < n; i++) {
        if (base64_char(p[i])) continue;
        if (p[i] != '=' || i < n - 2) return 0;
        if (i == n - 2 && p[n - 1] != '=') return 0;
    }
    return 1;
}

/* An exact decimal of at most precision - scale integer and scale fraction digits (leading and trailing zeros free). */
static int decimal_form(const uint8_t *p, const uint8_t *end, int precision, int scale) {
    if (p < end && *p == '-') p++;
    const uint8_t *q = p;
    while (q < end && is_digit(*q)) q++;
    if (q == p) return 0;
    const uint8_t *first = p;
    while (first < q - 1 && *first == '0') first++;
    if (precision > scale) {
        if (q - first > precision - scale) return 0;
    } else if (q - first != 1 || *first != '0') {
        return 0;
    }
    if (q == end) return 1;
    if (*q != '.') return 0;
    const uint8_t *f = ++q;
    while (q < end && is_digit(*q)) q++;
    if (q != end || q == f) return 0;
    const uint8_t *last = q;
    while (last > f + 1 && last[-1] == '0') last--;
    if (scale == 0) return last - f == 1 && *f == '0';
    return last - f <= scale;
}

/* A JSON integer of the given width: at most 18 digits pass at once, 19 are compared, more are not judged here. */
static int integer(cursor_t *c, int wide) {
    const uint8_t *p = c->p;
    int negative = p < c->end && *p == '-';
    if (negative) p++;
    const uint8_t *q = p;
    while (q < c->end && is_digit(*q)) q++;
    ptrdiff_t n = q - p;
    if (n == 0 || (n > 1 && *p == '0')) return 0;
    if (q < c->end && (*q == '.' || *q == 'e' || *q == 'E')) return 0;
    int room = wide ? 19 : 10;
    if (n > room) return 0;
    if (n == room) {
        uint64_t v = 0;
        for (const uint8_t *d = p; d < q; d++) v = v * 10 + (uint64_t)(*d - '0');
        uint64_t most = wide ? (negative ? 9223372036854775808ULL : 9223372036854775807ULL)
                             : (negative ? 2147483648ULL : 2147483647ULL);
        if (v > most) return 0;
    }
    c->p = q;
    return 1;
}

/* Whether a number with a 3-digit exponent, [p, end), is finite and below 1e308 as a double (strtod's reading). */
static int moderate(const uint8_t *p, const uint8_t *end) {
    char text[64];
    if (end - p >= (ptrdiff_t)sizeof text) return 0;
    memcpy(text, p, (size_t)(end - p));
    text[end - p] = 0;
    double v = strtod(text, NULL);
    return v > -1e308 && v < 1e308;
}

/* A JSON number that surely fits a double: at most 200 digits each side of the point, and an exponent of at most
 * 2 digits, or 3 when the value is under 1e308 (msgspec refuses a number beyond the largest double). */
static int number(cursor_t *c) {
    const uint8_t *p = c->p;
    if (p < c->end && *p == '-') p++;
    const uint8_t *q = p;
    while (q < c->end && is_digit(*q)) q++;
    if (q == p || (q - p > 1 && *p == '0') || q - p > 200) return 0;
    if (q < c->end && *q == '.') {
        const uint8_t *f = ++q;
        while (q < c->end && is_digit(*q)) q++;
        if (q == f || q - f > 200) return 0;
    }
    if (q < c->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < c->end && (*q == '+' || *q == '-')) q++;
        const uint8_t *e = q;
        while (q < c->end && is_digit(*q)) q++;
        if (q == e || q - e > 3 || (q - e == 3 && !moderate(c->p, q))) return 0;
    }
    c->p = q;
    return 1;
}

static int value(cursor_t *c, const column_t *col) {
    if (c->p >= c->end) return 0;
    if (*c->p == 'n') return col->nullable && literal(c, "null", 4);
    const uint8_t *start, *end;
    switch (col->type) {
        case T_BOOL:
            return literal(c, "true", 4) || literal(c, "false", 5);
        case T_INT:
            return integer(c, 0);
        case T_BIGINT:
            return integer(c, 1);
        case T_DOUBLE:
            if (*c->p != '"') return number(c);
            if (!plain_string(c, &start, &end)) return 0;
            return (end - start == 3 && memcmp(start, "NaN", 3) == 0) ||
                   (end - start == 8 && memcmp(start, "Infinity", 8) == 0) ||
                   (end - start == 9 && memcmp(start, "-Infinity", 9) == 0);
        case T_STRING:
            return *c->p == '"' && any_string(c);
        default:
            break;
    }
    if (*c->p != '"' || !plain_string(c, &start, &end)) return 0;
    switch (col->type) {
        case T_DATE:
            return date_form(start, end);
        case T_TIMESTAMP:
            return timestamp_form(start, end);
        case T_BINARY:
            return binary_form(start, end);
        case T_DECIMAL:
            return decimal_form(start, end, col->precision, col->scale);
        default:
            return 0;
    }
}

/* A key's escapes undone into `out` (UTF-8; a lone escaped surrogate is not judged here): its length, or -1. */
static int32_t unescaped(const uint8_t *p, const uint8_t *end, uint8_t *out, int32_t room) {
    int32_t n = 0;
    while (p < end) {
        if (*p != '\\') {
            if (n + 1 > room) return -1;
            out[n++] = *p++;
            continue;
        }
        uint32_t code;
        if (!escape_at(&p, end, &code) || n + 4 > room) return -1;
        n += put_utf8(out + n, code);
    }
    return n;
}

int32_t column_named(cursor_t *c, const rule_t *rule, int32_t expected) {
    if (c->p >= c->end || *c->p != '"') return -1;
    const uint8_t *start = c->p + 1, *q = start;
    int escaped = 0;
    while (q < c->end && *q != '"') {
        if (*q < 0x20) return -1;
        if (*q == '\\') {
            escaped = 1;
            q++;
        }
        q++;
    }
    if (q >= c->end) return -1;
    c->p = q + 1;
    uint8_t buffer[256];
    int32_t length = (int32_t)(q - start);
    if (escaped) {
        length = unescaped(start, q, buffer, (int32_t)sizeof buffer);
        if (length < 0) return -1;
        start = buffer;
    }
    for (int32_t k = 0; k < rule->count; k++) {
        int32_t i = (expected + k) % rule->count;
        const column_t *col = &rule->columns[i];
        if (col->length == length && memcmp(col->name, start, (size_t)length) == 0) return i;
    }
    return -1;
}

/* Whether the image [p, end) surely passes its table's check under `rule`. */
static int image_ok(const uint8_t *p, const uint8_t *end, const rule_t *rule) {
    uint8_t seen[MAX_COLUMNS];
    cursor_t c = {p, end};
    skip_ws(&c);
    if (c.p >= c.end || *c.p != '{') return 0;
    c.p++;
    skip_ws(&c);
    int32_t required = 0, next = 0;
    if (rule->count) memset(seen, 0, (size_t)rule->count);
    if (c.p < c.end && *c.p == '}') {
        c.p++;
    } else {
        for (;;) {
            int32_t i = rule->count ? column_named(&c, rule, next) : -1;
            if (i < 0 || seen[i]) return 0;
            seen[i] = 1;
            required += rule->columns[i].required;
            next = i + 1 == rule->count ? 0 : i + 1;
            skip_ws(&c);
            if (c.p >= c.end || *c.p != ':') return 0;
            c.p++;
            skip_ws(&c);
            if (!value(&c, &rule->columns[i])) return 0;
            skip_ws(&c);
            if (c.p >= c.end) return 0;
            if (*c.p == '}') {
                c.p++;
                break;
            }
            if (*c.p != ',') return 0;
            c.p++;
            skip_ws(&c);
        }
    }
    skip_ws(&c);
    return c.p == c.end && required == rule->required;
}

/*
 * The first of `count` rows whose image this pass cannot vouch for, or -1 when it vouches for every one.
 *
 * The images are an Arrow string column: `offsets` (32-bit, or 64-bit when `wide_offsets`), `data`, and
 * `validity` (NULL: no nulls), the column starting at row `first` of them. Row i is checked against
 * rules[rule_of[i]]; a row whose rule_of is negative, or whose image is null, is not checked here.
 */
int64_t ic_first_doubt(const uint8_t *data, const void *offsets, int32_t wide_offsets, const uint8_t *validity,
                       int64_t first, int64_t count, const int32_t *rule_of, void *const *rules) {
    for (int64_t i = 0; i < count; i++) {
        if (rule_of[i] < 0) continue;
        const uint8_t *start, *stop;
        if (!image_at(data, offsets, wide_offsets, validity, first + i, &start, &stop)) continue;
        const rule_t *rule = rules[rule_of[i]];
        if (rule == NULL || !image_ok(start, stop, rule)) return i;
    }
    return -1;
}
