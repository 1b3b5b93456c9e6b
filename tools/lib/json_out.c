/* tools/lib/json_out.c: JSON output helpers shared by the tools' --json
 * modes (they print JSON directly; jansson is for reading). */
#include "tools/lib/tools.h"

#include <string.h>

void tools_json_strn(FILE *o, const char *s, size_t n)
{
	fputc('"', o);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		switch (ch) {
		case '"':
			fputs("\\\"", o);
			break;
		case '\\':
			fputs("\\\\", o);
			break;
		case '\n':
			fputs("\\n", o);
			break;
		case '\r':
			fputs("\\r", o);
			break;
		case '\t':
			fputs("\\t", o);
			break;
		default:
			if (ch < 0x20)
				fprintf(o, "\\u%04x", ch);
			else
				fputc(ch, o);
		}
	}
	fputc('"', o);
}

void tools_json_str(FILE *o, const char *s)
{
	tools_json_strn(o, s ? s : "", s ? strlen(s) : 0);
}
