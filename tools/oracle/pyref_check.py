#!/usr/bin/env python3
"""Independent check of committed goldens: a pure-Python (no numpy/torch)
forward pass of every fixture family (Llama/Qwen2/Qwen3/Qwen3-MoE/MiniCPM,
Gemma 2/3/4, Qwen3.5 with the sequential delta-rule recurrence), written from
the formulas in architectures.md, compared with the fp32 logits transformers
recorded.

  python3 tools/oracle/pyref_check.py [--qkv] [fixture ...]   (default: every fixture)

--qkv also recomputes the llama fixture's quantized-KV scenarios (~1 minute).

Reads the committed model.safetensors (bf16, or MLX packed codes, which it
dequantizes with mlxq.py), runs prompt 1 (Gemma, Qwen3.5: prompt 3, longer
than the sliding window) in double precision and prints max |logit
difference| / max |logit|.  Exits 1 if any fixture exceeds 1e-4.  What it is
not: fast (seconds per fixture), or a reference for quantized KV.
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
            p = dict(q, **q[base]) if isinstance(q.get(base), dict) else q
            bits, gs = p["bits"], p["group_size"]
            words = rows(t[name])
            sc, bi = rows(t[base + ".scales"]), rows(t[base + ".biases"])
            ncol = len(sc[0]) * gs
            w[name] = mlxq.dequantize_rows_py(words, sc, bi, bits, gs, ncol)
        elif len(sv[0]) >= 2:
            w[name] = rows(sv)  # 3-D expert tensors: [E * out] rows of `in`
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


def forward_gemma4(d, prompt):
    """Gemma 4 text (or the gemma4 wrapper's text_config): plain-w norms, v_norm
    without scale, attention scale 1, proportional RoPE and global_head_dim on
    full layers, K=V on full layers when attention_k_eq_v, KV sharing,
    double-wide MLP on shared layers, per-layer inputs, MoE beside the dense
    MLP, layer_scalar, final soft-cap."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    tc = cfg.get("text_config", cfg)
    w = load_weights(d, cfg)
    pre = "model."
    for cand in ("model.language_model.", "language_model.model."):  # HF wrapper, MLX-community wrapper
        if cand + "embed_tokens.weight" in w:
            pre = cand
    H, nh, L = tc["hidden_size"], tc["num_attention_heads"], tc["num_hidden_layers"]
    eps, W, types = tc["rms_norm_eps"], tc["sliding_window"], tc["layer_types"]
    rp = tc["rope_parameters"]
    first_shared = L - (tc.get("num_kv_shared_layers") or 0)
    ple_dim = tc.get("hidden_size_per_layer_input") or 0

    def hd_of(lt):
        return tc["global_head_dim"] if lt == "full_attention" and tc.get("global_head_dim") else tc["head_dim"]

    def nkv_of(lt):
        if lt == "full_attention" and tc.get("attention_k_eq_v"):
            return tc["num_global_key_value_heads"]
        return tc["num_key_value_heads"]

    invs = {}
    for lt in set(types):
        r, hd = rp[lt], hd_of(lt)
        inv = [1.0 / r["rope_theta"] ** (2 * i / hd) for i in range(hd // 2)]
        if r.get("rope_type") == "proportional":
            n_rot = int(r["partial_rotary_factor"] * hd // 2)
            inv = [v if i < n_rot else 0.0 for i, v in enumerate(inv)]
            inv = [v / r.get("factor", 1.0) for v in inv]
        invs[lt] = inv
    g = goldfile.read(os.path.join(d, "golden.bin"))
    _, sh, b = g["prompt.%d.ids" % prompt]
    ids = struct.unpack("<%di" % sh[0], b)
    T = len(ids)
    E = w[pre + "embed_tokens.weight"]
    xs = [[v * math.sqrt(H) for v in E[i]] for i in ids]
    if ple_dim:
        P = w[pre + "embed_tokens_per_layer.weight"]
        ple = []
        for t, i in enumerate(ids):
            tok = [v * math.sqrt(ple_dim) for v in P[i]]
            proj = [v * H ** -0.5 for v in matvec(w[pre + "per_layer_model_projection.weight"], xs[t])]
            per = []
            for l in range(L):
                c = rmsnorm(proj[l * ple_dim:(l + 1) * ple_dim], w[pre + "per_layer_projection_norm.weight"], eps)
                per.append([(a + b) * 2 ** -0.5 for a, b in zip(c, tok[l * ple_dim:(l + 1) * ple_dim])])
            ple.append(per)
    shared = {}
    for l in range(L):
        p = pre + "layers.%d." % l
        lt = types[l]
        hd, nkv = hd_of(lt), nkv_of(lt)
        qs = []
        ks, vs = [], []
        for t in range(T):
            h = rmsnorm(xs[t], w[p + "input_layernorm.weight"], eps)
            q = matvec(w[p + "self_attn.q_proj.weight"], h)
            qs.append([rope(rmsnorm(q[j * hd:(j + 1) * hd], w[p + "self_attn.q_norm.weight"], eps), t, invs[lt])
                       for j in range(nh)])
            if l < first_shared:
                k = matvec(w[p + "self_attn.k_proj.weight"], h)
                v = matvec(w[p + "self_attn.v_proj.weight"], h) if p + "self_attn.v_proj.weight" in w else k
                ks.append([rope(rmsnorm(k[j * hd:(j + 1) * hd], w[p + "self_attn.k_norm.weight"], eps), t, invs[lt])
                           for j in range(nkv)])
                vs.append([rmsnorm(v[j * hd:(j + 1) * hd], [1.0] * hd, eps) for j in range(nkv)])
        if l < first_shared:
            shared[lt] = (ks, vs)  # the last non-shared layer of each type wins
        else:
            ks, vs = shared[lt]
            nkv = len(ks[0])
        new = []
        for t in range(T):
            lo = max(0, t - W + 1) if lt == "sliding_attention" else 0
            o = []
            for j in range(nh):
                kv = j // (nh // nkv)
                sc = [sum(a * b for a, b in zip(qs[t][j], ks[u][kv])) for u in range(lo, t + 1)]
                m = max(sc)
                e = [math.exp(s - m) for s in sc]
                z = sum(e)
                o += [sum(e[u - lo] / z * vs[u][kv][i] for u in range(lo, t + 1)) for i in range(hd)]
            a = rmsnorm(matvec(w[p + "self_attn.o_proj.weight"], o), w[p + "post_attention_layernorm.weight"], eps)
            x = [xv + av for xv, av in zip(xs[t], a)]
            hm = rmsnorm(x, w[p + "pre_feedforward_layernorm.weight"], eps)
            gt, up = matvec(w[p + "mlp.gate_proj.weight"], hm), matvec(w[p + "mlp.up_proj.weight"], hm)
            y = matvec(w[p + "mlp.down_proj.weight"], [gelu_tanh(a) * b for a, b in zip(gt, up)])
            if p + "router.proj.weight" in w:
                y1 = rmsnorm(y, w[p + "post_feedforward_layernorm_1.weight"], eps)
                zr = [v * s * H ** -0.5 for v, s in zip(rmsnorm(x, [1.0] * H, eps), w[p + "router.scale"])]
                sc = matvec(w[p + "router.proj.weight"], zr)
                m = max(sc)
                e = [math.exp(v - m) for v in sc]
                prob = [v / sum(e) for v in e]
                top = sorted(range(len(prob)), key=lambda i: -prob[i])[:tc["top_k_experts"]]
                tot = sum(prob[i] for i in top)
                x2 = rmsnorm(x, w[p + "pre_feedforward_layernorm_2.weight"], eps)
                I = tc["moe_intermediate_size"]
                y2 = [0.0] * H
                for i in top:
                    if p + "experts.gate_up_proj" in w:  # HF: fused [E, 2I, H], gate rows first
                        GU, DN = w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
                        Wg, Wu = GU[i * 2 * I:i * 2 * I + I], GU[i * 2 * I + I:(i + 1) * 2 * I]
                    else:  # MLX: experts.switch_glu.{gate,up,down}_proj stacked [E, out, in]
                        sg = p + "experts.switch_glu."
                        Wg = w[sg + "gate_proj.weight"][i * I:(i + 1) * I]
                        Wu = w[sg + "up_proj.weight"][i * I:(i + 1) * I]
                        DN = w[sg + "down_proj.weight"]
                    gg, uu = matvec(Wg, x2), matvec(Wu, x2)
                    ye = matvec(DN[i * H:(i + 1) * H], [gelu_tanh(a) * b for a, b in zip(gg, uu)])
                    wt = prob[i] / tot * w[p + "router.per_expert_scale"][i]
                    y2 = [a + wt * b for a, b in zip(y2, ye)]
                y2 = rmsnorm(y2, w[p + "post_feedforward_layernorm_2.weight"], eps)
                y = [a + b for a, b in zip(y1, y2)]
            y = rmsnorm(y, w[p + "post_feedforward_layernorm.weight"], eps)
            x = [a + b for a, b in zip(x, y)]
            if ple_dim:
                gte = [gelu_tanh(v) for v in matvec(w[p + "per_layer_input_gate.weight"], x)]
                pp = matvec(w[p + "per_layer_projection.weight"], [a * b for a, b in zip(gte, ple[t][l])])
                pp = rmsnorm(pp, w[p + "post_per_layer_input_norm.weight"], eps)
                x = [a + b for a, b in zip(x, pp)]
            new.append([v * w[p + "layer_scalar"][0] for v in x])
        xs = new
    cap = tc.get("final_logit_softcapping")
    logits = [matvec(E, rmsnorm(x, w[pre + "norm.weight"], eps)) for x in xs]
    if cap:
        logits = [[cap * math.tanh(v / cap) for v in row] for row in logits]
    _, sh, b = g["prompt.%d.logits.f32" % prompt]
    ref = struct.unpack("<%df" % (sh[0] * sh[1]), b)
    got = [v for row in logits for v in row]
    mx = max(abs(v) for v in ref)
    return max(abs(a - b) for a, b in zip(got, ref)) / mx


def forward_qwen35(d, prompt):
    """Qwen3.5 text: (1+w) norms; gated DeltaNet layers by the sequential
    recurrence (architectures.md 9.2); gated full attention with partial RoPE.
    Also the MLX-community layout (the multimodal wrapper's text_config,
    language_model.model.* names, conv1d [C, K, 1], norms with the +1 folded
    in) and Qwen3.5-MoE (routed experts stored fused or per expert, plus the
    shared expert with its sigmoid gate)."""
    top = json.load(open(os.path.join(d, "config.json")))
    w = load_weights(d, top)
    cfg = top.get("text_config", top)
    for name in list(w):
        if name.startswith("language_model."):
            w[name[len("language_model."):]] = w.pop(name)
    mlx = False
    for name in list(w):
        if name.endswith("conv1d.weight") and len(w[name][0]) == 1:  # MLX [C, K, 1]: rows of one value
            Kc = cfg["linear_conv_kernel_dim"]
            flat = [r[0] for r in w[name]]
            w[name] = [flat[i * Kc:(i + 1) * Kc] for i in range(len(flat) // Kc)]
            mlx = True
    nrm = rmsnorm if mlx else rmsnorm1p  # folded norms are plain w

    def ffn(p, h):
        if p + "mlp.gate.weight" not in w:
            return swiglu(w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"], h)
        r = matvec(w[p + "mlp.gate.weight"], h)
        E, k = len(r), cfg["num_experts_per_tok"]
        m = max(r)
        e = [math.exp(v - m) for v in r]
        prob = [v / sum(e) for v in e]
        topk = sorted(range(E), key=lambda i: -prob[i])[:k]
        tot = sum(prob[i] for i in topk)  # Qwen3.5-MoE always renormalizes the top-k
        out = [0.0] * len(h)
        for i in topk:
            if p + "mlp.experts.gate_up_proj" in w:  # fused [E, 2I, H] / [E, H, I]
                gu, dn = w[p + "mlp.experts.gate_up_proj"], w[p + "mlp.experts.down_proj"]
                I2, Hd = len(gu) // E, len(dn) // E
                Wg, Wu, Wd = gu[i * I2:i * I2 + I2 // 2], gu[i * I2 + I2 // 2:(i + 1) * I2], dn[i * Hd:(i + 1) * Hd]
            elif p + "mlp.switch_mlp.gate_proj.weight" in w:  # MLX stacked
                G, U, D = (w[p + "mlp.switch_mlp.%s_proj.weight" % n] for n in ("gate", "up", "down"))
                I, Hd = len(G) // E, len(D) // E
                Wg, Wu, Wd = G[i * I:(i + 1) * I], U[i * I:(i + 1) * I], D[i * Hd:(i + 1) * Hd]
            else:
                q = p + "mlp.experts.%d." % i
                Wg, Wu, Wd = w[q + "gate_proj.weight"], w[q + "up_proj.weight"], w[q + "down_proj.weight"]
            y = swiglu(Wg, Wu, Wd, h)
            out = [a + prob[i] / tot * b for a, b in zip(out, y)]
        if p + "mlp.shared_expert_gate.weight" in w:
            sg = 1 / (1 + math.exp(-matvec(w[p + "mlp.shared_expert_gate.weight"], h)[0]))
            y = swiglu(*(w[p + "mlp.shared_expert.%s_proj.weight" % n] for n in ("gate", "up", "down")), h)
            out = [a + sg * b for a, b in zip(out, y)]
        return out
    H, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    rp = cfg["rope_parameters"]
    rdim = int(hd * rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0)))
    inv = [1.0 / rp["rope_theta"] ** (2 * i / rdim) for i in range(rdim // 2)]
    g = goldfile.read(os.path.join(d, "golden.bin"))
    _, sh, b = g["prompt.%d.ids" % prompt]
    ids = struct.unpack("<%di" % sh[0], b)
    T = len(ids)
    xs = [list(w["model.embed_tokens.weight"][i]) for i in ids]

    def silu(z):
        return z / (1 + math.exp(-z))

    def l2n(x):
        r = 1.0 / math.sqrt(sum(v * v for v in x) + 1e-6)
        return [v * r for v in x]
    for l in range(L):
        p = "model.layers.%d." % l
        hs = [nrm(x, w[p + "input_layernorm.weight"], eps) for x in xs]
        outs = []
        if cfg["layer_types"][l] == "linear_attention":
            a = p + "linear_attn."
            mixed = [matvec(w[a + "in_proj_qkv.weight"], h) for h in hs]
            conv = w[a + "conv1d.weight"]  # [C rows of K]
            C = len(conv)
            S = [[[0.0] * Dv for _ in range(Dk)] for _ in range(Hv)]
            A = [math.exp(v) for v in w[a + "A_log"]]
            for t in range(T):
                y = []
                for c in range(C):
                    acc = 0.0
                    for j in range(K):
                        src = t - (K - 1) + j
                        if src >= 0:
                            acc += conv[c][j] * mixed[src][c]
                    y.append(silu(acc))
                q, k, v = y[:Hk * Dk], y[Hk * Dk:2 * Hk * Dk], y[2 * Hk * Dk:]
                z = matvec(w[a + "in_proj_z.weight"], hs[t])
                bb = matvec(w[a + "in_proj_b.weight"], hs[t])
                aa = matvec(w[a + "in_proj_a.weight"], hs[t])
                o_all = []
                for hv in range(Hv):
                    kh = hv // (Hv // Hk)
                    qv = [x * Dk ** -0.5 for x in l2n(q[kh * Dk:(kh + 1) * Dk])]
                    kv = l2n(k[kh * Dk:(kh + 1) * Dk])
                    vv = v[hv * Dv:(hv + 1) * Dv]
                    beta = 1 / (1 + math.exp(-bb[hv]))
                    sp = aa[hv] + w[a + "dt_bias"][hv]
                    sp = sp + math.log1p(math.exp(-sp)) if sp > 0 else math.log1p(math.exp(sp))
                    alpha = math.exp(-A[hv] * sp)
                    St = S[hv]
                    for i in range(Dk):
                        for j in range(Dv):
                            St[i][j] *= alpha
                    m = [sum(St[i][j] * kv[i] for i in range(Dk)) for j in range(Dv)]
                    dl = [beta * (vv[j] - m[j]) for j in range(Dv)]
                    for i in range(Dk):
                        for j in range(Dv):
                            St[i][j] += kv[i] * dl[j]
                    o = [sum(St[i][j] * qv[i] for i in range(Dk)) for j in range(Dv)]
                    o = rmsnorm(o, w[a + "norm.weight"], eps)
                    o_all += [ov * silu(zv) for ov, zv in zip(o, z[hv * Dv:(hv + 1) * Dv])]
                outs.append(matvec(w[a + "out_proj.weight"], o_all))
        else:
            a = p + "self_attn."
            qs, ks, vs, gates = [], [], [], []
            for t in range(T):
                qg = matvec(w[a + "q_proj.weight"], hs[t])
                k = matvec(w[a + "k_proj.weight"], hs[t])
                v = matvec(w[a + "v_proj.weight"], hs[t])
                qh, gt = [], []
                for j in range(nh):
                    blk = qg[j * 2 * hd:(j + 1) * 2 * hd]
                    qq = nrm(blk[:hd], w[a + "q_norm.weight"], eps)
                    qh.append(rope(qq[:rdim], t, inv) + qq[rdim:])
                    gt += blk[hd:]
                kh = []
                for j in range(nkv):
                    kk = nrm(k[j * hd:(j + 1) * hd], w[a + "k_norm.weight"], eps)
                    kh.append(rope(kk[:rdim], t, inv) + kk[rdim:])
                qs.append(qh)
                ks.append(kh)
                vs.append([v[j * hd:(j + 1) * hd] for j in range(nkv)])
                gates.append(gt)
            for t in range(T):
                o = []
                for j in range(nh):
                    kv = j // (nh // nkv)
                    sc = [sum(x * y for x, y in zip(qs[t][j], ks[u][kv])) / math.sqrt(hd) for u in range(t + 1)]
                    m = max(sc)
                    e = [math.exp(s - m) for s in sc]
                    zz = sum(e)
                    o += [sum(e[u] / zz * vs[u][kv][i] for u in range(t + 1)) for i in range(hd)]
                o = [ov / (1 + math.exp(-gv)) for ov, gv in zip(o, gates[t])]
                outs.append(matvec(w[a + "o_proj.weight"], o))
        xs = [[x + y for x, y in zip(xs[t], outs[t])] for t in range(T)]
        for t in range(T):
            h = nrm(xs[t], w[p + "post_attention_layernorm.weight"], eps)
            xs[t] = [x + y for x, y in zip(xs[t], ffn(p, h))]
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    logits = [matvec(head, nrm(x, w["model.norm.weight"], eps)) for x in xs]
    _, sh, b = g["prompt.%d.logits.f32" % prompt]
    ref = struct.unpack("<%df" % (sh[0] * sh[1]), b)
    got = [v for row in logits for v in row]
    mx = max(abs(v) for v in ref)
    return max(abs(a - b) for a, b in zip(got, ref)) / mx


def qkv_check(d, s):
    """Quantized-KV scenario s of the llama fixture, recomputed in pure Python
    (chunked prefill, whole-cache conversion after a chunk or step once the
    cache holds >= start rows, rows quantized on write afterwards, attention
    over dequantized rows).  Returns (max |d| / max |logit| over the prompt
    logits, greedy tokens equal).  A code could flip where double-precision K/V
    sit on a rounding boundary that fp32 K/V do not; none does in the committed
    scenarios (agreement ~4e-7), while quantizing the first chunk too (a wrong
    conversion rule) shows as 5e-3 at 8 bits and 8e-2 at 4 bits."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    w = load_weights(d, cfg)
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or H // nh
    eps, L = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
    inv = inv_freqs(cfg, hd)
    g = goldfile.read(os.path.join(d, "golden.bin"))

    def arr(name, fmt):
        _, sh, b = g[name]
        n = 1
        for x in sh:
            n *= x
        return sh, struct.unpack("<%d%s" % (n, fmt), b)
    _, (bits_label, gs, chunk, start) = arr("qkv.%d.params" % s, "i")
    _, layer_bits = arr("qkv.%d.layer_bits" % s, "i")
    _, ids = arr("prompt.3.ids", "i")
    (npos, V), ref = arr("qkv.%d.prompt_logits" % s, "f")
    _, ref_greedy = arr("qkv.%d.greedy" % s, "i")

    def fq(row, bits):
        row = [mlxq.f32(v) for v in row]
        wd, sc, bi = mlxq.quantize_rows_py([row], bits, gs, out_dtype="f32")
        return mlxq.dequantize_rows_py(wd, sc, bi, bits, gs, len(row))[0]
    cache = [{"k": [], "v": [], "q": False} for _ in range(L)]  # k/v: list over positions of [nkv][hd]
    E = w["model.embed_tokens.weight"]

    def run(tokens, pos0):
        xs = [list(E[i]) for i in tokens]
        T = len(tokens)
        for l in range(L):
            p = "model.layers.%d." % l
            c = cache[l]
            qs = []
            for t in range(T):
                h = rmsnorm(xs[t], w[p + "input_layernorm.weight"], eps)
                q, k, v = (matvec(w[p + "self_attn.%s_proj.weight" % n], h) for n in "qkv")
                qs.append([rope(q[j * hd:(j + 1) * hd], pos0 + t, inv) for j in range(nh)])
                kh = [rope(k[j * hd:(j + 1) * hd], pos0 + t, inv) for j in range(nkv)]
                vh = [v[j * hd:(j + 1) * hd] for j in range(nkv)]
                if c["q"]:
                    kh = [fq(x, layer_bits[l]) for x in kh]
                    vh = [fq(x, layer_bits[l]) for x in vh]
                c["k"].append(kh)
                c["v"].append(vh)
            for t in range(T):
                o = []
                for j in range(nh):
                    kv = j // (nh // nkv)
                    n = pos0 + t + 1
                    sc = [sum(a * b for a, b in zip(qs[t][j], c["k"][u][kv])) / math.sqrt(hd) for u in range(n)]
                    m = max(sc)
                    e = [math.exp(x - m) for x in sc]
                    z = sum(e)
                    o += [sum(e[u] / z * c["v"][u][kv][i] for u in range(n)) for i in range(hd)]
                a = matvec(w[p + "self_attn.o_proj.weight"], o)
                xs[t] = [x + y for x, y in zip(xs[t], a)]
                h = rmsnorm(xs[t], w[p + "post_attention_layernorm.weight"], eps)
                dn = swiglu(w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"], w[p + "mlp.down_proj.weight"], h)
                xs[t] = [x + y for x, y in zip(xs[t], dn)]
        return [matvec(E, rmsnorm(x, w["model.norm.weight"], eps)) for x in xs]

    def convert():
        for l, c in enumerate(cache):
            if layer_bits[l] and not c["q"] and len(c["k"]) >= start:
                c["k"] = [[fq(x, layer_bits[l]) for x in row] for row in c["k"]]
                c["v"] = [[fq(x, layer_bits[l]) for x in row] for row in c["v"]]
                c["q"] = True
    logits = []
    for s0 in range(0, len(ids), chunk):
        logits += run(ids[s0:s0 + chunk], s0)
        convert()
    got = [v for row in logits for v in row]
    mx = max(abs(v) for v in ref)
    rel = max(abs(a - b) for a, b in zip(got, ref)) / mx
    toks = [max(range(V), key=lambda i: logits[-1][i])]
    pos = len(ids)
    while len(toks) < len(ref_greedy):
        lg = run([toks[-1]], pos)[0]
        convert()
        toks.append(max(range(V), key=lambda i: lg[i]))
        pos += 1
    return rel, tuple(toks) == tuple(ref_greedy)


def main():
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    names = [a for a in sys.argv[1:] if not a.startswith("--")] or ["llama", "qwen2", "qwen3", "qwen3_moe", "minicpm", "llama_mlx_q4", "llama_mlx_q8",
                             "llama_mlx_mixed_3_6", "qwen3_moe_mlx_q4", "gemma2", "gemma3_text", "gemma4_dense",
                             "gemma4_e", "gemma4_moe", "gemma4_mm", "gemma4_moe_mlx_q4", "qwen3_5_text",
                             "qwen3_5_mlx_q4", "qwen3_5_moe"]
    bad = 0
    for n in names:
        d = os.path.join(ROOT, "tests", "fixtures", n)
        # Gemma: prompt 3 (44 ids), longer than the sliding window of 16.
        if n.startswith("qwen3_5"):
            r = forward_qwen35(d, 3)
        elif n.startswith("gemma4"):
            r = forward_gemma4(d, 3)
        elif n.startswith("gemma"):
            r = forward_gemma(d, 3)
        else:
            r = forward(d)
        print("%-22s max|d|/max|logit| = %.2e" % (n, r))
        bad += r > 1e-4
        if n == "llama" and "--qkv" in flags:
            for sc in range(4):
                rel, same = qkv_check(d, sc)
                print("%-22s max|d|/max|logit| = %.2e, greedy %s" % ("  qkv scenario %d" % sc, rel,
                                                                    "equal" if same else "DIFFERENT"))
                bad += rel > 1e-4 or not same
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
