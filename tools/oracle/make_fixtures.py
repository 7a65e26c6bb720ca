#!/usr/bin/env python3
"""Builds petrel's oracle fixtures: tiny random checkpoints of every supported
architecture plus golden outputs computed by Hugging Face transformers.

Runs where torch + transformers + tokenizers are installed (the GPU machine;
everything here runs on its CPU).  Usage:

  python3 tools/oracle/make_fixtures.py --text KJV.txt --out DIR [--only a,b]

writes DIR/<fixture>/ for each fixture (config.json, model.safetensors,
tokenizer files, golden.bin, golden.json).  tests/fixtures/README.md describes
the fixtures, the golden format and the exact regeneration procedure.

Reference conventions (DESIGN.md "Numerics and parity tiers"):
  * fp32 goldens: the checkpoint loaded with dtype=float32 and
    attn_implementation="eager", on the CPU.
  * bf16 goldens: the same checkpoint loaded with dtype=bfloat16 (weights and
    activations bf16; transformers keeps RoPE inverse frequencies in fp32).
  * Weights are drawn at random, rounded to bf16, and saved as bf16, so the
    fp32 reference runs on exactly the stored values.
  * Quantized (MLX) fixtures: goldens = transformers on the dequantized weights
    (scale * q + bias in fp32 from the stored bf16 scales and biases).
What it is not: a test; it only records what the reference computes.
"""

import argparse
import copy
import json
import math
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

import mlxq  # noqa: E402
import stio  # noqa: E402
from goldfile import GoldenWriter  # noqa: E402

TOK_VOCAB = 300       # tokenizer size (256 bytes + merges + 3 specials)
VOCAB = 320           # config vocab_size (rows past the tokenizer are padding, as in real models)
GREEDY = 32           # greedy continuation length
WINDOW = 16           # sliding window of the Gemma fixtures (the longest prompt is longer)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID, IM_START_ID, IM_END_ID = 0, 1, 2
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXT_PROMPT = "In the beginning God created the heaven and the earth."

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


# ------------------------------------------------------------------ tokenizer

def build_tokenizer(text_path, out_path, vocab_size):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    with open(text_path, encoding="utf-8") as f:
        lines = [ln.split(" ", 1)[1].strip() if " " in ln else ln.strip() for ln in f]
    tok.train_from_iterator(lines, trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    tok.save(out_path)
    return tok


def write_tokenizer_files(d, tok_json, max_len=256):
    shutil.copy(tok_json, os.path.join(d, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    tc = {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": added,
          "bos_token": None, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
          "chat_template": CHATML, "model_max_length": max_len, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [EOS_ID, IM_END_ID], "pad_token_id": EOS_ID, "do_sample": False}, f, indent=2)


# ------------------------------------------------------------------ fixture specs

COMMON = dict(vocab_size=VOCAB, max_position_embeddings=256, bos_token_id=None, eos_token_id=EOS_ID,
              pad_token_id=EOS_ID)


def spec_list():
    """(name, model_type, description, [kwargs variants tried in order])."""
    S = []
    S.append(("llama", "llama", "Llama 3: llama3 RoPE scaling, tied embeddings, GQA 2:1, head_dim 64", [dict(
        hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})]))
    S.append(("qwen2", "qwen2", "Qwen2: q/k/v bias, untied lm_head", [dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})]))
    S.append(("qwen3", "qwen3", "Qwen3: per-head q/k RMSNorm, head_dim 32 != hidden/heads 16, tied", [dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})]))
    S.append(("qwen3_moe", "qwen3_moe", "Qwen3-MoE: 8 experts, top-2, norm_topk_prob, untied", [dict(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})]))
    S.append(("gemma2", "gemma2", "Gemma 2: (1+w) sandwich norms, attention and final soft-caps (5, 10), "
              "sliding window 16 on even layers, query_pre_attn_scalar 24", [dict(
                  hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  query_pre_attn_scalar=24, attn_logit_softcapping=5.0, final_logit_softcapping=10.0,
                  sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh",
                  layer_types=["sliding_attention", "full_attention"] * 2,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})]))
    g3 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
              query_pre_attn_scalar=32, sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh",
              layer_types=["sliding_attention"] * 5 + ["full_attention"],
              attn_logit_softcapping=None, final_logit_softcapping=None)
    g3a = dict(g3, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                       "rope_theta": 1000000.0}})
    g3b = dict(g3, rope_theta=1000000.0, rope_local_base_freq=10000.0,
               rope_scaling={"rope_type": "linear", "factor": 8.0})
    S.append(("gemma3_text", "gemma3_text", "Gemma 3 text: 5 sliding : 1 full, q/k (1+w) norms, local RoPE base "
              "1e4, global 1e6 with linear scaling 8", [g3a, g3b]))
    g4 = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=1, head_dim=32, global_head_dim=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
              sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=10.0,
              layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
              vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=16, num_kv_shared_layers=2,
              use_double_wide_mlp=True, attention_k_eq_v=False, enable_moe_block=False,
              pad_token_id=EOS_ID)
    S.append(("gemma4_e", "gemma4_text", "Gemma 4 E2B/E4B-style: per-layer inputs (16 wide), KV sharing (layers 2-3 "
              "reuse 0-1), double-wide MLP on shared layers, proportional RoPE on full layers (global_head_dim 64)",
              [g4]))
    S.append(("gemma4_moe", "gemma4_text", "Gemma 4 26B-A4B-style: MoE (8 experts, top-2) beside the dense MLP, "
              "attention_k_eq_v on full layers (1 global KV head), no per-layer inputs", [dict(
                  hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, global_head_dim=64, num_global_key_value_heads=1,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=WINDOW,
                  hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=10.0,
                  layer_types=["sliding_attention", "full_attention"],
                  hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
                  attention_k_eq_v=True, enable_moe_block=True, num_experts=8, top_k_experts=2,
                  moe_intermediate_size=64)]))
    S.append(("gemma4_dense", "gemma4_text", "Gemma 4 31B-style dense: no per-layer inputs, no KV sharing, "
              "no MoE, separate v_proj", [dict(
                  hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, global_head_dim=64, rms_norm_eps=1e-6,
                  tie_word_embeddings=True, sliding_window=WINDOW, hidden_activation="gelu_pytorch_tanh",
                  final_logit_softcapping=10.0,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                  hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
                  attention_k_eq_v=False, enable_moe_block=False)]))
    S.append(("qwen3_5_text", "qwen3_5_text", "Qwen3.5 text: gated DeltaNet (3 linear : 1 full), gated full "
              "attention, partial RoPE 0.25, (1+w) norms", [dict(
                  hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                  linear_num_key_heads=2, linear_num_value_heads=4,
                  layer_types=["linear_attention"] * 3 + ["full_attention"],
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25})]))
    # Kept small (the fixture stays near 300 KB): tied embeddings, 2 layers, 4 tiny experts.  The text config
    # of Qwen3.5-MoE rejects intermediate_size / norm_topk_prob / decoder_sparse_step (its router always
    # renormalizes the top-k weights and every layer is MoE).
    q35m = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                head_dim=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=1, linear_num_value_heads=2,
                num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                shared_expert_intermediate_size=8,
                layer_types=["linear_attention", "full_attention"])
    S.append(("qwen3_5_moe", "qwen3_5_moe_text", "Qwen3.5-MoE text: gated DeltaNet + gated full attention "
              "(1 : 1), MoE (4 experts, top-2, fused gate_up_proj) plus a shared expert with a sigmoid gate, "
              "tied", [
                  dict(q35m, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 0.25}),
                  dict(q35m, partial_rotary_factor=0.25,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})]))
    return S


