/* fuzz_config.c - libFuzzer target: hostile genai_config.json bytes through the config parser
 * and the name patterns it accepts; nothing may crash or read past a field, whatever the bytes. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "genai/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kiln_genai_config c;
    kiln_err e = {0};
    if (kiln_genai_config_parse((const char *)data, size, &c, &e) != KILN_OK) return 0;
    /* what a generator would do next with an accepted config: every layer's names */
    char name[KILN_GENAI_NAME_MAX];
    for (int l = 0; l < c.layers; l++) {
        kiln_genai_name(c.past_key, l, name, sizeof name, &e);
        kiln_genai_name(c.past_value, l, name, sizeof name, &e);
        kiln_genai_name(c.present_key, l, name, sizeof name, &e);
        kiln_genai_name(c.present_value, l, name, sizeof name, &e);
    }
    (void)strlen(c.filename);
    (void)strlen(c.provider);
    return 0;
}
