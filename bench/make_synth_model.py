"""Writes a model directory of a published shape with random 4-bit weights,
for serving benchmarks where the real weights are not available (python3
standard library only; a measuring harness, not part of petrel).

  make_synth_model.py OUT_DIR [SHAPE]        SHAPE: llama-3.1-8b (default) | llama-3.2-1b |
                                             llama-3.2-3b | tiny

OUT_DIR gets what `petrel serve -m OUT_DIR` loads:
  config.json        the shape (LlamaForCausalLM, MLX affine 4-bit, group 64)
  model.safetensors  MLX layout: uint32 codes + bf16 scales/biases per linear
                     and for the embedding, bf16 norms; codes random, scales
                     small enough that activations stay O(1) through the layers
  tokenizer.json     a byte-level BPE with the shape's vocabulary size
                     (random merges over letters, one special end token)
Weights are random, so the model's text is noise: only the speed means
anything. The codes come from one 64 MiB random block reused across tensors
(the bytes' values do not change the speed of a GEMV), so writing the 8B
shape (~4.5 GB) takes seconds.
"""
import json
import os
import random
import struct
import sys

SHAPES = {
    # hidden, layers, heads, kv_heads, head_dim, ffn, vocab, tied, rope_theta
    "llama-3.1-8b": (4096, 32, 32, 8, 128, 14336, 128256, False, 500000.0),
    "llama-3.2-1b": (2048, 16, 32, 8, 64, 8192, 128256, True, 500000.0),
    "llama-3.2-3b": (3072, 28, 24, 8, 128, 8192, 128256, True, 500000.0),
    "tiny": (256, 2, 4, 2, 64, 512, 2048, True, 10000.0),  # checks the harness on a laptop
}
BITS, GS = 4, 64


def bf16_bytes(v, n):
    """n copies of the bf16 value nearest v (truncated f32: exact for these)."""
    return struct.pack("<f", v)[2:] * n


def main():
    out = sys.argv[1]
    shape = sys.argv[2] if len(sys.argv) > 2 else "llama-3.1-8b"
    H, L, NH, NKV, HD, F, V, tied, theta = SHAPES[shape]
    os.makedirs(out, exist_ok=True)
    rnd = random.Random(7)
    block = rnd.randbytes(64 << 20)

    tensors = []  # (name, dtype, shape, writer(n_bytes) or bytes)

    def quant(name, rows, cols, zero_last=False):
        """zero_last: the last row is all zeros (scales and biases 0), so as
        the output head the end token's logit is exactly 0 and random greedy
        streams rarely end early."""
        words = cols * BITS // 32
        groups = cols // GS
        amp = 3.0 / (cols ** 0.5) / 15.0  # |w| ~ 1/sqrt(cols)
        z = groups if zero_last else 0
        tensors.append((name + ".weight", "U32", [rows, words], rows * words * 4))
        tensors.append((name + ".scales", "BF16", [rows, groups],
                        bf16_bytes(amp, rows * groups - z) + bf16_bytes(0.0, z)))
        tensors.append((name + ".biases", "BF16", [rows, groups],
                        bf16_bytes(-7.5 * amp, rows * groups - z) + bf16_bytes(0.0, z)))

    def norm(name):
        tensors.append((name, "BF16", [H], bf16_bytes(1.0, H)))

    quant("model.embed_tokens", V, H, zero_last=tied)
    for i in range(L):
        p = f"model.layers.{i}."
        norm(p + "input_layernorm.weight")
        norm(p + "post_attention_layernorm.weight")
        quant(p + "self_attn.q_proj", NH * HD, H)
        quant(p + "self_attn.k_proj", NKV * HD, H)
        quant(p + "self_attn.v_proj", NKV * HD, H)
        quant(p + "self_attn.o_proj", H, NH * HD)
        quant(p + "mlp.gate_proj", F, H)
        quant(p + "mlp.up_proj", F, H)
        quant(p + "mlp.down_proj", H, F)
    norm("model.norm.weight")
    if not tied:
        quant("lm_head", V, H, zero_last=True)

    header = {"__metadata__": {"format": "mlx"}}
    off = 0
    for name, dt, shp, data in tensors:
        n = data if isinstance(data, int) else len(data)
        header[name] = {"dtype": dt, "shape": shp, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        pos = 0
        for name, dt, shp, data in tensors:
            if isinstance(data, int):
                left = data
                while left:
                    k = min(left, len(block) - pos)
                    f.write(block[pos:pos + k])
                    pos = (pos + k) % len(block)
                    left -= k
            else:
                f.write(data)

    eos = V - 1
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
        "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
        "intermediate_size": F, "vocab_size": V, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
        "rope_theta": theta, "hidden_act": "silu", "tie_word_embeddings": tied, "torch_dtype": "bfloat16",
        "bos_token_id": None, "eos_token_id": eos, "attention_bias": False, "mlp_bias": False,
        "quantization": {"bits": BITS, "group_size": GS, "mode": "affine"},
        "quantization_config": {"bits": BITS, "group_size": GS, "mode": "affine"},
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)

    # byte-level BPE: the 256 byte symbols, then merges of existing tokens
    # (letters favoured) until V - 1 tokens; the last id is the end token
    def byte_sym(b):
        keep = 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF
        return chr(b) if keep else None
    alpha, n = [], 0
    for b in range(256):
        c = byte_sym(b)
        if c is None:
            c = chr(256 + n)
            n += 1
        alpha.append(c)
    vocab = {c: i for i, c in enumerate(alpha)}
    toks = list(alpha)
    merges = []
    letters = list("etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZĠ")
    while len(vocab) < V - 1:
        pick = lambda: rnd.choice(letters) if rnd.random() < 0.35 else toks[int(rnd.random() ** 2 * len(toks))]
        a, b = pick(), pick()
        m = a + b
        if len(m) > 16 or m in vocab:
            continue
        vocab[m] = len(vocab)
        toks.append(m)
        merges.append([a, b])
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": eos, "content": "<|end|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"add_bos_token": False, "add_eos_token": False, "eos_token": "<|end|>", "bos_token": None}, f)
    print(f"{out}: {shape} q4, {off / 1e9:.2f} GB of tensors, vocab {V}")


if __name__ == "__main__":
    main()