# fixtures whose goldens record the hidden states of prompt 1 (5 tokens) rather than prompt 0, to stay small
HIDDEN_PROMPT = {"qwen3_5_moe": 1, "qwen3_5_mlx_q4": 1}


# ------------------------------------------------------------------ models

NORM_ZERO_CENTRED = {"gemma2", "gemma3_text", "qwen3_5_text", "qwen3_5_moe_text"}


def init_weights(model, model_type, seed):
    """Seeded random weights, rounded to bf16.  Linear/conv weights N(0, 1/fan_in),
    embeddings and lm_head N(0, 0.5^2) so logits are decisive (std ~4), norm
    weights around their neutral value +- 0.15 so a wrong norm convention shows."""
    g = torch.Generator().manual_seed(seed)
    named = list(model.named_parameters())
    named += [(n, b) for n, b in model.named_buffers() if n.endswith("layer_scalar")]
    with torch.no_grad():
        for name, p in named:
            shape = p.shape
            rn = torch.randn(shape, generator=g, dtype=torch.float32)
            if name.endswith("layer_scalar"):
                new = 0.5 + 0.5 * torch.rand(shape, generator=g)
            elif name.endswith("A_log"):
                new = torch.log(1.0 + 7.0 * torch.rand(shape, generator=g))
            elif name.endswith("dt_bias"):
                new = 1.0 + 0.1 * rn
            elif p.ndim <= 1 and name.endswith(".bias"):
                new = 0.2 * rn
            elif p.ndim <= 1:
                centre = 1.0
                if model_type in NORM_ZERO_CENTRED and "norm" in name and "linear_attn.norm" not in name:
                    centre = 0.0
                new = centre + 0.15 * rn
            elif "embed" in name or "lm_head" in name:
                new = 0.5 * rn
            else:
                new = rn / math.sqrt(shape[-1])
            p.copy_(new.to(torch.bfloat16).to(p.dtype))


def make_config(model_type, kwargs):
    kw = dict(COMMON)
    kw.update(kwargs)
    return AutoConfig.for_model(model_type, **kw)


def load(d, dtype, cls=None):
    cls = cls or AutoModelForCausalLM
    m = cls.from_pretrained(d, dtype=dtype, attn_implementation="eager")
    m.eval()
    return m


def decoder_parts(model):
    for path in ("model.language_model", "model"):
        m = model
        ok = True
        for a in path.split("."):
            if hasattr(m, a):
                m = getattr(m, a)
            else:
                ok = False
                break
        if ok and hasattr(m, "layers") and hasattr(m, "norm"):
            return m.layers, m.norm
    raise RuntimeError("cannot find the decoder layers")


@torch.no_grad()
def logits_of(model, ids):
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0]


@torch.no_grad()
def greedy(model, ids, n):
    seq = list(ids)
    toks, margins = [], []
    for _ in range(n):
        lg = logits_of(model, seq)[-1].float()
        top = torch.topk(lg, 2)
        toks.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(toks[-1])
    return toks, margins


@torch.no_grad()
def hidden_states(model, ids):
    if hasattr(model, "hidden_states_of"):
        return model.hidden_states_of(ids)
    layers, norm = decoder_parts(model)
    rec = {}
    hooks = [layers[0].register_forward_pre_hook(
        lambda mod, args, kwargs: rec.__setitem__("in", (args[0] if args else kwargs["hidden_states"]).detach().clone()),
        with_kwargs=True)]
    for i, layer in enumerate(layers):
        def hk(mod, inp, out, i=i):
            t = out[0] if isinstance(out, (tuple, list)) else out
            rec[i] = t.detach().clone()
        hooks.append(layer.register_forward_hook(hk))
    hooks.append(norm.register_forward_hook(lambda mod, inp, out: rec.__setitem__("norm", out.detach().clone())))
    try:
        logits_of(model, ids)
    finally:
        for h in hooks:
            h.remove()
    seq = [rec["in"]] + [rec[i] for i in range(len(layers))] + [rec["norm"]]
    return torch.stack([t[0].float() for t in seq])  # [L+2, n, H]


def margins_of(lg):
    top = torch.topk(lg.float(), 2, dim=-1)
    return (top.values[:, 0] - top.values[:, 1]).contiguous()


def make_prompts(tok, seed):
    g = torch.Generator().manual_seed(seed)
    text_ids = tok.encode(TEXT_PROMPT).ids
    prompts = [text_ids]
    for n in (5, 19, 44):
        prompts.append([int(x) for x in torch.randint(len(SPECIALS), TOK_VOCAB, (n,), generator=g)])
    return prompts


