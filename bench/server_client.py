"""Benchmark client for bench/server_bench.sh (python3 standard library only;
a measuring harness, not part of petrel).

  server_client.py stream PORT PROMPT N_GEN N_PAR
      N_PAR concurrent streamed /v1/completions requests (temperature 0):
      time to first token, tokens/s after the first, aggregate tokens/s.
  server_client.py ab PETREL MODEL THREADS PROMPT N_GEN REPS PORT
      alternates `petrel generate` and one HTTP stream of the same prompt
      REPS times (A B A B, so machine noise hits both) and prints medians.
      PROMPT may hold several prompts separated by '|', used in turn, so
      that consecutive HTTP requests do not share a cached prompt (the
      comparison is then prefill against prefill).
"""
import http.client
import json
import re
import statistics as st
import subprocess
import sys
import threading
import time


def stream_once(port, prompt, n_gen, out):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    first = last = None
    n = 0
    for line in c.getresponse():
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        d = json.loads(line[6:])
        if d["choices"] and d["choices"][0].get("text"):
            now = time.perf_counter()
            n += 1
            first = first or now
            last = now
    if n < 2:
        sys.exit(f"only {n} chunks streamed; pick a PROMPT the model continues for N_GEN tokens")
    out.append((first - t0, n, last - first, t0, last))


def stream(port, prompt, n_gen, n_par):
    res = []
    th = [threading.Thread(target=stream_once, args=(port, prompt, n_gen, res)) for _ in range(n_par)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if len(res) != n_par:
        sys.exit("a stream failed")
    return res


def main():
    if sys.argv[1] == "stream":
        port, prompt, n_gen, n_par = int(sys.argv[2]), sys.argv[3].split("|")[0], int(sys.argv[4]), int(sys.argv[5])
        res = stream(port, prompt, n_gen, n_par)
        total = sum(r[1] for r in res)
        span = max(r[4] for r in res) - min(r[3] for r in res)
        print(f"parallel {n_par}: {total} chunks in {span:.2f} s = {total / span:.1f} tok/s aggregate, "
              f"per stream {sum((r[1] - 1) / r[2] for r in res) / n_par:.1f} tok/s, "
              f"mean first token {sum(r[0] for r in res) / n_par * 1000:.1f} ms")
        return
    petrel, model, threads, prompt, n_gen, reps, port = sys.argv[2:9]
    d_tps, d_ttft, h_tps, h_ttft = [], [], [], []
    prompts = prompt.split("|")
    for r in range(int(reps)):
        prompt = prompts[r % len(prompts)]
        err = subprocess.run([petrel, "generate", "-m", model, "-p", prompt, "--max-tokens", n_gen,
                              "--temp", "0", "-t", threads], capture_output=True, text=True).stderr
        m = re.search(r"generation: (\d+) tokens, ([\d.]+) tok/s \| first token: ([\d.]+) ms", err)
        d_tps.append(float(m.group(2)))
        d_ttft.append(float(m.group(3)))
        ttft, n, dt, _, _ = stream(int(port), prompt, int(n_gen), 1)[0]
        h_ttft.append(ttft * 1000)
        h_tps.append((n - 1) / dt)
        print(f"rep {r}: direct {d_tps[-1]:.1f} tok/s, first token {d_ttft[-1]:.1f} ms | "
              f"http {h_tps[-1]:.1f} tok/s, first token {h_ttft[-1]:.1f} ms")
    md, mh = st.median(d_tps), st.median(h_tps)
    print(f"median of {reps}: direct {md:.1f} tok/s, first token {st.median(d_ttft):.1f} ms | "
          f"http {mh:.1f} tok/s, first token {st.median(h_ttft):.1f} ms")
    # paired statistics: each rep's HTTP run against the direct run just before it
    ratio = st.median(h / d for h, d in zip(h_tps, d_tps))
    delta = st.median(h - d for h, d in zip(h_ttft, d_ttft))
    print(f"paired medians: http/direct tok/s {ratio:.3f}, first-token delta {delta:+.1f} ms")


main()
