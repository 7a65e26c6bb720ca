# petrel template: renders byte for byte, pins strftime_now, refuses raising
# templates and syntax errors with exit 1 and the template line, never crashes.
source tests/cli/lib.bash
F=tests/fixtures/templates

expect_exit template_help 0 "$PETREL" template --help
expect_stdout template_help_text 'usage: petrel template'
expect_exit template_no_args 2 "$PETREL" template
expect_exit template_bad_flag 2 "$PETREL" template --bogus x
expect_stderr template_bad_flag_named "bogus"
expect_exit template_bad_now 2 "$PETREL" template --template $F/chatml.jinja --input $F/inputs/basic.json --now 2026-13-99
expect_exit template_missing_file 1 "$PETREL" template --template $TMP/none.jinja --input $F/inputs/basic.json
expect_stderr template_missing_file_named "none.jinja"

# every committed template over every input, against goldens from Python's jinja2
for g in $F/goldens/*.out; do
  b=$(basename "$g" .out); t=${b%%__*}; i=${b#*__}
  "$PETREL" template --template "$F/$t.jinja" --input "$F/inputs/$i.json" --now 2026-03-14T15:09:26 >"$TMP/out" 2>"$TMP/err"
  if [ $? -eq 0 ] && cmp -s "$TMP/out" "$g"; then pass "template_golden_$b"; else fail "template_golden_$b" "output differs from $g: $(head -c 300 "$TMP/err")"; fi
done
for g in $F/goldens/*.err; do
  b=$(basename "$g" .err); t=${b%%__*}; i=${b#*__}
  expect_exit "template_refuses_$b" 1 "$PETREL" template --template "$F/$t.jinja" --input "$F/inputs/$i.json" --now 2026-03-14T15:09:26
  expect_stderr "template_refuses_msg_$b" "$(head -c 60 "$g" | sed 's/[][\\.*^$(){}|+?]/./g')"
done

# no newline added; strftime_now pinned by --now
printf '%s' '{{ strftime_now("%Y-%m-%d %H:%M:%S %A") }}' >"$TMP/t.jinja"
echo '{}' >"$TMP/e.json"
"$PETREL" template --template "$TMP/t.jinja" --input "$TMP/e.json" --now 2026-03-14T15:09:26 >"$TMP/out" 2>"$TMP/err"
if [ "$(cat "$TMP/out")" = "2026-03-14 15:09:26 Saturday" ] && [ "$(wc -c <"$TMP/out")" -eq 28 ]; then pass template_now_pinned; else fail template_now_pinned "got '$(cat "$TMP/out")'"; fi
"$PETREL" template --template "$TMP/t.jinja" --input "$TMP/e.json" >"$TMP/out" 2>"$TMP/err"
if grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2} ' "$TMP/out"; then pass template_now_default; else fail template_now_default "got '$(cat "$TMP/out")'"; fi

# a raising template, a syntax error, an undefined call: exit 1 with the line
printf 'a\n{{ raise_exception("nope") }}' >"$TMP/r.jinja"
expect_exit template_raise 1 "$PETREL" template --template "$TMP/r.jinja" --input "$TMP/e.json"
expect_stderr template_raise_msg 'r.jinja:2: TemplateError: nope'
printf '{%% if x %%}\n{%% endfor %%}' >"$TMP/s.jinja"
expect_exit template_syntax 1 "$PETREL" template --template "$TMP/s.jinja" --input "$TMP/e.json"
expect_stderr template_syntax_msg 's.jinja:2: TemplateSyntaxError'
printf '{{ nothing() }}' >"$TMP/u.jinja"
expect_exit template_undefined_call 1 "$PETREL" template --template "$TMP/u.jinja" --input "$TMP/e.json"
expect_stderr template_undefined_call_msg "UndefinedError: 'nothing' is undefined"
printf '{%% set x = [] %%}{{ x.append(1) }}' >"$TMP/m.jinja"
expect_exit template_sandbox 1 "$PETREL" template --template "$TMP/m.jinja" --input "$TMP/e.json"
expect_stderr template_sandbox_msg "SecurityError: access to attribute 'append' of 'list' object is unsafe"
echo '[1, 2]' >"$TMP/notobj.json"
expect_exit template_input_not_object 1 "$PETREL" template --template "$TMP/t.jinja" --input "$TMP/notobj.json"
printf '{"a": ' >"$TMP/trunc.json"
expect_exit template_input_truncated 1 "$PETREL" template --template "$TMP/t.jinja" --input "$TMP/trunc.json"