def record_goldens(w, info, m32, m16, prompts, hidden_prompt=0):
    """Fills the golden writer with every per-prompt record."""
    info["prompts"] = []
    for p, ids in enumerate(prompts):
        lg32 = logits_of(m32, ids).float()
        lg16 = logits_of(m16, ids)
        w.add_list("prompt.%d.ids" % p, "i32", [len(ids)], ids)
        w.add_tensor("prompt.%d.logits.f32" % p, lg32, "f32")
        if lg16.dtype == torch.bfloat16:
            w.add_tensor("prompt.%d.logits.bf16" % p, lg16, "bf16")
        else:
            w.add_tensor("prompt.%d.logits.bf16" % p, lg16.float(), "f32")
        m32s, m16s = margins_of(lg32), margins_of(lg16)
        w.add_tensor("prompt.%d.margin.f32" % p, m32s, "f32")
        w.add_tensor("prompt.%d.margin.bf16" % p, m16s, "f32")
        g32, gm32 = greedy(m32, ids, GREEDY)
        g16, gm16 = greedy(m16, ids, GREEDY)
        w.add_list("prompt.%d.greedy.f32" % p, "i32", [GREEDY], g32)
        w.add_list("prompt.%d.greedy.bf16" % p, "i32", [GREEDY], g16)
        w.add_list("prompt.%d.greedy_margin.f32" % p, "f32", [GREEDY], gm32)
        w.add_list("prompt.%d.greedy_margin.bf16" % p, "f32", [GREEDY], gm16)
        d = (lg32 - lg16.float()).abs().max().item()
        agree = float((lg32.argmax(-1) == lg16.float().argmax(-1)).float().mean())
        info["prompts"].append({
            "n": len(ids), "max_abs_logit_f32": float(lg32.abs().max()),
            "min_margin_f32": float(m32s.min()), "min_greedy_margin_f32": float(min(gm32)),
            "bf16_vs_f32_max_abs_diff": d, "bf16_argmax_agreement": agree,
            "greedy_f32_eq_bf16": g32 == g16})
        if p == hidden_prompt:
            hs = hidden_states(m32, ids)
            w.add_tensor("prompt.%d.hidden.f32" % p, hs, "f32")
            info["hidden_prompt"] = p
            info["hidden_shape"] = list(hs.shape)
    w.add_list("meta.n_prompts", "i32", [1], [len(prompts)])
    w.add_list("meta.hidden_prompt", "i32", [1], [hidden_prompt])
    w.add_list("meta.greedy_len", "i32", [1], [GREEDY])


def finish(d, w, info):
    w.write(os.path.join(d, "golden.bin"))
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(info, f, indent=2, sort_keys=True)
    size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
    log("  wrote %s (%.0f KB)" % (d, size / 1024))


def max_diff(a, b):
    return float((a.float() - b.float()).abs().max())


# ------------------------------------------------------------------ HF fixtures

