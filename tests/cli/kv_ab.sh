# petrel bench --kv-ab: a paired A/B of KV-cache configurations in one run
# (one session per cache mode, each filled by its own prefill; pp rows skip
# '+fused' items). Argument errors name the item; the JSON has one row per
# (test, configuration) with its "kv" label.
source tests/cli/lib.bash
FIX=tests/fixtures/llama
expect_exit kv_ab_bad_item 2 "$PETREL" bench -m "$FIX" --kv-ab off,6
expect_stderr kv_ab_bad_item_named "kv-ab: '6': expected off.4.8.config"
expect_exit kv_ab_bad_suffix 2 "$PETREL" bench -m "$FIX" --kv-ab 4+fast
expect_stderr kv_ab_bad_suffix_named "kv-ab: '4[+]fast'"
if [ ! -f "$FIX/config.json" ]; then
  echo "SKIP kv_ab_run: $FIX not present"
  exit 0
fi
expect_exit kv_ab_json 0 "$PETREL" bench -m "$FIX" -p 4 -n 4 -d 0,8 -r 2 --json -t 1 --bw-gib 0 --kv-ab off,8,8+fused
# per depth: pp for off and 8 (not 8+fused), tg for all three
if [ "$(grep -c '"n_prompt"' "$TMP/out")" -eq 10 ] && [ "$(grep -c '"kv": "8+fused"' "$TMP/out")" -eq 2 ] \
   && [ "$(grep -c '"n_prompt": 4, "n_gen": 0, "n_depth": 8, "n_reps": 2, "kv": "8"' "$TMP/out")" -eq 1 ] \
   && ! grep -q '"n_prompt": 4, .*"kv": "8+fused"' "$TMP/out" && python3 -m json.tool "$TMP/out" >/dev/null 2>&1; then
  pass kv_ab_json_rows
else
  fail kv_ab_json_rows "$(head -c 600 "$TMP/out")"
fi
expect_exit kv_ab_table 0 "$PETREL" bench -m "$FIX" -p 0 -n 2 -r 1 -t 1 --bw-gib 0 --kv-ab off,4
expect_stdout kv_ab_table_column "\| tg2 .*\| 4 +\|$"
