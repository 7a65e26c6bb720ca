# petrel generate / logits / chat / perplexity / bench: argument handling,
# errors that name what is wrong, and runs on the llama fixture (and the demo
# model) when they are present.
source tests/cli/lib.bash
FIX=tests/fixtures/llama
[ -f "$FIX/config.json" ] || FIX=tests/fixtures/format/llama   # no tokenizer: id-based checks only

expect_exit generate_help 0 "$PETREL" generate --help
expect_stdout generate_help_levers 'kv-quant off.4.8.config'
expect_exit generate_unknown_flag 2 "$PETREL" generate --frobnicate
expect_stderr generate_unknown_flag_named "unknown option '--frobnicate'"
expect_exit generate_no_model 2 "$PETREL" generate -p hi
expect_stderr generate_no_model_msg "no model given"
expect_exit generate_no_prompt 2 "$PETREL" generate -m "$FIX"
expect_exit generate_bad_temp 2 "$PETREL" generate -m "$FIX" -p hi --temp abc
expect_stderr generate_bad_temp_named "temp: bad value 'abc'"
expect_exit generate_bad_lever 2 "$PETREL" generate -m "$FIX" -p hi --kv-quant 5
expect_stderr generate_bad_lever_named "kv-quant: bad value '5'"
expect_exit generate_bad_env 2 env PETREL_INT8_ACT=sometimes "$PETREL" generate -m "$FIX" -p hi
expect_stderr generate_bad_env_named "PETREL_INT8_ACT"
expect_exit generate_empty_prompt 2 "$PETREL" generate -m "$FIX" -p ""
expect_stderr generate_empty_prompt_msg "empty"
expect_exit generate_bad_ids 2 "$PETREL" generate -m "$FIX" --prompt-ids 1,x,3
expect_stderr generate_bad_ids_msg "not a token id"
expect_exit generate_empty_ids 2 "$PETREL" generate -m "$FIX" --prompt-ids ,
expect_stderr generate_empty_ids_msg "empty"

# --print-config: tiers are aliases, a later flag overrides them, env mirrors count
expect_exit print_config 0 "$PETREL" generate --print-config
expect_stdout print_config_default "kv-quant: off"
expect_exit print_config_l3 0 "$PETREL" generate --l3 --print-config
expect_stdout print_config_l3_fused "fused-decode-attn: on"
expect_exit print_config_override 0 "$PETREL" generate --l3 --fused-decode-attn off --kv-quant 8 --print-config
expect_stdout print_config_override_fused "fused-decode-attn: off"
expect_stdout print_config_override_kv "kv-quant: 8"
expect_exit print_config_env 0 env PETREL_PREFILL_CHUNK=77 "$PETREL" generate --print-config
expect_stdout print_config_env_chunk "prefill-chunk: 77"
expect_exit print_config_flag_over_env 0 env PETREL_PREFILL_CHUNK=77 "$PETREL" generate --prefill-chunk 9 --print-config
expect_stdout print_config_flag_over_env_chunk "prefill-chunk: 9"
expect_stdout print_config_cpu_na "compiled-decode: on \(not applicable on the cpu\)"

for c in chat logits perplexity bench; do
  expect_exit ${c}_help 0 "$PETREL" $c --help
  expect_exit ${c}_unknown_flag 2 "$PETREL" $c --no-such-flag
  expect_stderr ${c}_unknown_flag_named "unknown option '--no-such-flag'"
done
expect_exit logits_no_out 2 "$PETREL" logits -m "$FIX" --prompt-ids 1,2
expect_stderr logits_no_out_msg "no output file"
expect_exit logits_bad_dtype 2 "$PETREL" logits -m "$FIX" --prompt-ids 1,2 --out x --dtype f16
expect_exit bench_no_model 2 "$PETREL" bench
expect_exit bench_synthetic_no_quant 2 "$PETREL" bench --synthetic llama-3.2-1b
expect_exit bench_bad_synthetic 1 "$PETREL" bench --synthetic nope --quant q4
expect_stderr bench_bad_synthetic_named "unknown shape"
# an environment switch given a value it does not take: named in a warning, the default kept, the run goes on
PETREL_CPU_SPLIT=sometimes PETREL_POOL_SPIN_US=lots expect_exit env_bad_switch_runs 0 \
  "$PETREL" generate -m "$FIX" --prompt-ids 1,2,3 --max-tokens 2 --temp 0 --print-ids -t 2
expect_stderr env_bad_switch_named "PETREL_CPU_SPLIT=sometimes is not one of .*keeping the default \(on\)"
expect_stderr env_bad_number_named "PETREL_POOL_SPIN_US=lots is not a whole number from 0 to 10000"
PETREL_CPU_SPLIT=off expect_exit env_off_word 0 "$PETREL" generate -m "$FIX" --prompt-ids 1,2,3 --max-tokens 2 --temp 0 --print-ids -t 2
if grep -q "PETREL_" "$TMP/err"; then fail env_off_word_silent "$(head -c 200 "$TMP/err")"; else pass env_off_word_silent; fi
expect_exit perplexity_no_file 2 "$PETREL" perplexity -m "$FIX"

