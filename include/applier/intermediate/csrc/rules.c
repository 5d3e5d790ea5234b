/* Image rules: one table definition's columns, as the passes read them (images.h). */

#include "images.h"

void ic_rule_free(void *rule);

/* One table's image rule; `names` holds the column names back to back, `ends[i]` where name i ends. */
void *ic_rule_new(int32_t count, const uint8_t *types, const uint8_t *nullable, const uint8_t *required,
                  const uint8_t *precision, const uint8_t *scale, const char *names, const int32_t *ends,
                  int32_t key_count, const int32_t *keys) {
    if (count < 0 || count > MAX_COLUMNS || key_count < 0) return NULL;
    rule_t *rule = malloc(sizeof(rule_t) + (size_t)count * sizeof(column_t));
    if (rule == NULL) return NULL;
    char *copy = malloc(count ? (size_t)ends[count - 1] + 1 : 1);
    if (copy == NULL) {
        free(rule);
        return NULL;
    }
    if (count) memcpy(copy, names, (size_t)ends[count - 1]);
    rule->names = copy;
    rule->count = count;
    rule->required = 0;
    rule->key_count = key_count <= MAX_KEYS ? key_count : 0;
    for (int32_t k = 0; k < rule->key_count; k++) {
        if (keys[k] < 0 || keys[k] >= count) return ic_rule_free(rule), NULL;
        rule->keys[k] = keys[k];
    }
    for (int32_t i = 0; i < count; i++) {
        int32_t start = i ? ends[i - 1] : 0;
        column_t *c = &rule->columns[i];
        c->name = copy + start;
        c->length = ends[i] - start;
        c->type = types[i];
        c->nullable = nullable[i];
        c->required = required[i];
        c->precision = precision[i];
        c->scale = scale[i];
        rule->required += required[i] ? 1 : 0;
    }
    return rule;
}

void ic_rule_free(void *rule) {
    if (rule == NULL) return;
    free(((rule_t *)rule)->names);
    free(rule);
}
