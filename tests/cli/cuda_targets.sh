# bench/cuda_targets.sh reads petrel bench's JSON and bench_decode_attn's rows
# and sets each number against its target: checked here with a stand-in
# bundle whose petrel and bench_decode_attn print outputs of those shapes
# (the GPU runs themselves happen on the GPU machine). Serving is not run.
source tests/cli/lib.bash
B=$TMP/bundle
mkdir -p "$B/tests"
cat >"$B/petrel" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *"-p 2048"*) echo '[{"median_ts": 5210.5, "bw_fraction": 0, "mma_fraction": 0.4125}]' ;;
  *llama-3.2-1b*) echo '[{"median_ts": 1658.4, "bw_fraction": 0.366}]' ;;
  *llama-3.1-8b*) echo '[{"median_ts": 449.6, "bw_fraction": 0.600}]' ;;
  *) echo "petrel bench: no such shape" >&2; exit 1 ;;
esac
EOF
cat >"$B/tests/bench_decode_attn" <<'EOF'
#!/usr/bin/env bash
printf "%-10s %6s %10s %10s %9s %8s %9s\n" kv depth "KV MB/step" us/step us/layer GB/s "of read"
printf "%-10s %6d %10.1f %10.1f %9.2f %8.0f %8.0f%%  out %08x\n" "q8 fused" 8192 600.0 400.0 12.49 1500 45 1
printf "%-10s %6d %10.1f %10.1f %9.2f %8.0f %8.0f%%  out %08x\n" "q8 fused" 32768 2400.0 1018.0 31.83 2250 71 2
printf "%-10s %6d %10.1f %10.1f %9.2f %8.0f %8.0f%%  out %08x\n" "q4 fused" 32768 1300.0 686.0 21.43 1750 55 3
EOF
chmod +x "$B/petrel" "$B/tests/bench_decode_attn"

PARTS="decode prefill attn" bench/cuda_targets.sh "$B" "$TMP/work" >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ $rc -eq 0 ]; then pass targets_exit; else fail targets_exit "exit $rc: $(head -c 300 "$TMP/err")"; fi
expect_stdout tg_1b_met 'tg128 llama-3.2-1b q4 +1658\.40 +36\.6% +target >= 30% +met$'
expect_stdout tg_8b_not_met 'tg128 llama-3.1-8b q4 +449\.60 +60\.0% +target >= 70% +NOT met$'
expect_stdout tg_3b_no_result 'tg128 llama-3.2-3b q4 +no result \(JSONDecodeError'
expect_stdout pp_met 'pp2048 llama-3.1-8b q4 +5210\.50 +41\.2% +target >= 40% +met$'
expect_stdout attn_q8_met 'q8 fused at 32768 +71% of read +target >= 70% +met$'
expect_stdout attn_q4_not_met 'q4 fused at 32768 +55% of read +target >= 70% +NOT met$'
if grep -q 'q8 fused at 8192' "$TMP/out"; then fail attn_only_32k "a verdict for 8192 keys"; else pass attn_only_32k; fi

mkdir -p "$TMP/empty"
expect_exit no_petrel 1 bench/cuda_targets.sh "$TMP/empty" "$TMP/work2"
expect_stderr no_petrel_message 'is not an executable petrel'
