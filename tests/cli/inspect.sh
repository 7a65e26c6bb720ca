# petrel inspect: every committed fixture model validates (exit 0, or 2 for a
# family petrel cannot run yet), and every kind of bad input is exit 1 with a
# message naming the file, tensor or field.
source tests/cli/lib.bash

# --- every model directory under tests/fixtures (ours and the oracle's) ---
n_models=0
while IFS= read -r cfg; do
  d=$(dirname "$cfg")
  n_models=$((n_models+1))
  "$PETREL" inspect "$d" >"$TMP/out" 2>"$TMP/err"; rc=$?
  name="inspect_valid:${d#tests/fixtures/}"
  if [ $rc -eq 0 ] || [ $rc -eq 2 ]; then
    if grep -q '^architecture:' "$TMP/out"; then pass "$name"; else fail "$name" "no description on stdout"; fi
  else
    fail "$name" "exit $rc: $(head -c 400 "$TMP/err")"
  fi
done < <(for c in $(find tests/fixtures -name config.json | LC_ALL=C sort); do
           d=$(dirname "$c"); ls "$d"/*.safetensors >/dev/null 2>&1 && echo "$c"; done)
[ $n_models -ge 14 ] && pass inspect_found_models || fail inspect_found_models "only $n_models model directories"

# --- exit codes and output ---
expect_exit inspect_llama_exit0 0 "$PETREL" inspect tests/fixtures/format/llama
expect_stdout inspect_llama_arch '^architecture: +llama'
expect_stdout inspect_llama_params '^parameters: +20640 '
expect_stdout inspect_llama_kv 'KV cache/token: bf16 128 B, 8-bit 64 B, 4-bit 32 B'
expect_exit inspect_gemma3_exit0 0 "$PETREL" inspect tests/fixtures/format/gemma3
expect_stdout inspect_gemma3_skips_vision 'skipped'
expect_exit inspect_gemma4_exit0 0 "$PETREL" inspect tests/fixtures/format/gemma4_mlx
expect_exit inspect_qwen3_5_moe_exit0 0 "$PETREL" inspect tests/fixtures/format/qwen3_5_moe_mlx
expect_stdout inspect_qwen3_5_moe_shared 'moe 4 experts top-2 x 16 \+shared 16 silu'
expect_exit inspect_json 0 "$PETREL" inspect --json tests/fixtures/format/qwen3_moe
expect_stdout inspect_json_fields '"architecture":"qwen3_moe".*"n_experts":4'
if [ "$(wc -l <"$TMP/out")" -eq 1 ] && [ ! -s "$TMP/err" ]; then pass inspect_json_one_line; else fail inspect_json_one_line "stdout/stderr not clean"; fi
expect_exit inspect_help 0 "$PETREL" inspect --help
expect_stdout inspect_help_text 'usage: petrel inspect DIR'
expect_exit inspect_no_dir 2 "$PETREL" inspect
expect_exit inspect_bad_flag 2 "$PETREL" inspect --bogus tests/fixtures/format/llama
expect_stderr inspect_bad_flag_named "unknown option '--bogus'"

# --- bad input ---
# copy a fixture into $TMP/NAME and apply an edit to config.json with sed
mk() { rm -rf "$TMP/$1"; cp -r tests/fixtures/format/llama "$TMP/$1"; }
cfg_sub() { sed -i "$2" "$TMP/$1/config.json"; }
# writes a safetensors file: $1 path, $2 header JSON, $3 number of zero data bytes,
# $4 optional header length to claim instead of the real one
mkst() {
  local path=$1 hdr=$2 n=$3 len=${4:-${#2}} i esc=""
  for i in 0 1 2 3 4 5 6 7; do esc+=$(printf '\\%03o' $(( (len >> (8*i)) & 255 ))); done
  printf "$esc" >"$path"
  printf '%s' "$hdr" >>"$path"
  head -c "$n" /dev/zero >>"$path"
}
bad() { # name, dir, stderr pattern
  expect_exit "$1" 1 "$PETREL" inspect "$2"
  expect_stderr "$1_message" "$3"
  if [ -s "$TMP/out" ]; then fail "$1_stdout_clean" "stdout not empty on error"; else pass "$1_stdout_clean"; fi
}

mk empty; : >"$TMP/empty/model.safetensors"
bad inspect_empty_file "$TMP/empty" 'model\.safetensors: file is 0 bytes, too short'

mk trunc; head -c 1000 tests/fixtures/format/llama/model.safetensors >"$TMP/trunc/model.safetensors"
bad inspect_truncated "$TMP/trunc" "model\.safetensors: tensor '.*' data_offsets .* outside the data section|exceeds the file"

mk trunc2; head -c 5 tests/fixtures/format/llama/model.safetensors >"$TMP/trunc2/model.safetensors"
bad inspect_truncated_header "$TMP/trunc2" 'model\.safetensors: file is 5 bytes'

H='{"model.embed_tokens.weight":{"dtype":"BF16","shape":[64,32],"data_offsets":[0,4096]}}'
mk lielen; mkst "$TMP/lielen/model.safetensors" "$H" 4096 999999
bad inspect_header_length_lies "$TMP/lielen" 'model\.safetensors: header length 999999 exceeds the file'

mk lieoff; mkst "$TMP/lieoff/model.safetensors" "$H" 100
bad inspect_offsets_lie "$TMP/lieoff" "model\.safetensors: tensor 'model\.embed_tokens\.weight': data_offsets \[0, 4096\] lie outside the data section \(100 bytes\)"

mk overlap; mkst "$TMP/overlap/model.safetensors" '{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}' 24
bad inspect_overlap "$TMP/overlap" "model\.safetensors: tensors 'a' .* and 'b' .* overlap"

mk dtype; mkst "$TMP/dtype/model.safetensors" '{"a":{"dtype":"Q4_K","shape":[4],"data_offsets":[0,16]}}' 16
bad inspect_unknown_dtype "$TMP/dtype" "model\.safetensors: tensor 'a': unknown dtype 'Q4_K'"

mk negdim; mkst "$TMP/negdim/model.safetensors" '{"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}' 16
bad inspect_negative_dim_tensor "$TMP/negdim" "model\.safetensors: tensor 'a': negative dimension"

mk missing; cfg_sub missing 's/"num_hidden_layers": 2/"num_hidden_layers": 3/'
bad inspect_missing_tensor "$TMP/missing" "missing tensor 'model\.layers\.2\.input_layernorm\.weight' \(expected shape \[32\]\)"

mk extra; cfg_sub extra 's/"num_hidden_layers": 2/"num_hidden_layers": 1/'
bad inspect_unexplained_tensor "$TMP/extra" "unexpected tensor 'model\.layers\.1\..*' .*llama does not use it"

mk shape; cfg_sub shape 's/"intermediate_size": 64/"intermediate_size": 48/'
bad inspect_wrong_shape "$TMP/shape" "tensor 'model\.layers\.0\.mlp\.gate_proj\.weight': expected shape \[48, 32\], found \[64, 32\]"

mk notjson; echo '{"model_type": "llama",' >"$TMP/notjson/config.json"
bad inspect_config_not_json "$TMP/notjson" 'notjson/config\.json: not valid JSON'

mk nofield; cfg_sub nofield '/"hidden_size"/d'
bad inspect_missing_field "$TMP/nofield" 'config\.json: missing field "hidden_size"'

mk negfield; cfg_sub negfield 's/"intermediate_size": 64/"intermediate_size": -64/'
bad inspect_negative_dim_config "$TMP/negfield" 'config\.json: field "intermediate_size": value -64 out of range'

mk unknown; cfg_sub unknown 's/"model_type": "llama"/"model_type": "falcon"/'
bad inspect_unknown_model_type "$TMP/unknown" "config\.json: unknown model_type 'falcon'"

mk noweights; rm "$TMP/noweights/model.safetensors"
bad inspect_no_weights "$TMP/noweights" 'noweights: no weights found'

mk noconfig; rm "$TMP/noconfig/config.json"
bad inspect_no_config "$TMP/noconfig" 'noconfig: missing config\.json'

bad inspect_not_a_dir "$TMP/does-not-exist" 'does-not-exist: not a directory'

mk badgen; echo '{"eos_token_id": "x"}' >"$TMP/badgen/generation_config.json"
bad inspect_bad_generation_config "$TMP/badgen" 'generation_config\.json: field "eos_token_id"'

mk badkv; echo '[{"layer_idx": 9, "bits": 4, "group_size": 64}]' >"$TMP/badkv/kv_config.json"
bad inspect_bad_kv_config "$TMP/badkv" 'kv_config\.json: entry 0: layer_idx 9 out of range'

# optional files: unrelated files are ignored, a null token id is fine
mk extra_files; echo hello >"$TMP/extra_files/README.md"; cfg_sub extra_files 's/"bos_token_id": 1/"bos_token_id": null/'
expect_exit inspect_ignores_unrelated_files 0 "$PETREL" inspect "$TMP/extra_files"
