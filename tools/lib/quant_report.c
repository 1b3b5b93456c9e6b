/* tools/lib/quant_report.c: what quantizing on load cost, as edgelm-run and
 * edgelm-bench print it. */
#include "tools/lib/tools.h"

void tools_quant_report(FILE *o, const char *prog, const struct engine_model_info *in)
{
	if (!in->quant_requested[0])
		return;
	if (in->n_quantized)
		fprintf(o,
		        "%s: quantized %u tensors to %s on load in %.2f s: %.2f MiB -> %.2f MiB\n",
		        prog, in->n_quantized, in->quant_requested, in->quant_seconds,
		        (double)in->quant_bytes_in / (1 << 20),
		        (double)in->quant_bytes_out / (1 << 20));
	if (in->quant_note[0])
		fprintf(o, "%s: quantize %s: %s\n", prog, in->quant_requested, in->quant_note);
}

void tools_quant_json(FILE *o, const struct engine_model_info *in)
{
	fprintf(o, "\"quantize\":{\"requested\":");
	tools_json_str(o, in->quant_requested);
	fprintf(o,
	        ",\"tensors\":%u,\"fallback\":%d,\"bytes_in\":%llu,\"bytes_out\":%llu,"
	        "\"seconds\":%.3f,\"note\":",
	        in->n_quantized, in->n_fallback, (unsigned long long)in->quant_bytes_in,
	        (unsigned long long)in->quant_bytes_out, in->quant_seconds);
	tools_json_str(o, in->quant_note);
	fputc('}', o);
}
