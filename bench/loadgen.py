"""Load generator for `petrel serve` (python3 standard library only: threads +
http.client, streamed SSE; a measuring harness, not part of petrel).

  loadgen.py --port P --streams N [--tokens 128] [--prompt-len 16] [--vocab V]
             [--host 127.0.0.1] [--seed 1] [--label TEXT] [--verify K] [--verify-full]

Starts N concurrent streamed POST /v1/completions requests at once, each with
its own prompt of --prompt-len random token ids below --vocab (distinct per
stream, so the prompt cache shares nothing), temperature 0, max_tokens
--tokens, stream_options.include_usage. Per stream it records the time to
first token (the first content chunk), the completion tokens (from the usage
chunk) and the time from the first to the last chunk. Prints one line:

  label streams N  agg TOK/s  per-stream median TOK/s (min)  TTFT median/p90/max ms
  mean batch B  (tokens T in W s)

agg = all completion tokens / wall time from the first request to the last
end; per-stream = (tokens - 1) / (last chunk - first chunk) of that stream;
mean batch = the server's petrel_batch_size _sum/_count over the run
(/metrics before and after); where the server reports
petrel_scheduler_seconds_total, a second line gives its turns over the run
and their ms per turn by phase (sample, tokens, step: docs/server.md). A stream that fails or ends without [DONE] makes
the run exit non-zero. --verify K then reruns the first K prompts one at a
time and requires each reply (text) to equal its reply in the batch (batch
invariance end to end; greedy); those K streams get one-token prompts (see
the comment in main) unless --verify-full keeps their whole prompts (a
server that runs prompts of up to 64 tokens as rows of its batched steps
computes every prompt token as it would alone, whatever the chunking).
"""
import argparse
import http.client
import json
import random
import re
import statistics
import sys
import threading
import time


