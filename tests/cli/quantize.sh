# petrel quantize: writes an MLX checkpoint that petrel inspect validates, with
# mlx-lm's names and config keys; bad arguments and inputs are errors.
source tests/cli/lib.bash

expect_exit quantize_llama 0 "$PETREL" quantize tests/fixtures/format/llama "$TMP/q4" --bits 4 --group-size 32
expect_stdout quantize_summary '^wrote .*q4: [0-9]+ tensors in 1 shard, 15 modules quantized'
if [ ! -s "$TMP/err" ]; then pass quantize_no_bar_off_tty; else fail quantize_no_bar_off_tty "stderr: $(head -c 200 "$TMP/err")"; fi
expect_exit quantize_then_inspect 0 "$PETREL" inspect "$TMP/q4"
expect_stdout quantize_inspect_layout '^layout: +MLX, BF16'
expect_stdout quantize_inspect_modules 'layers\.\*\.self_attn\.q_proj +4-bit g32'
expect_stdout quantize_inspect_embed 'embed_tokens +4-bit g32'
for f in tokenizer_config.json generation_config.json model.safetensors.index.json; do
  [ -f "$TMP/q4/$f" ] && pass "quantize_writes_$f" || fail "quantize_writes_$f" "missing"
done
grep -q '"quantization":' "$TMP/q4/config.json" && grep -q '"quantization_config":' "$TMP/q4/config.json" \
  && pass quantize_config_keys || fail quantize_config_keys "config.json lacks quantization keys"

# MLX names for a multimodal wrapper and stacked experts
expect_exit quantize_gemma3 0 "$PETREL" quantize tests/fixtures/format/gemma3 "$TMP/g3" --bits 8 --group-size 32
"$PETREL" inspect --json "$TMP/g3" >"$TMP/out" 2>"$TMP/err"
grep -q '"layout":"mlx"' "$TMP/out" && pass quantize_gemma3_mlx_layout || fail quantize_gemma3_mlx_layout "$(head -c 300 "$TMP/out")"
head -c 4000 "$TMP/g3/model.safetensors" | grep -q '"language_model.model.layers.0.self_attn.q_proj.scales"' \
  && pass quantize_gemma3_names || fail quantize_gemma3_names "no language_model.model.* names"
head -c 4000 "$TMP/g3/model.safetensors" | grep -q 'vision_tower' \
  && fail quantize_gemma3_no_vision "vision tower written" || pass quantize_gemma3_no_vision
expect_exit quantize_moe 0 "$PETREL" quantize tests/fixtures/format/qwen3_moe "$TMP/moe" --bits 4 --group-size 32
head -c 8000 "$TMP/moe/model.safetensors" | grep -q '"model.layers.1.mlp.switch_mlp.up_proj.weight":{"dtype":"U32","shape":\[4,16,4\]' \
  && pass quantize_moe_stacked || fail quantize_moe_stacked "no stacked switch_mlp experts"

# mixed recipe: per-module entries with mode
expect_exit quantize_mixed 0 "$PETREL" quantize tests/fixtures/format/llama "$TMP/mix" --mixed mixed_3_6 --group-size 32
grep -A3 '"model.layers.1.mlp.down_proj"' "$TMP/mix/config.json" | grep -q '"bits":.*6' \
  && pass quantize_mixed_high || fail quantize_mixed_high "down_proj of the last layer not 6-bit"
grep -A3 '"model.layers.0.mlp.up_proj"' "$TMP/mix/config.json" | grep -q '"bits":.*3' \
  && pass quantize_mixed_low || fail quantize_mixed_low "up_proj not 3-bit"

# errors
expect_exit quantize_bad_bits 2 "$PETREL" quantize tests/fixtures/format/llama "$TMP/x" --bits 7
expect_stderr quantize_bad_bits_msg "bits '7': expected 2, 3, 4, 5, 6 or 8"
expect_exit quantize_bad_group 2 "$PETREL" quantize tests/fixtures/format/llama "$TMP/x" --group-size 16
expect_stderr quantize_bad_group_msg "group-size '16': expected 32, 64 or 128"
expect_exit quantize_bad_recipe 2 "$PETREL" quantize tests/fixtures/format/llama "$TMP/x" --mixed mixed_5_5
expect_exit quantize_missing_out 2 "$PETREL" quantize tests/fixtures/format/llama
expect_exit quantize_out_not_empty 1 "$PETREL" quantize tests/fixtures/format/llama "$TMP/q4"
expect_stderr quantize_out_not_empty_msg 'q4: output directory exists and is not empty'
expect_exit quantize_already 1 "$PETREL" quantize "$TMP/q4" "$TMP/qq"
expect_stderr quantize_already_msg 'already quantized'
expect_exit quantize_bad_input 1 "$PETREL" quantize "$TMP/nothing-here" "$TMP/qq"
expect_stderr quantize_bad_input_msg 'nothing-here: not a directory'
expect_exit quantize_help 0 "$PETREL" quantize --help
expect_stdout quantize_help_text 'usage: petrel quantize IN OUT'