def hub_spelling(path):
    """Rewrites a saved config.json in the spelling of the published checkpoints:
    transformers 5.17 writes Qwen3-MoE's expert count as num_local_experts and
    Gemma 4's full-attention head size as per_layer_config; hub configs say
    num_experts and global_head_dim / num_global_key_value_heads.  The reload
    check after this proves transformers reads both spellings identically."""
    with open(path) as f:
        c = json.load(f)
    changed = []
    for t in [c] + ([c["text_config"]] if isinstance(c.get("text_config"), dict) else []):
        t.pop("_name_or_path", None)
        if "num_local_experts" in t and t.get("model_type") in ("qwen3_moe",):
            t["num_experts"] = t.pop("num_local_experts")
            changed.append("num_experts")
        if "per_layer_config" in t:
            plc = t.pop("per_layer_config")
            hds = {v.get("head_dim") for v in plc.values()}
            kvs = {v.get("num_key_value_heads") for v in plc.values()} - {None}
            assert len(hds) == 1 and len(kvs) <= 1, plc
            t["global_head_dim"] = hds.pop()
            if kvs:
                t["num_global_key_value_heads"] = kvs.pop()
            changed.append("global_head_dim")
    with open(path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    return changed


def split_fused_experts_if_any(d, cfg, ref_logits, prompts):
    """transformers may save Qwen3-MoE experts fused ([E, 2I, H] gate_up_proj);
    Hugging Face hub checkpoints store one tensor per expert.  Rewrite to the hub
    layout and prove the reload reproduces the model."""
    path = os.path.join(d, "model.safetensors")
    sd = stio.read_torch(path)
    fused = [k for k in sd if k.endswith("mlp.experts.gate_up_proj")]
    if not fused:
        return "per-expert (as saved)"
    I = cfg.moe_intermediate_size
    orig = dict(sd)
    for gate_first in (True, False):
        new = {}
        for k, v in orig.items():
            if k.endswith("mlp.experts.gate_up_proj"):
                base = k[: -len("gate_up_proj")]
                assert v.shape[1] == 2 * I, v.shape
                g, u = (v[:, :I], v[:, I:]) if gate_first else (v[:, I:], v[:, :I])
                for e in range(v.shape[0]):
                    new["%s%d.gate_proj.weight" % (base, e)] = g[e]
                    new["%s%d.up_proj.weight" % (base, e)] = u[e]
            elif k.endswith("mlp.experts.down_proj"):
                base = k[: -len("down_proj")]
                for e in range(v.shape[0]):
                    new["%s%d.down_proj.weight" % (base, e)] = v[e]
            else:
                new[k] = v
        stio.write(path, {k: stio.tensor_bytes(v) for k, v in new.items()}, {"format": "pt"})
        m = load(d, torch.float32)
        dd = max_diff(logits_of(m, prompts[3]), ref_logits)
        if dd == 0.0:
            return "per-expert (rewritten from fused, gate_first=%s, reload exact)" % gate_first
        log("  per-expert rewrite gate_first=%s differs by %g" % (gate_first, dd))
    stio.write(path, {k: stio.tensor_bytes(v) for k, v in orig.items()}, {"format": "pt"})
    return "fused (as saved by transformers; per-expert rewrite did not reload exactly)"


def build_hf_fixture(outdir, tok, tok_json, name, model_type, desc, variants, seed, prompts):
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    err = None
    for kw in variants:
        try:
            cfg = make_config(model_type, kw)
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
            break
        except Exception as e:  # try the next spelling of the config
            err = e
            log("  config variant failed: %r" % (e,))
            model = None
    if model is None:
        raise err
    init_weights(model, model_type, seed)
    ref_logits = logits_of(model, prompts[3]).float()
    model.to(torch.bfloat16).save_pretrained(d)
    write_tokenizer_files(d, tok_json)
    spelled = hub_spelling(os.path.join(d, "config.json"))
    info = {"fixture": name, "config_respelled": spelled, "model_type": model_type, "description": desc, "seed": seed,
            "transformers": transformers.__version__, "torch": torch.__version__,
            "n_params": sum(p.numel() for p in model.parameters())}
    if model_type == "qwen3_moe":
        info["expert_layout"] = split_fused_experts_if_any(d, cfg, ref_logits, prompts)
    m32 = load(d, torch.float32)
    m16 = load(d, torch.bfloat16)
    info["reload_max_abs_diff"] = max_diff(logits_of(m32, prompts[3]), ref_logits)
    info["saved_keys"] = sorted(stio.read_torch(os.path.join(d, "model.safetensors")).keys())[:12]
    log("  %s: reload diff %g, params %d" % (name, info["reload_max_abs_diff"], info["n_params"]))
    w = GoldenWriter()
    record_goldens(w, info, m32, m16, prompts, hidden_prompt=HIDDEN_PROMPT.get(name, 0))
    return d, w, info, m32


# ------------------------------------------------------------------ MLX conversion

def mixed_bits_fn(recipe, num_layers, layer_location):
    low, high = {"mixed_2_6": (2, 6), "mixed_3_4": (3, 4), "mixed_3_6": (3, 6), "mixed_4_6": (4, 6)}[recipe]

    def bits_for(path):
        parts = path.split(".")
        index = int(parts[layer_location]) if len(parts) > layer_location and parts[layer_location].isdigit() else 0
        more = index < num_layers // 8 or index >= 7 * num_layers // 8 or (index - num_layers // 8) % 3 == 2
        if ("v_proj" in path or "v_a_proj" in path or "v_b_proj" in path) and more:
            return high
        if "down_proj" in path and more:
            return high
        if "lm_head" in path:
            return high
        return low
    return bits_for


def to_mlx_names(hf, family, cfg):
    """HF on-disk tensors -> (mlx-named float tensors, inverse mapping function)."""
    out = {}
    if family in ("llama", "qwen2", "qwen3"):
        for k, v in hf.items():
            out[k] = v

        def back(mlx):
            return dict(mlx)
        return out, back
    if family == "qwen3_moe":
        E = cfg.get("num_experts") or cfg["num_local_experts"]
        L = cfg["num_hidden_layers"]
        I = cfg["moe_intermediate_size"]
        fused = "model.layers.0.mlp.experts.gate_up_proj" in hf
        for k, v in hf.items():
            if ".mlp.experts." not in k:
                out[k] = v
        for l in range(L):
            p = "model.layers.%d.mlp" % l
            if fused:
                gu = hf[p + ".experts.gate_up_proj"]
                out[p + ".switch_mlp.gate_proj.weight"] = gu[:, :I, :].contiguous()
                out[p + ".switch_mlp.up_proj.weight"] = gu[:, I:, :].contiguous()
                out[p + ".switch_mlp.down_proj.weight"] = hf[p + ".experts.down_proj"]
                continue
            for n in ("gate_proj", "up_proj", "down_proj"):
                out["%s.switch_mlp.%s.weight" % (p, n)] = torch.stack(
                    [hf["%s.experts.%d.%s.weight" % (p, e, n)] for e in range(E)])

        def back(mlx):
            res = {}
            for k, v in mlx.items():
                if fused and ".switch_mlp." in k:
                    p, rest = k.split(".switch_mlp.")
                    if rest.startswith("gate_proj"):
                        res[p + ".experts.gate_up_proj"] = torch.cat([v, mlx[k.replace("gate_proj", "up_proj")]], 1)
                    elif rest.startswith("down_proj"):
                        res[p + ".experts.down_proj"] = v
                elif ".switch_mlp." in k:
                    p, rest = k.split(".switch_mlp.")
                    n = rest.split(".")[0]
                    for e in range(v.shape[0]):
                        res["%s.experts.%d.%s.weight" % (p, e, n)] = v[e]
                else:
                    res[k] = v
            return res
        return out, back
    if family == "gemma4":
        I = cfg["moe_intermediate_size"]
        for k, v in hf.items():
            assert k.startswith("model."), k
            nk = "language_model.model." + k[len("model."):]
            if k.endswith(".experts.gate_up_proj"):
                base = nk[: -len(".gate_up_proj")]
                assert v.shape[-2] == 2 * I
                out[base + ".switch_glu.gate_proj.weight"] = v[:, :I, :].contiguous()
                out[base + ".switch_glu.up_proj.weight"] = v[:, I:, :].contiguous()
            elif k.endswith(".experts.down_proj"):
                out[nk[: -len(".down_proj")] + ".switch_glu.down_proj.weight"] = v
            else:
                out[nk] = v

        def back(mlx):
            res = {}
            for k, v in mlx.items():
                hk = "model." + k[len("language_model.model."):]
                if ".switch_glu.gate_proj.weight" in hk:
                    base = hk.split(".switch_glu.")[0]
                    res[base + ".gate_up_proj"] = torch.cat(
                        [v, mlx[k.replace("gate_proj", "up_proj")]], dim=-2)
                elif ".switch_glu.up_proj.weight" in hk:
                    continue
                elif ".switch_glu.down_proj.weight" in hk:
                    res[hk.split(".switch_glu.")[0] + ".down_proj"] = v
                else:
                    res[hk] = v
            return res
        return out, back
    if family == "qwen3_5":
        # mlx-lm's conversion (qwen3_5.py sanitize, then save): multimodal names language_model.model.* and
        # language_model.lm_head.*, conv1d [C, 1, K] -> [C, K, 1], the zero-centred norms (input/post-attention
        # layernorms, the final norm, q_norm, k_norm; not linear_attn.norm) folded to 1 + w in the weight dtype
        # (bf16, so rounded), A_log kept in float32 (cast_predicate).
        fold = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                ".q_norm.weight", ".k_norm.weight")
        for k, v in hf.items():
            nk = "language_model." + k
            if k.endswith("conv1d.weight"):
                assert v.ndim == 3 and v.shape[1] == 1, (k, v.shape)
                v = v.transpose(1, 2).contiguous()
            elif any(k.endswith(f) for f in fold):
                assert v.ndim == 1, k
                v = (v.float() + 1.0).to(v.dtype)
            elif k.endswith("A_log"):
                v = v.float()
            out[nk] = v

        def back(mlx):
            res = {}
            for k, v in mlx.items():
                hk = k[len("language_model."):]
                if hk.endswith("conv1d.weight"):
                    v = v.transpose(1, 2).contiguous()
                elif any(hk.endswith(f) for f in fold):
                    v = v.float() - 1.0  # exact: the folded value has at most 8 significant bits
                res[hk] = v
            return res
        return out, back
    raise ValueError(family)


