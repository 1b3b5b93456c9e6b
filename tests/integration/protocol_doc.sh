#!/bin/sh
# docs/protocol.md's per-op field tables are generated from the request
# field table (ipc/protocol_fields.c) by `test_ipc_protocol --doc`, so the
# contract cannot drift from the codec: this fails when a field, type,
# default, range, op or description changed and `make docs` was not run,
# and when an op or a field has no place in the docs.
set -u
BUILD=${BUILD:-build}
T=${TEST_TMPDIR:-$(mktemp -d)}/protocol_doc
rm -rf "$T"; mkdir -p "$T"
pass=0; fail=0
ok() { pass=$((pass + 1)); }
ko() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

doc=docs/protocol.md
gen="$BUILD/tests/unit/test_ipc_protocol"
if [ -x "$gen" ]; then ok; else ko "$gen not built"; echo "$pass passed, $fail failed"; exit 1; fi

# the committed file is its own regeneration
if "$gen" --doc <"$doc" >"$T/regen.md"; then ok; else ko "$gen --doc failed"; fi
if [ -s "$T/regen.md" ] && cmp -s "$doc" "$T/regen.md"; then
	ok
else
	ko "$doc is stale (run make docs):"; diff "$doc" "$T/regen.md" | head -20 >&2
fi
# and regenerating that changes nothing
"$gen" --doc <"$T/regen.md" >"$T/regen2.md"
if cmp -s "$T/regen.md" "$T/regen2.md"; then ok; else ko "regeneration is not stable"; fi

# every op has a generated section, and every section is closed
for op in generate chat poll cancel tokenize detokenize embed info health metrics; do
	if grep -q "^<!-- generated: fields of $op[ ]" "$doc"; then ok; else ko "$doc: no generated section for op $op"; fi
done
b=$(grep -c '^<!-- generated: fields of ' "$doc"); e=$(grep -c '^<!-- end generated -->' "$doc")
if [ "$b" -eq "$e" ] && [ "$b" -ge 10 ]; then ok; else ko "$doc: $b sections, $e ends"; fi

# every field of every op has a row in that op's section, or in the
# section it names with "all fields of `OP2`" (and does not except)
section() { sed -n "/^<!-- generated: fields of $1[ ]/,/^<!-- end generated -->/p" "$doc"; }
if "$gen" --fields >"$T/fields" && [ "$(wc -l <"$T/fields")" -ge 30 ]; then ok; else ko "$gen --fields failed"; fi
while read -r op f; do
	s=$(section "$op")
	if printf '%s\n' "$s" | grep -q "^| \`$f\` |"; then ok; continue; fi
	other=$(printf '%s\n' "$s" | sed -n 's/^| all fields of `\([a-z]*\)`.*/\1/p')
	if [ -n "$other" ] && ! printf '%s\n' "$s" | grep -q "^| all fields of .*except.*\`$f\`" &&
	   section "$other" | grep -q "^| \`$f\` |"; then
		ok
	else
		ko "field $f of op $op is in no generated section"
	fi
done <"$T/fields"

# a stale table is caught: drop a row, change a range, the check sees both
sed '/^| `top_k` |/d' "$doc" >"$T/stale1.md"
"$gen" --doc <"$T/stale1.md" >"$T/fixed1.md"
if ! cmp -s "$T/stale1.md" "$T/fixed1.md" && cmp -s "$T/fixed1.md" "$doc"; then ok; else ko "a dropped row was not restored"; fi
sed 's/^| `priority` | integer | 0 | -10 .. 10 |/| `priority` | integer | 0 | -10 .. 99 |/' "$doc" >"$T/stale2.md"
if ! cmp -s "$T/stale2.md" "$doc" && "$gen" --doc <"$T/stale2.md" | cmp -s - "$doc"; then ok; else ko "a changed range was not restored"; fi
# the prose outside the sections is kept as it is
sed 's/^The rules, precisely:$/The rules, precisely (edited):/' "$doc" >"$T/prose.md"
if "$gen" --doc <"$T/prose.md" | cmp -s - "$T/prose.md"; then ok; else ko "prose outside the sections changed"; fi

# a marker naming no op, or left open, fails (and `make docs` with it)
printf '<!-- generated: fields of nosuchop -->\n<!-- end generated -->\n' >"$T/bad1.md"
if "$gen" --doc <"$T/bad1.md" >/dev/null 2>"$T/err"; then ko "unknown op accepted"; else ok; fi
printf '<!-- generated: fields of poll -->\nno end\n' >"$T/bad2.md"
if "$gen" --doc <"$T/bad2.md" >/dev/null 2>"$T/err"; then ko "open section accepted"; else ok; fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
