# CLI tests for `petrel serve`: flags and usage errors, then the real server
# on the bundled demo model over loopback (curl): health, a chat completion,
# an SSE stream ending in [DONE], /tokenize agreeing with `petrel tokenize`, a
# 400, the prompt cache across two turns, and a clean exit on SIGTERM.
source tests/cli/lib.bash

expect_exit serve_help 0 "$PETREL" serve --help
expect_stdout serve_help_lists_flags 'prompt-cache GIB'
expect_exit serve_no_model 2 "$PETREL" serve
expect_stderr serve_no_model_message 'MODEL_DIR'
expect_exit serve_unknown_flag 2 "$PETREL" serve -m x --frobnicate
expect_stderr serve_unknown_flag_named 'frobnicate'
expect_exit serve_bad_port 2 "$PETREL" serve -m x --port 70000
expect_exit serve_bad_parallel 2 "$PETREL" serve -m x --parallel 0
expect_exit serve_missing_model_dir 1 "$PETREL" serve -m "$TMP/nope" --port 0

MODEL=$(ls -d models/*/ 2>/dev/null | head -1)
if [ -z "$MODEL" ] || ! command -v curl >/dev/null 2>&1; then
  echo "SKIP serve_demo_model: no demo model under models/ or no curl"
  exit 0
fi

# chat_content BODY: POSTs the chat completion BODY, prints the reply's content
chat_content() {
  curl -s --max-time 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$1" |
    sed -n 's/.*"content":"\([^"]*\)".*/\1/p'
}
# metric NAME FILE: the value of the /metrics line NAME (a literal, sed BRE) in FILE
metric() { sed -n "s/^$1 \([0-9]*\)\$/\1/p" "$2"; }

# prompt rows on (the CPU default is off, docs/server.md): the batching checks
# below then cover the path CUDA serves with
PETREL_PROMPT_ROWS=64 "$PETREL" serve -m "$MODEL" --port 0 -t 1 --parallel 2 2>"$TMP/serve.err" &
PID=$!
port=""
for _ in $(seq 1 100); do
  port=$(sed -n 's/.*ready on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$TMP/serve.err")
  [ -n "$port" ] && break
  kill -0 $PID 2>/dev/null || break
  sleep 0.1
done
if [ -z "$port" ]; then
  fail serve_ready "no ready line: $(head -c 400 "$TMP/serve.err")"
  kill $PID 2>/dev/null
  exit 0
fi
pass serve_ready
URL=http://127.0.0.1:$port

code=$(curl -s -o "$TMP/h" -w '%{http_code}' --max-time 10 "$URL/health")
[ "$code" = 200 ] && grep -q '"ok"' "$TMP/h" && pass serve_health || fail serve_health "$code $(cat "$TMP/h")"

curl -s --max-time 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"In the beginning"}],"max_tokens":12,"temperature":0}' >"$TMP/c"
if grep -q '"object":"chat.completion"' "$TMP/c" && grep -q '"completion_tokens":' "$TMP/c" &&
   grep -Eq '"content":"[^"]+' "$TMP/c"; then pass serve_chat; else fail serve_chat "$(head -c 400 "$TMP/c")"; fi

curl -sN --max-time 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"And God said"}],"max_tokens":6,"stream":true}' >"$TMP/s"
last=$(grep -v '^$' "$TMP/s" | tail -1)
if [ "$last" = "data: [DONE]" ] && grep -q '"finish_reason":"' "$TMP/s"; then pass serve_stream_done
else fail serve_stream_done "$(tail -c 300 "$TMP/s")"; fi

ids=$("$PETREL" tokenize -m "$MODEL" --text "Jesus wept" 2>/dev/null | tr ' ' ',')
curl -s --max-time 10 "$URL/tokenize" -H 'Content-Type: application/json' -d '{"content":"Jesus wept"}' >"$TMP/t"
if [ -n "$ids" ] && grep -q "\"tokens\":\[$ids\]" "$TMP/t"; then pass serve_tokenize_matches_cli
else fail serve_tokenize_matches_cli "cli [$ids] server $(cat "$TMP/t")"; fi

code=$(curl -s -o "$TMP/e" -w '%{http_code}' --max-time 10 "$URL/v1/chat/completions" \
  -H 'Content-Type: application/json' --data-binary '{"messages": [')
[ "$code" = 400 ] && grep -q '"invalid_request_error"' "$TMP/e" && pass serve_bad_json_400 || fail serve_bad_json_400 "$code $(cat "$TMP/e")"

turn1='{"role":"system","content":"You are a scribe of the old books, answering in the words of the King James Bible."},{"role":"user","content":"Who made the heaven and the earth?"}'
curl -s --max-time 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":[$turn1],\"max_tokens\":4,\"temperature\":0}" >/dev/null
curl -s --max-time 60 "$URL/v1/chat/completions" -H 'Content-Type: application/json' \
  -d "{\"messages\":[$turn1,{\"role\":\"assistant\",\"content\":\"God.\"},{\"role\":\"user\",\"content\":\"And then?\"}],\"max_tokens\":4,\"temperature\":0}" >"$TMP/p"