def mlx_quantize_checkpoint(hf, family, cfg, bits, gs, recipe=None):
    """Returns (mlx safetensors entries, quantization config, dequantized HF tensors fp32)."""
    mlx, back = to_mlx_names(hf, family, cfg)
    q = {"group_size": gs, "bits": bits, "mode": "affine"}
    bits_for = None
    if recipe:
        down = sorted(k for k in mlx if "down_proj" in k)
        loc = next(i for i, p in enumerate(down[0].split(".")) if p.isdigit())
        bits_for = mixed_bits_fn(recipe, cfg["num_hidden_layers"], loc)
    entries, deq = {}, {}
    counts = {}
    for k, v in sorted(mlx.items()):
        quantizable = k.endswith(".weight") and v.ndim >= 2 and v.shape[-1] % gs == 0
        if not quantizable:
            entries[k] = stio.tensor_bytes(v)
            deq[k] = v.float()
            continue
        path = k[: -len(".weight")]
        b, g = bits, gs
        if family == "qwen3_moe" and path.endswith("mlp.gate"):
            b, g = 8, 64
            q[path] = {"group_size": 64, "bits": 8}
        elif family == "gemma4" and path.endswith("router.proj"):
            b, g = 8, 64
            q[path] = {"group_size": 64, "bits": 8}
        elif bits_for is not None:
            b = bits_for(path)
            q[path] = {"group_size": gs, "bits": b, "mode": "affine"}
        packed, scales, biases = mlxq.quantize_torch(v, b, g, out_dtype=v.dtype)
        entries[k] = stio.u32_bytes(packed)
        entries[path + ".scales"] = stio.tensor_bytes(scales)
        entries[path + ".biases"] = stio.tensor_bytes(biases)
        deq[k] = mlxq.dequantize_torch(packed, scales, biases, b, g).reshape(v.shape)
        counts[b] = counts.get(b, 0) + 1
    return entries, q, back(deq), counts


def check_torch_quantizer():
    """The vectorized quantizer must equal the pure-Python one bit for bit."""
    g = torch.Generator().manual_seed(7)
    for bits in (2, 3, 4, 5, 6, 8):
        for gs in (32, 64):
            w = (torch.randn(6, 128, generator=g) * torch.tensor([1, 0, 0.01, 5, 1e-8, 0.3])[:, None])
            w[2] = w[2].abs() + 0.5
            w[3] = -w[3].abs() - 1
            w = w.to(torch.bfloat16)
            packed, scales, biases = mlxq.quantize_torch(w, bits, gs)
            rows = [[float(x) for x in r] for r in w.float()]
            pw, ps, pb = mlxq.quantize_rows_py(rows, bits, gs)
            assert packed.tolist() == pw, ("packed", bits, gs)
            assert scales.float().tolist() == ps, ("scales", bits, gs)
            assert biases.float().tolist() == pb, ("biases", bits, gs)
            dq = mlxq.dequantize_torch(packed, scales, biases, bits, gs)
            dp = mlxq.dequantize_rows_py(pw, ps, pb, bits, gs, 128)
            assert dq.tolist() == dp, ("dequant", bits, gs)
    log("torch quantizer == pure-Python quantizer (bits 2,3,4,5,6,8; gs 32,64)")


def build_mlx_fixture(outdir, tok_json, base_dir, name, family, bits, gs, recipe, prompts, desc,
                      wrapper_config=None, cls=None):
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(base_dir, "config.json")) as f:
        base_cfg = json.load(f)
    hf = stio.read_torch(os.path.join(base_dir, "model.safetensors"))
    entries, qcfg, deq, counts = mlx_quantize_checkpoint(hf, family, base_cfg, bits, gs, recipe)
    stio.write(os.path.join(d, "model.safetensors"), entries, {"format": "mlx"})
    cfg = copy.deepcopy(wrapper_config if wrapper_config is not None else base_cfg)
    cfg["quantization"] = qcfg
    cfg["quantization_config"] = qcfg
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=4, sort_keys=True)
    write_tokenizer_files(d, tok_json)
    # Goldens: the base architecture with the dequantized weights.
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(base_dir, "config.json"), tmp)
        stio.write(os.path.join(tmp, "model.safetensors"), {k: stio.tensor_bytes(v.float()) for k, v in deq.items()},
                   {"format": "pt"})
        m32 = load(tmp, torch.float32)
        m16 = load(tmp, torch.bfloat16)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    info = {"fixture": name, "model_type": cfg.get("model_type"), "description": desc, "base_fixture":
            os.path.basename(base_dir), "quantization": {"bits": bits, "group_size": gs, "recipe": recipe,
                                                         "tensors_per_bits": {str(k): v for k, v in counts.items()}},
            "transformers": transformers.__version__, "torch": torch.__version__,
            "golden_reference": "transformers (base architecture) on the dequantized weights"}
    w = GoldenWriter()
    record_goldens(w, info, m32, m16, prompts, hidden_prompt=HIDDEN_PROMPT.get(name, 0))
    finish(d, w, info)
    return d


# ------------------------------------------------------------------ multimodal wrapper

