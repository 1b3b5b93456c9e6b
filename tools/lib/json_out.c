/* tools/lib/json_out.c: JSON output helpers shared by the tools' --json
 * modes (they print JSON directly; jansson is for reading). */
#include "tools/lib/tools.h"

void tools_json_str(FILE *o, const char *s)
{
	fputc('"', o);
	for (; s && *s; s++) {
		unsigned char ch = (unsigned char)*s;
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