def metrics(host, port):
    c = http.client.HTTPConnection(host, port, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    out = {}
    for k in ("petrel_batch_size_sum", "petrel_batch_size_count", "petrel_scheduler_turns_total"):
        m = re.search(r"^" + k + r"\s+([0-9.e+]+)", text, re.M)
        out[k] = float(m.group(1)) if m else 0.0
    for ph in ("sample", "tokens", "step"):
        m = re.search(r'^petrel_scheduler_seconds_total\{phase="' + ph + r'"\}\s+([0-9.e+]+)', text, re.M)
        out[ph] = float(m.group(1)) if m else 0.0
    return out


def one_stream(host, port, prompt, n_gen, go, res, i):
    r = {"ok": False}
    try:
        c = http.client.HTTPConnection(host, port, timeout=900)
        body = json.dumps({"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        go.wait()
        t0 = time.perf_counter()
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            r["error"] = f"HTTP {resp.status}: {resp.read()[:200]!r}"
            res[i] = r
            return
        first = last = None
        tokens = None
        done = False
        text = []
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            if line.startswith(b"data: [DONE]"):
                done = True
                break
            d = json.loads(line[6:])
            if "error" in d:
                r["error"] = str(d["error"])
                break
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            if d.get("choices") and d["choices"][0].get("text"):
                text.append(d["choices"][0]["text"])
                now = time.perf_counter()
                first = first or now
                last = now
        t1 = time.perf_counter()
        # a reply whose tokens decode to no text (random weights can do that)
        # is complete but has no first-token time: counted, not timed
        r.update(ok=done and tokens is not None, t0=t0, t1=t1, first=first, last=last,
                 tokens=tokens, text="".join(text))
    except Exception as e:  # reported below, the run fails
        r["error"] = repr(e)
    res[i] = r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--streams", type=int, required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--verify", type=int, default=0,
                    help="then rerun the first K prompts one at a time: each reply must equal its reply in the batch")
    ap.add_argument("--verify-full", action="store_true",
                    help="the --verify streams keep their whole prompts (prompt rows make any chunking exact)")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    prompts = [[rnd.randrange(16, a.vocab - 16) for _ in range(a.prompt_len)] for _ in range(a.streams)]
    # the streams that --verify reruns get one-token prompts: a rerun finds
    # its prompt in the server's prompt cache and runs only the last prompt
    # token again, which for a one-token prompt is the very same computation
    # (for longer prompts a different chunking, which may round differently)
    for i in range(0 if a.verify_full else min(a.verify, a.streams)):
        prompts[i] = prompts[i][:1]
    m0 = metrics(a.host, a.port)
    go = threading.Event()
    res = [None] * a.streams
    th = [threading.Thread(target=one_stream, args=(a.host, a.port, prompts[i], a.tokens, go, res, i))
          for i in range(a.streams)]
    for t in th:
        t.start()
    time.sleep(0.2)  # every thread connected and waiting
    go.set()
    for t in th:
        t.join()
    m1 = metrics(a.host, a.port)
    bad = [r for r in res if not r or not r["ok"]]
    if bad:
        print(f"{len(bad)} of {a.streams} streams failed: {bad[0].get('error', bad[0])}", file=sys.stderr)
        sys.exit(1)
    total = sum(r["tokens"] for r in res)
    wall = max(r["t1"] for r in res) - min(r["t0"] for r in res)
    timed = [r for r in res if r["first"] is not None]
    per = [(r["tokens"] - 1) / (r["last"] - r["first"]) for r in timed if r["tokens"] > 1 and r["last"] > r["first"]]
    ttft = sorted((r["first"] - r["t0"]) * 1e3 for r in timed) or [0.0]
    steps = m1["petrel_batch_size_count"] - m0["petrel_batch_size_count"]
    rows = m1["petrel_batch_size_sum"] - m0["petrel_batch_size_sum"]
    out = {
        "label": a.label, "streams": a.streams, "agg_tok_s": total / wall,
        "per_stream_median_tok_s": statistics.median(per) if per else 0.0, "per_stream_min_tok_s": min(per) if per else 0.0,
        "ttft_median_ms": statistics.median(ttft), "ttft_p90_ms": ttft[int(0.9 * (len(ttft) - 1))],
        "ttft_max_ms": ttft[-1], "mean_batch": rows / steps if steps else 0.0, "tokens": total, "wall_s": wall,
        "untimed_streams": len(res) - len(timed),
    }
    # the server's scheduler turns over the run, ms per turn by phase (servers
    # that report petrel_scheduler_seconds_total)
    turns = m1["petrel_scheduler_turns_total"] - m0["petrel_scheduler_turns_total"]
    if turns > 0:
        out["turns"] = turns
        for ph in ("sample", "tokens", "step"):
            out["turn_" + ph + "_ms"] = (m1[ph] - m0[ph]) / turns * 1e3
    print(f"{a.label} streams {a.streams:3d}  agg {out['agg_tok_s']:8.1f} tok/s  per-stream median "
          f"{out['per_stream_median_tok_s']:7.1f} (min {out['per_stream_min_tok_s']:6.1f}) tok/s  TTFT median/p90/max "
          f"{out['ttft_median_ms']:.0f}/{out['ttft_p90_ms']:.0f}/{out['ttft_max_ms']:.0f} ms  mean batch "
          f"{out['mean_batch']:.1f}  ({total} tokens in {wall:.2f} s"
          + (f"; {out['untimed_streams']} replies without text, not timed" if out["untimed_streams"] else "") + ")")
    if "turns" in out:
        print(f"  {out['turns']:.0f} scheduler turns, ms per turn: sample {out['turn_sample_ms']:.3f}  tokens "
              f"{out['turn_tokens_ms']:.3f}  step {out['turn_step_ms']:.3f}")
    print("JSON " + json.dumps(out))
    if a.verify:
        same = 0
        for i in range(min(a.verify, a.streams)):
            alone = [None]
            ev = threading.Event()
            ev.set()
            one_stream(a.host, a.port, prompts[i], a.tokens, ev, alone, 0)
            if alone[0] and alone[0]["ok"] and alone[0]["text"] == res[i]["text"]:
                same += 1
            else:
                print(f"verify: stream {i} differs alone vs batched: {alone[0] and alone[0].get('text', '')[:80]!r} vs "
                      f"{res[i]['text'][:80]!r}", file=sys.stderr)
        print(f"verify: {same} of {min(a.verify, a.streams)} replies identical alone and in the batch of {a.streams}")
        if same != min(a.verify, a.streams):
            sys.exit(1)


if __name__ == "__main__":
    main()
