/*
 * json_text.h - UTF-8 hygiene for the text that goes into JSON responses, and
 * what that text costs once cJSON has escaped it (for the response bound,
 * api_response_bound).
 */
#ifndef SRV_JSON_TEXT_H
#define SRV_JSON_TEXT_H

#include <stddef.h>

/* n bytes as a NUL-terminated string (malloc'd) with each invalid UTF-8 byte
 * (and NUL) replaced by U+FFFD, so clients' JSON parsers never choke. */
char *utf8_clean(const char *s, size_t n);
/* The bytes of utf8_clean(s, n) as cJSON prints it inside a string (quotes
 * not counted): '"', '\\' and \b \f \n \r \t take 2, other control bytes 6
 * (\u00XX), U+FFFD 3. Allocates nothing. */
size_t json_text_bytes(const char *s, size_t n);

#endif
