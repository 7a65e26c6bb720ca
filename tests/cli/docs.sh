# Documentation coverage: every long option a command's --help lists and
# every PETREL_* environment variable the sources read are named somewhere in
# docs/ or the README, and every route of the server is in docs/server.md
# (the reference a user reads instead of the code).
source tests/cli/lib.bash
DOCS=(docs/*.md README.md)

expect_exit top_help 0 "$PETREL" --help
cmds=$(sed -n 's/^  \([a-z][a-z]*\)  .*/\1/p' "$TMP/out")
if [ "$(echo "$cmds" | wc -w)" -ge 10 ]; then pass commands_listed; else fail commands_listed "petrel --help lists: $cmds"; fi

for c in $cmds; do
  "$PETREL" "$c" --help >"$TMP/help" 2>&1
  missing=""
  for f in $(grep -oE -- '--[a-z0-9][a-z0-9-]*' "$TMP/help" | sort -u); do
    grep -qE -- "$f([^a-z0-9-]|$)" "${DOCS[@]}" || missing="$missing $f"
  done
  if [ -z "$missing" ]; then pass "options_documented_$c"; else fail "options_documented_$c" "not in docs/:$missing"; fi
done

# the variables: string literals "PETREL_..." in the C and CUDA sources
vars=$(grep -rhoE '"PETREL_[A-Z0-9_]+"' src --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' | tr -d '"' | sort -u)
if [ "$(echo "$vars" | wc -w)" -ge 20 ]; then pass env_vars_found; else fail env_vars_found "only: $vars"; fi
missing=""
for v in $vars; do grep -qE "$v([^A-Z0-9_]|$)" "${DOCS[@]}" || missing="$missing $v"; done
if [ -z "$missing" ]; then pass env_vars_documented; else fail env_vars_documented "not in docs/:$missing"; fi

# the server's routes (server.c's table: {"METHOD", "/path", handler, ...}) as `METHOD /path` in docs/server.md
routes=$(grep -oE '\{"(GET|POST|PUT|DELETE)", "/[^"]*", [a-z_]+' src/server/server.c | sed -E 's/\{"([A-Z]+)", "([^"]*)".*/\1 \2/' | tr ' ' '@')
if [ "$(echo "$routes" | wc -w)" -ge 5 ]; then pass routes_found; else fail routes_found "only: $routes"; fi
missing=""
for r in $routes; do grep -qF "\`${r/@/ }\`" docs/server.md || missing="$missing ${r/@/ }"; done
if [ -z "$missing" ]; then pass routes_documented; else fail routes_documented "not in docs/server.md:$missing"; fi