if [ ! -f "$FIX/config.json" ]; then
  echo "SKIP generate_fixture: $FIX not present"
  exit 0
fi
# ids verbatim; greedy is reproducible; print-ids prints ids
expect_exit generate_ids 0 "$PETREL" generate -m "$FIX" --prompt-ids 5,6,7 --max-tokens 8 --temp 0 --print-ids -t 1
cp "$TMP/out" "$TMP/ids1"
expect_stderr generate_stats "prompt: 3 tokens, .* tok/s \| generation: .* tok/s \| first token: "
if grep -qE '^[0-9]+( [0-9]+)*$' "$TMP/ids1"; then pass generate_print_ids_format; else fail generate_print_ids_format "$(head -c 200 "$TMP/ids1")"; fi
expect_exit generate_ids_2threads 0 "$PETREL" generate -m "$FIX" --prompt-ids 5,6,7 --max-tokens 8 --temp 0 --print-ids -t 2
if cmp -s "$TMP/out" "$TMP/ids1"; then pass generate_threads_identical; else fail generate_threads_identical "1 vs 2 threads differ"; fi
expect_exit generate_id_out_of_vocab 1 "$PETREL" generate -m "$FIX" --prompt-ids 5,99999999 --max-tokens 2
expect_stderr generate_id_out_of_vocab_msg "outside the vocabulary"
expect_exit generate_ctx_over_max 1 "$PETREL" generate -m "$FIX" --prompt-ids 5 --ctx 100000000
expect_stderr generate_ctx_over_max_msg "maximum"
expect_exit generate_prompt_too_long 1 "$PETREL" generate -m "$FIX" --prompt-ids 1,2,3,4,5,6 --ctx 4
expect_stderr generate_prompt_too_long_msg "do not fit in the context"
expect_exit generate_kv_group_mismatch 1 "$PETREL" generate -m "$FIX" --prompt-ids 5 --kv-quant 4 --kv-group-size 128
expect_stderr generate_kv_group_mismatch_msg "does not divide"
expect_exit generate_l3 0 "$PETREL" generate -m "$FIX" --prompt-ids 5 --l3 --kv-group-size 32 --max-tokens 4
expect_exit example_generate 0 "${BUILD:-build}/examples/generate" "$FIX" --ids 5,6,7 6
if grep -qE '^[0-9]+( [0-9]+)* ?$' "$TMP/out"; then pass example_generate_ids; else fail example_generate_ids "$(head -c 200 "$TMP/out")"; fi
expect_stderr example_generate_stats "generated"
expect_exit bench_json 0 "$PETREL" bench -m "$FIX" -p 8 -n 4 -d 0,8 -r 2 --json -t 1 --bw-gib 0
if head -c 1 "$TMP/out" | grep -q '\[' && [ "$(grep -c '"n_prompt"' "$TMP/out")" -eq 4 ] \
   && grep -q '"n_prompt": 8, "n_gen": 0, "n_depth": 8' "$TMP/out" && grep -q '"n_prompt": 0, "n_gen": 4' "$TMP/out" \
   && grep -q '"avg_ts"' "$TMP/out" && grep -q '"stddev_ts"' "$TMP/out" && grep -q '"bw_fraction"' "$TMP/out" && grep -q '"gbps"' "$TMP/out"; then
  pass bench_json_rows
else
  fail bench_json_rows "$(head -c 400 "$TMP/out")"
fi
expect_exit bench_interleave_no_buffer 2 "$PETREL" bench -m "$FIX" -p 8 -n 4 --bw-gib 0 --bw-interleave
expect_stderr bench_interleave_no_buffer_msg "needs the bandwidth buffer"
# --bw-interleave: a read pass after each repetition; each row's fraction is against the median of its own passes
expect_exit bench_interleave_json 0 "$PETREL" bench -m "$FIX" -p 8 -n 4 -r 3 --json -t 1 --bw-gib 2 --bw-interleave
if [ "$(grep -c '"bw_samples_gbps": \[[0-9.]*, [0-9.]*, [0-9.]*\]' "$TMP/out")" -eq 2 ] && awk '
  /"n_prompt"/ {
    n++
    g = $0; sub(/.*"gbps": /, "", g); sub(/,.*/, "", g)
    f = $0; sub(/.*"bw_fraction": /, "", f); sub(/,.*/, "", f)
    b = $0; sub(/.*"bw_row_gbps": /, "", b); sub(/,.*/, "", b)
    s = $0; sub(/.*"bw_samples_gbps": \[/, "", s); sub(/\].*/, "", s)
    k = split(s, v, ", ")
    if (k != 3 || b + 0 <= 0) bad = 1
    # the median of three: the one neither below nor above both others
    med = v[1] + 0; a1 = v[2] + 0; a2 = v[3] + 0
    if ((med - a1) * (med - a2) > 0) { med = a1; if ((a1 - v[1]) * (a1 - a2) > 0) med = a2 }
    if (b - med > 1e-3 * b || med - b > 1e-3 * b) bad = 1
    if (f * b - g > 1e-3 * g + 1e-9 || g - f * b > 1e-3 * g + 1e-9) bad = 1
  }
  END { exit !(n == 2 && !bad) }' "$TMP/out"; then
  pass bench_interleave_rows
