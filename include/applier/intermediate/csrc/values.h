/*
 * Typed values of an image's tokens, shared by parse.c (the final parse) and keys.c (identities): dates as days
 * and timestamps as microseconds since 1970, decimals as 128-bit integers at their column's scale, doubles read
 * by strtod (correctly rounded, as msgspec's parser is), base64 digits. Each reads a checked token and fails on
 * anything it does not expect, which the caller leaves to Python.
 */
#ifndef APPLIER_VALUES_H
#define APPLIER_VALUES_H

#include <math.h>

#include "images.h"

static inline int64_t digits_value(const uint8_t *p, int n) {
    int64_t v = 0;
    for (int i = 0; i < n; i++) v = v * 10 + (p[i] - '0');
    return v;
}

/* Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static inline int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static inline int date_days(const uint8_t *p, const uint8_t *end, int64_t *days) {
    if (end - p < 10 || p[4] != '-' || p[7] != '-') return 0;
    *days = days_from_civil(digits_value(p, 4), digits_value(p + 5, 2), digits_value(p + 8, 2));
    return 1;
}

static inline int timestamp_micros(const uint8_t *p, const uint8_t *end, int64_t *micros) {
    int64_t days;
    if (end - p < 20 || !date_days(p, p + 10, &days)) return 0;
    int64_t seconds = digits_value(p + 11, 2) * 3600 + digits_value(p + 14, 2) * 60 + digits_value(p + 17, 2);
    int64_t fraction = 0;
    const uint8_t *q = p + 19;
    if (*q == '.') {
        int n = 0;
        for (q++; q < end && is_digit(*q); q++, n++) fraction = fraction * 10 + (*q - '0');
        for (; n < 6; n++) fraction *= 10;
    }
    *micros = (days * 86400 + seconds) * 1000000 + fraction;
    return 1;
}

/* A checked decimal text at `scale`, as a 128-bit integer (the text's fraction beyond the scale is zeros). */
static inline int decimal_value(const uint8_t *p, const uint8_t *end, int scale, __int128 *value) {
    int negative = p < end && *p == '-';
    if (negative) p++;
    __int128 v = 0;
    int digits = 0; /* at most 38 in all: a checked text fits; any other is left to Python */
    for (; p < end && is_digit(*p); p++) {
        if (v == 0 && *p == '0') continue;
        if (++digits > 38 - scale) return 0;
        v = v * 10 + (*p - '0');
    }
    int taken = 0;
    if (p < end && *p == '.')
        for (p++; p < end && is_digit(*p); p++)
            if (taken < scale) {
                v = v * 10 + (*p - '0');
                taken++;
            }
    for (; taken < scale; taken++) v *= 10;
    *value = negative ? -v : v;
    return p == end;
}

static inline int base64_value(uint8_t b) {
    if (b >= 'A' && b <= 'Z') return b - 'A';
    if (b >= 'a' && b <= 'z') return b - 'a' + 26;
    if (b >= '0' && b <= '9') return b - '0' + 52;
    if (b == '+') return 62;
    if (b == '/') return 63;
    return -1;
}

/* One group of four base64 digits at p as its bytes (1 to 3: '=' pads the group ending the text, `last`); the
   count, or -1 for what is not base64. */
static inline int base64_group(const uint8_t *p, int last, uint8_t byte[3]) {
    int a = base64_value(p[0]), b = base64_value(p[1]), c = base64_value(p[2]), d = base64_value(p[3]);
    if (a < 0 || b < 0) return -1;
    byte[0] = (uint8_t)(a << 2 | b >> 4);
    if (p[2] == '=') return last && p[3] == '=' ? 1 : -1;
    if (c < 0) return -1;
    byte[1] = (uint8_t)((b & 15) << 4 | c >> 2);
    if (p[3] == '=') return last ? 2 : -1;
    if (d < 0) return -1;
    byte[2] = (uint8_t)((c & 3) << 6 | d);
    return 3;
}

/* The number at the cursor as a double, as msgspec reads it into a float (an integer -0 is 0.0). */
static inline int double_value(cursor_t *c, double *value) {
    const uint8_t *start = c->p;
    int integer = 1;
    while (c->p < c->end && (is_digit(*c->p) || *c->p == '-' || *c->p == '+' || *c->p == '.' || *c->p == 'e' ||
                             *c->p == 'E')) {
        if (*c->p == '.' || *c->p == 'e' || *c->p == 'E') integer = 0;
        c->p++;
    }
    char text[512];
    size_t n = (size_t)(c->p - start);
    if (n == 0 || n >= sizeof text) return 0;
    memcpy(text, start, n);
    text[n] = 0;
    char *stop;
    *value = strtod(text, &stop);
    if (stop != text + n || !isfinite(*value)) return 0;
    if (integer && *value == 0) *value = 0.0;
    return 1;
}

#endif