def build_gemma4_mm(outdir, tok_json, text_dir, text_model, prompts):
    name = "gemma4_mm"
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with open(os.path.join(text_dir, "config.json")) as f:
        text_cfg = json.load(f)
    info = {"fixture": name, "model_type": "gemma4", "base_fixture": "gemma4_e",
            "description": "Gemma 4 multimodal wrapper (model_type gemma4, nested text_config, "
                           "model.language_model.* names, no vision/audio towers) around the gemma4_e weights",
            "transformers": transformers.__version__, "torch": torch.__version__}
    try:
        from transformers import Gemma4Config, Gemma4ForConditionalGeneration
        tc = AutoConfig.from_pretrained(text_dir)
        cfg = Gemma4Config(text_config=tc, vision_config=None, audio_config=None, tie_word_embeddings=True)
        model = Gemma4ForConditionalGeneration(cfg).float().eval()
        missing = model.model.language_model.load_state_dict(text_model.model.state_dict(), strict=False)
        log("  gemma4_mm load_state_dict:", missing)
        model.to(torch.bfloat16).save_pretrained(d)
        write_tokenizer_files(d, tok_json)
        info["config_respelled"] = hub_spelling(os.path.join(d, "config.json"))
        m32 = load(d, torch.float32, Gemma4ForConditionalGeneration)
        m16 = load(d, torch.bfloat16, Gemma4ForConditionalGeneration)
        info["how"] = "Gemma4ForConditionalGeneration instantiated (vision_config=None, audio_config=None)"
        info["text_vs_wrapper_max_abs_diff"] = max_diff(logits_of(m32, prompts[3]), logits_of(text_model, prompts[3]))
    except Exception as e:
        log("  gemma4_mm: wrapper class failed (%r); writing renamed keys + wrapper config" % (e,))
        traceback.print_exc()
        for x in os.listdir(d):
            os.remove(os.path.join(d, x))
        hf = stio.read_torch(os.path.join(text_dir, "model.safetensors"))
        stio.write(os.path.join(d, "model.safetensors"),
                   {"model.language_model." + k[len("model."):]: stio.tensor_bytes(v) for k, v in hf.items()},
                   {"format": "pt"})
        tc = {k: v for k, v in text_cfg.items() if k not in ("architectures", "transformers_version")}
        wrapper = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": tc,
                   "tie_word_embeddings": True, "transformers_version": transformers.__version__}
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(wrapper, f, indent=2)
        write_tokenizer_files(d, tok_json)
        m32 = load(text_dir, torch.float32)
        m16 = load(text_dir, torch.bfloat16)
        info["how"] = ("renamed keys + hand-written wrapper config; goldens from the text model "
                       "(wrapper class could not be instantiated: %r)" % (e,))
    w = GoldenWriter()
    record_goldens(w, info, m32, m16, prompts)
    finish(d, w, info)


# ------------------------------------------------------------------ quantized KV reference

def fake_quant(x, bits, gs):
    """x [..., hd] fp32 -> dequant(quant(x)) row by row (scales/biases fp32)."""
    packed, s, b = mlxq.quantize_torch(x, bits, gs, out_dtype=torch.float32)
    return mlxq.dequantize_torch(packed, s, b, bits, gs).reshape(x.shape)


class RefCache:
    def __init__(self):
        self.k = None  # [nkv, S, hd] values attention reads
        self.v = None
        self.quantized = False