else
  fail bench_interleave_rows "$(head -c 600 "$TMP/out")"
fi
expect_exit bench_interleave_table 0 "$PETREL" bench -m "$FIX" -p 0 -n 4 -r 1 -t 1 --bw-gib 2 --bw-interleave
expect_stdout bench_interleave_column "read GB/s"
if [ ! -f "$FIX/tokenizer.json" ]; then
  echo "SKIP generate_text: $FIX has no tokenizer"
  exit 0
fi
expect_exit generate_text 0 "$PETREL" generate -m "$FIX" -p "In the beginning" --max-tokens 8 --temp 0.8 --seed 3
expect_exit logits_run 0 "$PETREL" logits -m "$FIX" --prompt-ids 5,6,7 --out "$TMP/lg.bin" --dtype f32
V=$(awk '{print $2}' "$TMP/out")
sz=$(stat -c %s "$TMP/lg.bin")
if [ -n "$V" ] && [ "$sz" -eq $((3 * V * 4)) ]; then pass logits_size; else fail logits_size "size $sz for vocab '$V'"; fi
expect_exit logits_bf16 0 "$PETREL" logits -m "$FIX" --prompt-ids 5,6,7 --out "$TMP/lg16.bin" --dtype bf16
if ! cmp -s "$TMP/lg.bin" "$TMP/lg16.bin"; then pass logits_bf16_differs; else fail logits_bf16_differs "bf16 == f32 bytes"; fi
printf 'In the beginning God created the heaven and the earth. And the earth was without form, and void.\n' > "$TMP/t.txt"
expect_exit perplexity_run 0 "$PETREL" perplexity -m "$FIX" -f "$TMP/t.txt" --ctx 16
expect_stdout perplexity_line "^perplexity: [0-9.]+ over [0-9]+ scored tokens"
printf 'Hello\nWho are you?\n' > "$TMP/chat.txt"
"$PETREL" chat -m "$FIX" --max-tokens 6 --temp 0 < "$TMP/chat.txt" > "$TMP/out" 2> "$TMP/err"; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c 'prompt tokens' "$TMP/err")" -eq 2 ]; then pass chat_two_turns; else fail chat_two_turns "rc $rc: $(head -c 300 "$TMP/err")"; fi
expect_stderr chat_reuses_cache "\([1-9][0-9]* reused\)"

# stop strings and eos on the bundled demo model (greedy output is fixed by its goldens)
DEMO=models/kjv-llama-4bit
if [ -f "$DEMO/config.json" ]; then
  expect_exit demo_generate 0 "$PETREL" generate -m "$DEMO" -p "In the beginning God" --max-tokens 12 --temp 0 -t 1
  expect_stdout demo_generate_text "created the heaven and the earth"
  expect_exit demo_stop 0 "$PETREL" generate -m "$DEMO" -p "In the beginning God" --max-tokens 30 --temp 0 --stop heaven -t 1
  if [ "$(cat "$TMP/out")" = " created the " ]; then pass demo_stop_text; else fail demo_stop_text "got '$(head -c 100 "$TMP/out")'"; fi
  expect_stderr demo_stop_reason "finish: stop"
  expect_exit demo_chat_eos 0 "$PETREL" generate -m "$DEMO" --chat -p "Recite John 3:16." --max-tokens 80 --temp 0 -t 1
  expect_stdout demo_chat_text "For God so loved the world"
  expect_stderr demo_chat_eos_reason "finish: eos"
  expect_exit demo_seeded_a 0 "$PETREL" generate -m "$DEMO" -p "And" --max-tokens 16 --temp 0.9 --top-p 0.9 --seed 42 --print-ids -t 1
  cp "$TMP/out" "$TMP/seed_a"
  expect_exit demo_seeded_b 0 "$PETREL" generate -m "$DEMO" -p "And" --max-tokens 16 --temp 0.9 --top-p 0.9 --seed 42 --print-ids -t 2
  if cmp -s "$TMP/out" "$TMP/seed_a"; then pass demo_seed_reproducible; else fail demo_seed_reproducible "two runs with --seed 42 differ"; fi
else
  echo "SKIP demo: $DEMO absent"
fi