cached=$(sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p' "$TMP/p")
if [ -n "$cached" ] && [ "$cached" -ge 20 ]; then pass serve_prompt_cache_second_turn
else fail serve_prompt_cache_second_turn "cached_tokens '$cached': $(head -c 300 "$TMP/p")"; fi

# a seed reproduces a sampled reply on a reused session. Requests 2 and 3
# reuse the cached prompt the same way (only its last token is re-run); the
# first runs it in one chunk, which in bf16 may give slightly different logits.
seeded='{"messages":[{"role":"user","content":"Blessed are"}],"max_tokens":12,"temperature":1,"seed":7}'
for k in 1 2 3; do
  chat_content "$seeded" >"$TMP/seed$k"
done
if [ -s "$TMP/seed2" ] && cmp -s "$TMP/seed2" "$TMP/seed3"; then pass serve_seed_reproducible
else fail serve_seed_reproducible "'$(cat "$TMP/seed2")' vs '$(cat "$TMP/seed3")'"; fi

# continuous batching: two greedy requests in flight together decode in
# shared steps (/metrics counts steps of 2) and each reply equals its reply
# alone (batch invariance). Prompts that share no cached prefix with each other.
# Both are started together and generate 64 tokens, so they overlap even when
# one client process starts late on a busy machine (16 tokens of the demo
# model could finish before the other request arrived).
req_a='{"messages":[{"role":"user","content":"The LORD is my shepherd"}],"max_tokens":64,"temperature":0}'
req_b='{"messages":[{"role":"user","content":"Let there be light"}],"max_tokens":64,"temperature":0}'
chat_content "$req_a" >"$TMP/solo_a"
chat_content "$req_b" >"$TMP/solo_b"
# The pair may still miss each other on a loaded machine (a reply ends at
# its end-of-sequence token after ~20 steps): up to three tries; the last
# try's replies are the ones compared with the solo replies below.
for try in 1 2 3; do
  curl -s --max-time 60 "$URL/metrics" >"$TMP/m0"
  chat_content "$req_a" >"$TMP/pair_a" &
  pa=$!
  chat_content "$req_b" >"$TMP/pair_b" &
  pb=$!
  wait $pa $pb
  curl -s --max-time 60 "$URL/metrics" >"$TMP/m1"
  two0=$(metric 'petrel_batch_size_bucket{le="2"}' "$TMP/m0")
  one0=$(metric 'petrel_batch_size_bucket{le="1"}' "$TMP/m0")
  two1=$(metric 'petrel_batch_size_bucket{le="2"}' "$TMP/m1")
  one1=$(metric 'petrel_batch_size_bucket{le="1"}' "$TMP/m1")
  [ -n "$two1" ] && [ $((two1 - one1)) -gt $((two0 - one0)) ] && break
done
if [ -n "$two1" ] && [ $((two1 - one1)) -gt $((two0 - one0)) ]; then pass serve_batch_metrics
else fail serve_batch_metrics "steps of 2 before ($two0-$one0) after ($two1-$one1): $(grep batch_size "$TMP/m1" | head -c 400)"; fi
if [ -s "$TMP/solo_a" ] && cmp -s "$TMP/solo_a" "$TMP/pair_a" && cmp -s "$TMP/solo_b" "$TMP/pair_b"; then
  pass serve_batch_invariant
else fail serve_batch_invariant "solo '$(cat "$TMP/solo_a")' / '$(cat "$TMP/solo_b")' batched '$(cat "$TMP/pair_a")' / '$(cat "$TMP/pair_b")'"; fi

# prompt rows: two fresh prompts run together (their prompts as rows of
# shared steps, neither in the prompt cache), then each alone (its prefix now
# cached, the rest run again): the replies must be identical, and /metrics
# must count the prompt rows
req_c='{"messages":[{"role":"user","content":"And God said unto Noah"}],"max_tokens":12,"temperature":0}'
req_d='{"messages":[{"role":"user","content":"Blessed are the meek"}],"max_tokens":12,"temperature":0}'
rows0=$(metric 'petrel_prompt_rows_total' "$TMP/m1")
chat_content "$req_c" >"$TMP/pair_c" &
pc=$!
chat_content "$req_d" >"$TMP/pair_d"
wait $pc
chat_content "$req_c" >"$TMP/solo_c"
chat_content "$req_d" >"$TMP/solo_d"
curl -s --max-time 60 "$URL/metrics" >"$TMP/m2"
rows1=$(metric 'petrel_prompt_rows_total' "$TMP/m2")
if [ -n "$rows1" ] && [ -n "$rows0" ] && [ "$rows1" -gt $((rows0 + 10)) ]; then pass serve_prompt_rows_metrics
else fail serve_prompt_rows_metrics "petrel_prompt_rows_total before '$rows0' after '$rows1'"; fi
if [ -s "$TMP/solo_c" ] && cmp -s "$TMP/solo_c" "$TMP/pair_c" && cmp -s "$TMP/solo_d" "$TMP/pair_d"; then
  pass serve_prompt_rows_invariant
else fail serve_prompt_rows_invariant "together '$(cat "$TMP/pair_c")' / '$(cat "$TMP/pair_d")' alone '$(cat "$TMP/solo_c")' / '$(cat "$TMP/solo_d")'"; fi

kill -TERM $PID
wait $PID; rc=$?
[ $rc -eq 0 ] && pass serve_sigterm_exit_0 || fail serve_sigterm_exit_0 "exit $rc: $(tail -c 300 "$TMP/serve.err")"
