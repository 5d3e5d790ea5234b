/*
 * Salts of busy tables' identities: CRC-32 (zlib's, so Python's zlib.crc32 gives the same) of each identity,
 * modulo its table's spread (applier/engine/events.py). Every process of a run, with this library or without,
 * must put an identity in the same partition, so this is zlib's checksum exactly, not any faster hash.
 */

#include "images.h"

static uint32_t table[256];

static void make_table(void) {
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[n] = c;
    }
}

static uint32_t crc32(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) c = table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

/* salt[i] = crc32(identity i) % spread[i] when spread[i] > 1, else 0 (identities: a binary column's buffers). */
void ic_salts(const uint8_t *data, const int32_t *offsets, int64_t first, int64_t count, const int32_t *spread,
              int32_t *salt) {
    if (table[1] == 0) make_table();
    for (int64_t i = 0; i < count; i++) {
        int64_t at = first + i;
        if (spread[i] <= 1) {
            salt[i] = 0;
            continue;
        }
        uint32_t c = crc32(data + offsets[at], (size_t)(offsets[at + 1] - offsets[at]));
        salt[i] = (int32_t)(c % (uint32_t)spread[i]);
    }
}
