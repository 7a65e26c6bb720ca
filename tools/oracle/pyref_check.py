#!/usr/bin/env python3
"""Independent check of committed goldens: a pure-Python (no numpy/torch)
forward pass of the llama-family fixtures, written from the formulas in
architectures.md, compared with the fp32 logits transformers recorded.

  python3 tools/oracle/pyref_check.py [fixture ...]   (default: the llama, qwen, minicpm, gemma2, gemma3_text fixtures)

Reads the committed model.safetensors (bf16, or MLX packed codes, which it
dequantizes with mlxq.py), runs the shortest prompt in double precision and
prints max |logit difference| / max |logit| (fp32 rounding in the reference
gives ~1e-6).  Exits 1 if any fixture exceeds 1e-4.  What it is not: a
reference for other families, or fast (seconds per fixture).
"""
import json
import math
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import goldfile  # noqa: E402
import mlxq  # noqa: E402

ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


def read_safetensors(path):
    with open(path, "rb") as f:
        buf = f.read()
    (hl,) = struct.unpack_from("<Q", buf, 0)
    header = json.loads(buf[8:8 + hl])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = buf[8 + hl + a:8 + hl + b]
        dt, shape = info["dtype"], info["shape"]
        if dt == "BF16":
            vals = [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack("<%dH" % (len(raw) // 2), raw)]
        elif dt == "F32":
            vals = list(struct.unpack("<%df" % (len(raw) // 4), raw))
        elif dt == "U32":
            vals = list(struct.unpack("<%dI" % (len(raw) // 4), raw))
        else:
            raise ValueError(dt)
        out[name] = (shape, vals)
    return out


def rows(shape_vals):
    shape, vals = shape_vals
    n = shape[-1]
    return [vals[i * n:(i + 1) * n] for i in range(len(vals) // n)]


def load_weights(d, cfg):
    t = read_safetensors(os.path.join(d, "model.safetensors"))
    q = cfg.get("quantization")
    w = {}
    for name, sv in t.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if q and base and base + ".scales" in t:
            p = q.get(base) if isinstance(q.get(base), dict) else q
            bits, gs = p["bits"], p["group_size"]
            words = rows(t[name])
            sc, bi = rows(t[base + ".scales"]), rows(t[base + ".biases"])
            ncol = len(sc[0]) * gs
            w[name] = mlxq.dequantize_rows_py(words, sc, bi, bits, gs, ncol)
        elif len(sv[0]) == 2:
            w[name] = rows(sv)
        else:
            w[name] = sv[1]
    return w


def matvec(W, x):
    return [sum(a * b for a, b in zip(row, x)) for row in W]


def rmsnorm(x, w, eps):
    r = 1.0 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * r * g for v, g in zip(x, w)]


def inv_freqs(cfg, hd):
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = [1.0 / theta ** (2 * i / hd) for i in range(hd // 2)]
    if rp.get("rope_type") == "longrope":
        # max_position_embeddings == original in the fixture: short factors, attention factor 1
        assert cfg["max_position_embeddings"] <= rp["original_max_position_embeddings"]
        inv = [v / f for v, f in zip(inv, rp["short_factor"])]
    if rp.get("rope_type") == "llama3":
        f, lo, hi, old = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"], rp["original_max_position_embeddings"]
        out = []
        for v in inv:
            wl = 2 * math.pi / v
            if wl < old / hi:
                out.append(v)
            elif wl > old / lo:
                out.append(v / f)
            else:
                s = (old / wl - lo) / (hi - lo)
                out.append((1 - s) * v / f + s * v)
        inv = out
    return inv


def rope(x, pos, inv):
    h = len(x) // 2
    out = list(x)
    for i in range(h):
        c, s = math.cos(pos * inv[i]), math.sin(pos * inv[i])
        out[i] = x[i] * c - x[i + h] * s
        out[i + h] = x[i + h] * c + x[i] * s
    return out


def swiglu(Wg, Wu, Wd, h):
    gt, up = matvec(Wg, h), matvec(Wu, h)
    return matvec(Wd, [gv / (1 + math.exp(-gv)) * uv for gv, uv in zip(gt, up)])


def moe(w, p, h, cfg):
    """Qwen3-MoE: softmax over all experts, top-k, renormalised (norm_topk_prob)."""
    r = matvec(w[p + "mlp.gate.weight"], h)
    m = max(r)
    e = [math.exp(v - m) for v in r]
    z = sum(e)
    prob = [v / z for v in e]
    k = cfg["num_experts_per_tok"]
    top = sorted(range(len(prob)), key=lambda i: -prob[i])[:k]
    tot = sum(prob[i] for i in top) if cfg.get("norm_topk_prob") else 1.0
    out = [0.0] * len(h)
    for i in top:
        if p + "mlp.switch_mlp.gate_proj.weight" in w:  # MLX layout: stacked [E, out, in]
            I = len(w[p + "mlp.switch_mlp.gate_proj.weight"]) // len(prob)
            Hd = len(w[p + "mlp.switch_mlp.down_proj.weight"]) // len(prob)
            Wg = w[p + "mlp.switch_mlp.gate_proj.weight"][i * I:(i + 1) * I]
            Wu = w[p + "mlp.switch_mlp.up_proj.weight"][i * I:(i + 1) * I]
            Wd = w[p + "mlp.switch_mlp.down_proj.weight"][i * Hd:(i + 1) * Hd]
        else:
            q = p + "mlp.experts.%d." % i
            Wg, Wu, Wd = w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"]
        y = swiglu(Wg, Wu, Wd, h)
        out = [a + prob[i] / tot * b for a, b in zip(out, y)]
    return out


def forward(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = load_weights(d, cfg)
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    inv = inv_freqs(cfg, hd)
    qk_norm = "model.layers.0.self_attn.q_norm.weight" in w
    g = goldfile.read(os.path.join(d, "golden.bin"))
    _, sh, b = g["prompt.1.ids"]
    ids = struct.unpack("<%di" % sh[0], b)
    E = w["model.embed_tokens.weight"]
    se = cfg.get("scale_emb", 1.0) if cfg["model_type"] == "minicpm" else 1.0
    rs = cfg["scale_depth"] / math.sqrt(L) if cfg["model_type"] == "minicpm" else 1.0
    ld = H / cfg["dim_model_base"] if cfg["model_type"] == "minicpm" else 1.0
    xs = [[v * se for v in E[i]] for i in ids]
    T = len(ids)
    for l in range(L):
        p = "model.layers.%d." % l
        ks, vs, qs = [], [], []
        for t in range(T):
            h = rmsnorm(xs[t], w[p + "input_layernorm.weight"], eps)
            q = matvec(w[p + "self_attn.q_proj.weight"], h)
            k = matvec(w[p + "self_attn.k_proj.weight"], h)
            v = matvec(w[p + "self_attn.v_proj.weight"], h)
            for nm, vec in (("q", q), ("k", k), ("v", v)):
                bn = p + "self_attn.%s_proj.bias" % nm
                if bn in w:
                    for i in range(len(vec)):
                        vec[i] += w[bn][i]
            qh = [q[j * hd:(j + 1) * hd] for j in range(nh)]
            kh = [k[j * hd:(j + 1) * hd] for j in range(nkv)]
            if qk_norm:
                qh = [rmsnorm(x, w[p + "self_attn.q_norm.weight"], eps) for x in qh]
                kh = [rmsnorm(x, w[p + "self_attn.k_norm.weight"], eps) for x in kh]
            qs.append([rope(x, t, inv) for x in qh])
            ks.append([rope(x, t, inv) for x in kh])
            vs.append([v[j * hd:(j + 1) * hd] for j in range(nkv)])
        for t in range(T):
            o = []
            for j in range(nh):
                kv = j // (nh // nkv)
                sc = [sum(a * b for a, b in zip(qs[t][j], ks[u][kv])) / math.sqrt(hd) for u in range(t + 1)]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                o += [sum(e[u] / z * vs[u][kv][i] for u in range(t + 1)) for i in range(hd)]
            a = matvec(w[p + "self_attn.o_proj.weight"], o)
            xs[t] = [x + y * rs for x, y in zip(xs[t], a)]
        for t in range(T):
            h = rmsnorm(xs[t], w[p + "post_attention_layernorm.weight"], eps)
            if p + "mlp.gate.weight" in w:
                dn = moe(w, p, h, cfg)
            else:
                dn = swiglu(w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"], h)
            xs[t] = [x + y * rs for x, y in zip(xs[t], dn)]
    head = w.get("lm_head.weight", E)
    logits = [matvec(head, [v / ld for v in rmsnorm(x, w["model.norm.weight"], eps)]) for x in xs]
    _, sh, b = g["prompt.1.logits.f32"]
    ref = struct.unpack("<%df" % (sh[0] * sh[1]), b)
    got = [v for row in logits for v in row]
    mx = max(abs(v) for v in ref)
    return max(abs(a - b) for a, b in zip(got, ref)) / mx


def gelu_tanh(z):
    return 0.5 * z * (1 + math.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3)))


def rmsnorm1p(x, w, eps):
    """Gemma 1/2/3 norm: rms(x) * (1 + w)."""
    return rmsnorm(x, [1.0 + g for g in w], eps)


def forward_gemma(d, prompt):
    """Gemma 2 / Gemma 3 text: sandwich (1+w) norms, embeddings x sqrt(H),
    query_pre_attn_scalar, soft-caps, sliding windows, Gemma 3 q/k norms and
    per-layer-type RoPE."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = load_weights(d, cfg)
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, L, W = cfg["rms_norm_eps"], cfg["num_hidden_layers"], cfg["sliding_window"]
    scale = cfg["query_pre_attn_scalar"] ** -0.5
    acap, fcap = cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping")
    rp = cfg["rope_parameters"]
    invs = {}
    for lt in ("sliding_attention", "full_attention"):
        r = rp.get(lt, rp)
        inv = [1.0 / r["rope_theta"] ** (2 * i / hd) for i in range(hd // 2)]
        if r.get("rope_type") == "linear":
            inv = [v / r["factor"] for v in inv]
        invs[lt] = inv
    g = goldfile.read(os.path.join(d, "golden.bin"))
    _, sh, b = g["prompt.%d.ids" % prompt]
    ids = struct.unpack("<%di" % sh[0], b)
    E = w["model.embed_tokens.weight"]
    xs = [[v * math.sqrt(H) for v in E[i]] for i in ids]
    T = len(ids)
    for l in range(L):
        p = "model.layers.%d." % l
        lt = cfg["layer_types"][l]
        qs, ks, vs = [], [], []
        for t in range(T):
            h = rmsnorm1p(xs[t], w[p + "input_layernorm.weight"], eps)
            q, k, v = (matvec(w[p + "self_attn.%s_proj.weight" % n], h) for n in "qkv")
            qh = [q[j * hd:(j + 1) * hd] for j in range(nh)]
            kh = [k[j * hd:(j + 1) * hd] for j in range(nkv)]
            if p + "self_attn.q_norm.weight" in w:
                qh = [rmsnorm1p(x, w[p + "self_attn.q_norm.weight"], eps) for x in qh]
                kh = [rmsnorm1p(x, w[p + "self_attn.k_norm.weight"], eps) for x in kh]
            qs.append([rope(x, t, invs[lt]) for x in qh])
            ks.append([rope(x, t, invs[lt]) for x in kh])
            vs.append([v[j * hd:(j + 1) * hd] for j in range(nkv)])
        new = []
        for t in range(T):
            lo = max(0, t - W + 1) if lt == "sliding_attention" else 0
            o = []
            for j in range(nh):
                kv = j // (nh // nkv)
                sc = [sum(a * b for a, b in zip(qs[t][j], ks[u][kv])) * scale for u in range(lo, t + 1)]
                if acap:
                    sc = [acap * math.tanh(s / acap) for s in sc]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                o += [sum(e[u - lo] / z * vs[u][kv][i] for u in range(lo, t + 1)) for i in range(hd)]
            a = rmsnorm1p(matvec(w[p + "self_attn.o_proj.weight"], o), w[p + "post_attention_layernorm.weight"], eps)
            x = [xv + av for xv, av in zip(xs[t], a)]
            h = rmsnorm1p(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            gt, up = matvec(w[p + "mlp.gate_proj.weight"], h), matvec(w[p + "mlp.up_proj.weight"], h)
            mlp = matvec(w[p + "mlp.down_proj.weight"], [gelu_tanh(a) * b for a, b in zip(gt, up)])
            mlp = rmsnorm1p(mlp, w[p + "post_feedforward_layernorm.weight"], eps)
            new.append([xv + mv for xv, mv in zip(x, mlp)])
        xs = new
    logits = [matvec(E, rmsnorm1p(x, w["model.norm.weight"], eps)) for x in xs]
    if fcap:
        logits = [[fcap * math.tanh(v / fcap) for v in row] for row in logits]
    _, sh, b = g["prompt.%d.logits.f32" % prompt]
    ref = struct.unpack("<%df" % (sh[0] * sh[1]), b)
    got = [v for row in logits for v in row]
    mx = max(abs(v) for v in ref)
    return max(abs(a - b) for a, b in zip(got, ref)) / mx


def main():
    names = sys.argv[1:] or ["llama", "qwen2", "qwen3", "qwen3_moe", "minicpm", "llama_mlx_q4", "llama_mlx_q8",
                             "llama_mlx_mixed_3_6", "qwen3_moe_mlx_q4", "gemma2", "gemma3_text"]
    bad = 0
    for n in names:
        d = os.path.join(ROOT, "tests", "fixtures", n)
        # Gemma: prompt 3 (44 ids), longer than the sliding window of 16.
        r = forward_gemma(d, 3) if n.startswith("gemma") else forward(d)
        print("%-22s max|d|/max|logit| = %.2e" % (n, r))
        bad += r > 1e-4
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
