#!/usr/bin/env python3
"""Writes the tiny hand-built model directories under tests/fixtures/format/.

Each is a valid checkpoint of one family in one layout (Hugging Face or MLX
naming), with random bf16 weights: enough for `petrel inspect`, the model
spec tests and `petrel quantize` round trips, not for generating text.
Standard library only. Run from the repository root:

    python3 tools/make_format_fixtures.py
"""
import json
import os
import struct

OUT = "tests/fixtures/format"

V, H, I, NH, NKV, HD, L = 64, 32, 64, 2, 1, 16, 2


class Rng:
    def __init__(self, seed):
        self.s = seed

    def next(self):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        return ((self.s >> 33) / float(1 << 31)) * 2.0 - 1.0


def bf16_bytes(vals):
    out = bytearray()
    for v in vals:
        u = struct.unpack("<I", struct.pack("<f", v))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


def f32_bytes(vals):
    return b"".join(struct.pack("<f", v) for v in vals)


def save(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape, data in tensors:
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in tensors:
            f.write(t[3])


class Model:
    def __init__(self, seed):
        self.rng = Rng(seed)
        self.t = []

    def w(self, name, *shape, scale=0.1, ones=False, dtype="BF16"):
        n = 1
        for d in shape:
            n *= d
        vals = [1.0 if ones else self.rng.next() * scale for _ in range(n)]
        data = bf16_bytes(vals) if dtype == "BF16" else f32_bytes(vals)
        self.t.append((name, dtype, shape, data))

    def write(self, d, config, extra=None):
        os.makedirs(d, exist_ok=True)
        save(os.path.join(d, "model.safetensors"), self.t, {"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        for name, obj in (extra or {}).items():
            with open(os.path.join(d, name), "w") as f:
                json.dump(obj, f, indent=2)


def base_cfg(mt, **kw):
    c = {"model_type": mt, "vocab_size": V, "hidden_size": H, "intermediate_size": I, "num_hidden_layers": L,
         "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD, "rms_norm_eps": 1e-6,
         "max_position_embeddings": 256, "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2,
         "torch_dtype": "bfloat16"}
    c.update(kw)
    return c


def attn(m, p, qk_norm=False, bias=False, hd=HD, nkv=NKV, q_mult=1, kv=True, v=True):
    m.w(p + "self_attn.q_proj.weight", NH * hd * q_mult, H)
    if kv:
        m.w(p + "self_attn.k_proj.weight", nkv * hd, H)
        if v:
            m.w(p + "self_attn.v_proj.weight", nkv * hd, H)
    m.w(p + "self_attn.o_proj.weight", H, NH * hd)
    if bias:
        m.w(p + "self_attn.q_proj.bias", NH * hd)
        m.w(p + "self_attn.k_proj.bias", nkv * hd)
        m.w(p + "self_attn.v_proj.bias", nkv * hd)
    if qk_norm:
        m.w(p + "self_attn.q_norm.weight", hd, ones=True)
        if kv:
            m.w(p + "self_attn.k_norm.weight", hd, ones=True)


def mlp(m, p, inter=I):
    m.w(p + "mlp.gate_proj.weight", inter, H)
    m.w(p + "mlp.up_proj.weight", inter, H)
    m.w(p + "mlp.down_proj.weight", H, inter)


def norms(m, p, sandwich=False, zero=False):
    names = ["input_layernorm", "post_attention_layernorm"]
    if sandwich:
        names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for n in names:
        m.w(p + n + ".weight", H, ones=not zero, scale=0.01)


TOK_CFG = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True,
           "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
GEN_CFG = {"eos_token_id": [2], "temperature": 0.7, "top_p": 0.9}


def llama():
    m = Model(1)
    m.w("model.embed_tokens.weight", V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        norms(m, p)
        attn(m, p)
        mlp(m, p)
    m.w("model.norm.weight", H, ones=True)
    cfg = base_cfg("llama", tie_word_embeddings=True,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 128})
    m.write(f"{OUT}/llama", cfg, {"tokenizer_config.json": TOK_CFG, "generation_config.json": GEN_CFG})


def qwen2():
    m = Model(2)
    m.w("model.embed_tokens.weight", V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        norms(m, p)
        attn(m, p, bias=True)
        mlp(m, p)
    m.w("model.norm.weight", H, ones=True)
    m.w("lm_head.weight", V, H)
    m.write(f"{OUT}/qwen2", base_cfg("qwen2", tie_word_embeddings=False))


def qwen3_moe():
    m = Model(3)
    E, MI = 4, 16
    m.w("model.embed_tokens.weight", V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        norms(m, p)
        attn(m, p, qk_norm=True)
        m.w(p + "mlp.gate.weight", E, H)
        for e in range(E):
            m.w(p + f"mlp.experts.{e}.gate_proj.weight", MI, H)
            m.w(p + f"mlp.experts.{e}.up_proj.weight", MI, H)
            m.w(p + f"mlp.experts.{e}.down_proj.weight", H, MI)
    m.w("model.norm.weight", H, ones=True)
    m.w("lm_head.weight", V, H)
    m.write(f"{OUT}/qwen3_moe", base_cfg("qwen3_moe", tie_word_embeddings=False, num_experts=E,
                                         num_experts_per_tok=2, moe_intermediate_size=MI, norm_topk_prob=True))


def gemma3():
    m = Model(4)
    pre = "model.language_model."
    m.w(pre + "embed_tokens.weight", V, H)
    for i in range(L):
        p = f"{pre}layers.{i}."
        norms(m, p, sandwich=True, zero=True)
        attn(m, p, qk_norm=True)
        mlp(m, p)
    m.w(pre + "norm.weight", H, scale=0.01)
    m.w("model.vision_tower.vision_model.embeddings.patch_embedding.weight", 4, 3)
    m.w("model.multi_modal_projector.mm_input_projection_weight", 3, H)
    text = base_cfg("gemma3_text", sliding_window=8, query_pre_attn_scalar=HD,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                     "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                        "rope_theta": 1000000.0}})
    del text["rope_theta"]
    cfg = {"model_type": "gemma3", "text_config": text, "vision_config": {"model_type": "siglip_vision_model"},
           "eos_token_id": [1, 106], "tie_word_embeddings": True}
    m.write(f"{OUT}/gemma3", cfg)


def gemma4_mlx():
    """MLX layout (language_model.model.*), PLE, KV sharing, double-wide MLP."""
    m = Model(5)
    P, GHD = 8, 32
    pre = "language_model.model."
    types = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    nl = len(types)
    m.w(pre + "embed_tokens.weight", V, H)
    m.w(pre + "embed_tokens_per_layer.weight", V, nl * P)
    m.w(pre + "per_layer_model_projection.weight", nl * P, H)
    m.w(pre + "per_layer_projection_norm.weight", P, ones=True)
    shared_from = 2
    for i, t in enumerate(types):
        p = f"{pre}layers.{i}."
        hd = GHD if t == "full_attention" else HD
        norms(m, p, sandwich=True)
        attn(m, p, qk_norm=True, hd=hd, kv=i < shared_from)
        mlp(m, p, inter=I * 2 if i >= shared_from else I)
        m.w(p + "per_layer_input_gate.weight", P, H)
        m.w(p + "per_layer_projection.weight", H, P)
        m.w(p + "post_per_layer_input_norm.weight", H, ones=True)
        m.w(p + "layer_scalar", 1, ones=True)
    m.w(pre + "norm.weight", H, ones=True)
    text = base_cfg("gemma4_text", num_hidden_layers=nl, global_head_dim=GHD, sliding_window=8,
                    hidden_size_per_layer_input=P, vocab_size_per_layer_input=V, num_kv_shared_layers=nl - shared_from,
                    use_double_wide_mlp=True, final_logit_softcapping=30.0, layer_types=types,
                    tie_word_embeddings=True,
                    rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                        "rope_theta": 1000000.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    del text["rope_theta"]
    m.write(f"{OUT}/gemma4_mlx", {"model_type": "gemma4", "text_config": text})


def qwen3_5_mlx():
    """MLX layout: language_model.model.*, conv1d [C, K, 1], norms with +1 folded, stacked experts."""
    m = Model(6)
    KH, VH, KD, VD, K = 1, 2, 8, 8, 4
    E, MI, SI = 4, 16, 16
    pre = "language_model.model."
    types = ["linear_attention", "full_attention"]
    m.w(pre + "embed_tokens.weight", V, H)
    for i, t in enumerate(types):
        p = f"{pre}layers.{i}."
        norms(m, p)
        if t == "linear_attention":
            kd, vd = KH * KD, VH * VD
            m.w(p + "linear_attn.in_proj_qkv.weight", 2 * kd + vd, H)
            m.w(p + "linear_attn.in_proj_z.weight", vd, H)
            m.w(p + "linear_attn.in_proj_b.weight", VH, H)
            m.w(p + "linear_attn.in_proj_a.weight", VH, H)
            m.w(p + "linear_attn.conv1d.weight", 2 * kd + vd, K, 1)
            m.w(p + "linear_attn.A_log", VH, dtype="F32")
            m.w(p + "linear_attn.dt_bias", VH, ones=True)
            m.w(p + "linear_attn.norm.weight", VD, ones=True)
            m.w(p + "linear_attn.out_proj.weight", H, vd)
        else:
            attn(m, p, qk_norm=True, q_mult=2)
        m.w(p + "mlp.gate.weight", E, H)
        m.w(p + "mlp.switch_mlp.gate_proj.weight", E, MI, H)
        m.w(p + "mlp.switch_mlp.up_proj.weight", E, MI, H)
        m.w(p + "mlp.switch_mlp.down_proj.weight", E, H, MI)
        m.w(p + "mlp.shared_expert.gate_proj.weight", SI, H)
        m.w(p + "mlp.shared_expert.up_proj.weight", SI, H)
        m.w(p + "mlp.shared_expert.down_proj.weight", H, SI)
        m.w(p + "mlp.shared_expert_gate.weight", 1, H)
    m.w(pre + "norm.weight", H, ones=True)
    m.w("language_model.lm_head.weight", V, H)
    text = base_cfg("qwen3_5_moe_text", linear_num_key_heads=KH, linear_num_value_heads=VH, linear_key_head_dim=KD,
                    linear_value_head_dim=VD, linear_conv_kernel_dim=K, full_attention_interval=2,
                    num_experts=E, num_experts_per_tok=2, moe_intermediate_size=MI,
                    shared_expert_intermediate_size=SI, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": [1, 1, 0]})
    del text["rope_theta"]
    m.write(f"{OUT}/qwen3_5_moe_mlx", {"model_type": "qwen3_5_moe", "text_config": text})


def minicpm():
    m = Model(7)
    m.w("model.embed_tokens.weight", V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        norms(m, p)
        attn(m, p)
        mlp(m, p)
    m.w("model.norm.weight", H, ones=True)
    m.write(f"{OUT}/minicpm", base_cfg("minicpm", tie_word_embeddings=True, scale_emb=12, scale_depth=1.4,
                                       dim_model_base=16))


if __name__ == "__main__":
    for f in (llama, qwen2, qwen3_moe, gemma3, gemma4_mlx, qwen3_5_mlx, minicpm):
        f()
    print("wrote", OUT)