@torch.no_grad()
def ref_chunk(model, ids, pos0, caches, layer_bits, gs, mup=None, record=None):
    """One chunk of the llama-family forward with petrel's quantized-KV semantics.
    mup = (scale_emb, residual_scale, logit_divisor) turns it into MiniCPM's
    forward; record (a list) receives the hidden states (input of layer 0, each
    layer's output, the final norm's output)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    m = model.model
    cfg = model.config
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // nh
    T = len(ids)
    x = m.embed_tokens(torch.tensor([ids]))
    if mup:
        x = x * mup[0]
    if record is not None:
        record.append(x[0].float())
    pos = torch.arange(pos0, pos0 + T)[None]
    cos, sin = m.rotary_emb(x, pos)
    for li, layer in enumerate(m.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(1, T, nh, hd).transpose(1, 2)
        k = a.k_proj(h).view(1, T, nkv, hd).transpose(1, 2)
        v = a.v_proj(h).view(1, T, nkv, hd).transpose(1, 2)
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k[0], v[0]
        c = caches[li]
        if c.quantized:
            k, v = fake_quant(k, layer_bits[li], gs), fake_quant(v, layer_bits[li], gs)
        c.k = k if c.k is None else torch.cat([c.k, k], 1)
        c.v = v if c.v is None else torch.cat([c.v, v], 1)
        S = c.k.shape[1]
        rep = nh // nkv
        K = c.k.repeat_interleave(rep, 0)
        V = c.v.repeat_interleave(rep, 0)
        # (q K^T) * scale as transformers' eager attention does; with the
        # power-of-two scales used here it equals (q * scale) K^T exactly.
        scores = (q[0] @ K.transpose(1, 2)) * a.scaling  # [nh, T, S]
        qpos = torch.arange(pos0, pos0 + T)[:, None]
        kpos = torch.arange(S)[None, :]
        scores = scores.masked_fill(kpos > qpos, float("-inf"))
        p = torch.softmax(scores.float(), dim=-1).to(V.dtype)
        o = (p @ V).transpose(0, 1).reshape(1, T, nh * hd)
        if mup:
            x = x + a.o_proj(o) * mup[1]
            x = x + layer.mlp(layer.post_attention_layernorm(x)) * mup[1]
        else:
            x = x + a.o_proj(o)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if record is not None:
            record.append(x[0].float())
    h = m.norm(x)
    if record is not None:
        record.append(h[0].float())
    if mup:
        h = h / mup[2]
    return model.lm_head(h)[0]


@torch.no_grad()
def ref_generate(model, prompt, layer_bits, gs, chunk, start, n_gen):
    """Chunked prefill + greedy decode.  After each chunk and each decode step a
    still-full-precision cache of a quantized layer holding >= start tokens is
    converted whole; from then on rows are quantized as they are written."""
    caches = [RefCache() for _ in model.model.layers]

    def maybe_convert():
        for li, c in enumerate(caches):
            if layer_bits[li] and not c.quantized and c.k.shape[1] >= start:
                c.k, c.v = fake_quant(c.k, layer_bits[li], gs), fake_quant(c.v, layer_bits[li], gs)
                c.quantized = True
    outs = []
    for s in range(0, len(prompt), chunk):
        outs.append(ref_chunk(model, prompt[s:s + chunk], s, caches, layer_bits, gs).float())
        maybe_convert()
    prompt_logits = torch.cat(outs)
    toks = [int(prompt_logits[-1].argmax())]
    steps = []
    pos = len(prompt)
    for _ in range(n_gen - 1):
        lg = ref_chunk(model, [toks[-1]], pos, caches, layer_bits, gs).float()
        maybe_convert()
        steps.append(lg[0])
        toks.append(int(lg[0].argmax()))
        pos += 1
    return prompt_logits, toks, torch.stack(steps)


class MiniCPMRef(torch.nn.Module):
    """MiniCPM's forward (transformers 5.17 has no minicpm model): transformers'
    Llama modules plus MiniCPM's three scale factors -- embeddings x scale_emb,
    each residual branch x scale_depth/sqrt(L), final norm output / (H /
    dim_model_base) before lm_head -- with eager-style attention (ref_chunk)."""

    def __init__(self, inner, scale_emb, scale_depth, dim_model_base):
        super().__init__()
        self.inner = inner
        L, H = inner.config.num_hidden_layers, inner.config.hidden_size
        self.mup = (scale_emb, scale_depth / math.sqrt(L), H / dim_model_base)

    def _run(self, ids, record=None):
        n = len(self.inner.model.layers)
        return ref_chunk(self.inner, ids, 0, [RefCache() for _ in range(n)], [0] * n, 64, mup=self.mup,
                         record=record)

    @torch.no_grad()
    def forward(self, input_ids, use_cache=False):
        import types
        return types.SimpleNamespace(logits=self._run(input_ids[0].tolist())[None])

    @torch.no_grad()
    def hidden_states_of(self, ids):
        rec = []
        self._run(ids, rec)
        return torch.stack(rec)


def build_minicpm(outdir, tok_json, seed, prompts):
    name = "minicpm"
    d = os.path.join(outdir, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    dims = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True)
    mup = dict(scale_emb=12, scale_depth=1.4, dim_model_base=16)
    hd = 16
    short = [round(1.0 + 0.25 * i, 3) for i in range(hd // 2)]
    long_ = [round(1.0 + 1.5 * i, 3) for i in range(hd // 2)]
    rope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": short, "long_factor": long_,
            "original_max_position_embeddings": 256}
    inner, err = None, None
    legacy = {"rope_theta": 10000.0, "rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}}
    for variant in (dict(dims, rope_parameters=rope), dict(dims, **legacy)):
        try:
            lcfg = make_config("llama", variant)
            torch.manual_seed(seed)
            inner = AutoModelForCausalLM.from_config(lcfg, attn_implementation="eager").float().eval()
            break
        except Exception as e:
            err = e
            log("  minicpm rope variant failed: %r" % (e,))
    if inner is None:
        raise err
    init_weights(inner, "minicpm", seed)
    tmp = tempfile.mkdtemp()
    try:
        inner.to(torch.bfloat16).save_pretrained(tmp)  # Llama tensor names are MiniCPM's
        with open(os.path.join(tmp, "config.json")) as f:
            cfg = json.load(f)
        shutil.copy(os.path.join(tmp, "model.safetensors"), d)
        l32 = load(tmp, torch.float32)
        l16 = load(tmp, torch.bfloat16)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cfg.pop("rope_parameters", None)
    cfg.pop("_name_or_path", None)
    cfg.update(mup)
    cfg.update({"model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "longrope", "short_factor": short, "long_factor": long_,
                                 "original_max_position_embeddings": 256}})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    write_tokenizer_files(d, tok_json)
    L, H = dims["num_hidden_layers"], dims["hidden_size"]
    unit = MiniCPMRef(l32, 1.0, math.sqrt(L), H)
    chk = max_diff(logits_of(unit, prompts[3]), logits_of(l32, prompts[3]))
    assert chk <= 1e-4 * float(logits_of(l32, prompts[3]).abs().max()), chk
    m32 = MiniCPMRef(l32, **mup)
    m16 = MiniCPMRef(l16, **mup)
    info = {"fixture": name, "model_type": "minicpm", "seed": seed,
            "description": "MiniCPM: scale_emb 12, scale_depth 1.4, dim_model_base 16 (logits / 4), longrope "
                           "(max_position_embeddings == original_max_position_embeddings, so the short factors "
                           "and attention factor 1, as MiniCPM4)",
            "reference": "transformers 5.17 has no minicpm model: transformers' Llama modules (longrope RoPE) "
                         "plus MiniCPM's three scale factors (MiniCPMRef in make_fixtures.py); bf16 run = the "
                         "Llama modules loaded in bf16, scale factors applied in bf16",
            "unit_scales_vs_transformers_llama_max_abs_diff": chk,
            "transformers": transformers.__version__, "torch": torch.__version__}
    w = GoldenWriter()
    record_goldens(w, info, m32, m16, prompts)
    finish(d, w, info)


def add_qkv_references(d, w, info, m32, prompts):
    L = m32.config.num_hidden_layers
    prompt = prompts[3]
    lg_tf = logits_of(m32, prompt).float()
    pl, _, _ = ref_generate(m32, prompt, [0] * L, 64, len(prompt), 0, 2)
    pl16, _, _ = ref_generate(m32, prompt, [0] * L, 64, 16, 0, 2)
    chk = {"ref_vs_transformers_one_chunk": max_diff(pl, lg_tf), "ref_vs_transformers_chunk16": max_diff(pl16, lg_tf)}
    log("  qkv reference check (kv off) vs transformers:", chk)
    assert chk["ref_vs_transformers_chunk16"] < 1e-4 * float(lg_tf.abs().max()), chk
    kv_config = [{"layer_idx": 0, "bits": 4, "group_size": 64}]
    with open(os.path.join(d, "kv_config.json"), "w") as f:
        json.dump(kv_config, f, indent=2)
    scenarios = [  # (bits per layer, label bits, chunk, start)
        ([8] * L, 8, 16, 0), ([4] * L, 4, 16, 0), ([4] + [0] * (L - 1), 0, 16, 0), ([4] * L, 4, 16, 24)]
    info["qkv"] = {"check": chk, "prompt": 3, "kv_config": kv_config, "scenarios": []}
    for s, (lb, label, chunk, start) in enumerate(scenarios):
        pl, toks, steps = ref_generate(m32, prompt, lb, 64, chunk, start, GREEDY)
        w.add_list("qkv.%d.params" % s, "i32", [4], [label, 64, chunk, start])
        w.add_list("qkv.%d.layer_bits" % s, "i32", [L], lb)
        w.add_tensor("qkv.%d.prompt_logits" % s, pl, "f32")
        w.add_list("qkv.%d.greedy" % s, "i32", [GREEDY], toks)
        w.add_tensor("qkv.%d.step_logits" % s, steps, "f32")
        info["qkv"]["scenarios"].append({"layer_bits": lb, "kv_quant": label if label else "config",
                                         "prefill_chunk": chunk, "quantized_kv_start": start,
                                         "max_abs_diff_vs_unquantized": max_diff(pl, lg_tf),
                                         "min_step_margin": float(margins_of(steps).min())})
    w.add_list("meta.n_qkv", "i32", [1], [len(scenarios)])


# ------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True, help="training text for the fixtures' tokenizer (KJV)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    log("transformers", transformers.__version__, "torch", torch.__version__)
    for cls in ("Gemma4TextConfig", "Gemma4Config", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
                "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", "MiniCPMConfig", "Gemma3TextConfig", "Qwen3MoeConfig"):
        log("  has %s: %s" % (cls, hasattr(transformers, cls)))
    only = set(x for x in args.only.split(",") if x)
    check_torch_quantizer()
    tok_json = os.path.join(args.out, "_tokenizer.json")
    tok = build_tokenizer(args.text, tok_json, TOK_VOCAB)
    log("tokenizer: %d tokens; text prompt -> %s" % (tok.get_vocab_size(), tok.encode(TEXT_PROMPT).ids))
    prompts = make_prompts(tok, 1234)
    status = {}
    built = {}
    for i, (name, mt, desc, variants) in enumerate(spec_list()):
        if only and name not in only and not any(o.startswith(name) for o in only):
            continue
        t0 = time.time()
        log("== %s (%s)" % (name, mt))
        try:
            d, w, info, m32 = build_hf_fixture(args.out, tok, tok_json, name, mt, desc, variants, 1000 + i, prompts)
            if name == "llama":
                add_qkv_references(d, w, info, m32, prompts)
            finish(d, w, info)
            built[name] = (d, m32)
            status[name] = "ok %.1fs" % (time.time() - t0)
        except Exception as e:
            traceback.print_exc()
            status[name] = "FAILED: %r" % (e,)
            log("  FAILED", name, repr(e))
    if not only or "minicpm" in only:
        log("== minicpm (own reference)")
        try:
            build_minicpm(args.out, tok_json, 1099, prompts)
            status["minicpm"] = "ok"
        except Exception as e:
            traceback.print_exc()
            status["minicpm"] = "FAILED: %r" % (e,)
    mlx_specs = [
        ("llama_mlx_q4", "llama", "llama", 4, 64, None, "llama as MLX 4-bit g64 (tied: no lm_head; embedding quantized)"),
        ("llama_mlx_q8", "llama", "llama", 8, 64, None, "llama as MLX 8-bit g64"),
        ("llama_mlx_mixed_3_6", "llama", "llama", 3, 64, "mixed_3_6",
         "llama as MLX mixed_3_6 g64 (per-module 3/6 bits as mlx-lm's recipe; 3- and 6-bit packing)"),
        ("qwen3_moe_mlx_q4", "qwen3_moe", "qwen3_moe", 4, 64, None,
         "qwen3_moe in the MLX-community layout: switch_mlp stacked experts, 4-bit g64, router mlp.gate 8-bit"),
        ("gemma4_moe_mlx_q4", "gemma4_moe", "gemma4", 4, 64, None,
         "gemma4_moe in the MLX-community layout: model_type gemma4 wrapper, language_model.model.* names, "
         "experts.switch_glu split from gate_up_proj, 4-bit g64, router.proj 8-bit"),
        ("qwen3_5_mlx_q4", "qwen3_5_text", "qwen3_5", 4, 64, None,
         "qwen3_5_text in the MLX-community layout: model_type qwen3_5 wrapper, language_model.model.* names, "
         "conv1d [C, K, 1], norms folded to 1 + w (bf16), A_log float32, 4-bit g64 (in_proj_a/b too)"),
    ]
    for name, base, family, bits, gs, recipe, desc in mlx_specs:
        if only and name not in only:
            continue
        if base not in built:
            status[name] = "skipped: base %s missing" % base
            continue
        t0 = time.time()
        log("== %s" % name)
        try:
            wrapper = None
            if family == "gemma4":
                with open(os.path.join(built[base][0], "config.json")) as f:
                    tc = json.load(f)
                tc = {k: v for k, v in tc.items() if k not in ("architectures", "transformers_version")}
                wrapper = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                           "text_config": tc, "tie_word_embeddings": True}
            elif family == "qwen3_5":
                with open(os.path.join(built[base][0], "config.json")) as f:
                    tc = json.load(f)
                tc = {k: v for k, v in tc.items() if k not in ("architectures", "transformers_version")}
                wrapper = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                           "text_config": tc, "tie_word_embeddings": tc.get("tie_word_embeddings", False)}
            build_mlx_fixture(args.out, tok_json, built[base][0], name, family, bits, gs, recipe, prompts, desc,
                              wrapper_config=wrapper)
            status[name] = "ok %.1fs" % (time.time() - t0)
        except Exception as e:
            traceback.print_exc()
            status[name] = "FAILED: %r" % (e,)
            log("  FAILED", name, repr(e))
    if (not only or "gemma4_mm" in only) and "gemma4_e" in built:
        log("== gemma4_mm")
        try:
            build_gemma4_mm(args.out, tok_json, built["gemma4_e"][0], built["gemma4_e"][1], prompts)
            status["gemma4_mm"] = "ok"
        except Exception as e:
            traceback.print_exc()
            status["gemma4_mm"] = "FAILED: %r" % (e,)
    os.remove(tok_json)
    log("STATUS")
    for k, v in status.items():
        log("  %-22s %s" % (k, v))
    with open(os.path.join(args.out, "_status.json"), "w") as f:
        json.dump({"status": status, "log": LOG}, f, indent=1)


if __name__ == "__main__":
    main()
