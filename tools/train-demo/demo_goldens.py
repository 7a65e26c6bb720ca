#!/usr/bin/env python3
"""Golden greedy continuations of the bundled demo model (models/kjv-llama-4bit),
computed by transformers (LlamaForCausalLM, eager, CPU) on the dequantized MLX
4-bit weights, in fp32 and in bf16.

  python3 tools/train-demo/demo_goldens.py --model models/kjv-llama-4bit --out tests/fixtures/demo

writes golden.bin (format: tests/fixtures/README.md) and golden.json (prompts,
ids, decoded texts).  Needs torch, transformers, tokenizers, numpy.
What it is not: a sampler test; greedy only, up to 64 tokens, stopping after
the first eos id (included).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import mlxq  # noqa: E402
import stio  # noqa: E402
from goldfile import GoldenWriter  # noqa: E402

PROMPTS = [("plain", "Genesis 1:1"), ("plain", "John 3:16"), ("chat", "Recite John 3:16."),
           ("chat", "What does Genesis 1:1 say?"), ("plain", "In the beginning God")]
MAX_NEW = 64


def render_user(text):
    return "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n" % text


@torch.no_grad()
def greedy(model, ids, n, stop):
    seq = list(ids)
    out, margins = [], []
    for _ in range(n):
        lg = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
        top = torch.topk(lg, 2)
        t = int(top.indices[0])
        out.append(t)
        margins.append(float(top.values[0] - top.values[1]))
        seq.append(t)
        if t in stop:
            break
    return out, margins


def dequantized_dir(model_dir):
    """A temporary Hugging Face directory with the dequantized fp32 weights."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    q = cfg.pop("quantization")
    cfg.pop("quantization_config", None)
    bits, gs = q["bits"], q["group_size"]
    t = stio.read_torch(os.path.join(model_dir, "model.safetensors"))
    out = {}
    for k, v in t.items():
        if k.endswith(".scales") or k.endswith(".biases"):
            continue
        p = k[: -len(".weight")] if k.endswith(".weight") else None
        if p is not None and p + ".scales" in t:
            qq = q.get(p, {"bits": bits, "group_size": gs})
            out[k] = mlxq.dequantize_torch(v, t[p + ".scales"], t[p + ".biases"], qq["bits"], qq["group_size"])
        else:
            out[k] = v.float()
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(cfg, f)
    stio.write(os.path.join(tmp, "model.safetensors"), {k: stio.tensor_bytes(v) for k, v in out.items()},
               {"format": "pt"})
    return tmp


def write_goldens(model_dir, out_dir, log=print):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(os.path.join(model_dir, "generation_config.json")) as f:
        stop = tuple(json.load(f)["eos_token_id"])
    tmp = dequantized_dir(model_dir)
    try:
        m32 = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager").eval()
        m16 = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.bfloat16, attn_implementation="eager").eval()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(out_dir, exist_ok=True)
    w = GoldenWriter()
    info = {"model": os.path.basename(os.path.normpath(model_dir)),
            "reference": "transformers LlamaForCausalLM, eager, CPU, on the dequantized weights "
                         "(fp32; bf16 = loaded with dtype=bfloat16)",
            "max_new_tokens": MAX_NEW, "stop_ids": list(stop), "prompts": []}
    for i, (kind, text) in enumerate(PROMPTS):
        rendered = text if kind == "plain" else render_user(text)
        ids = tok.encode(rendered).ids
        g32, m32s = greedy(m32, ids, MAX_NEW, stop)
        g16, _ = greedy(m16, ids, MAX_NEW, stop)
        w.add_list("prompt.%d.ids" % i, "i32", [len(ids)], ids)
        w.add_list("prompt.%d.greedy.f32" % i, "i32", [len(g32)], g32)
        w.add_list("prompt.%d.greedy.bf16" % i, "i32", [len(g16)], g16)
        w.add_list("prompt.%d.greedy_margin.f32" % i, "f32", [len(m32s)], m32s)
        rec = {"kind": kind, "text": text, "rendered": rendered, "ids": ids,
               "greedy_f32_ids": g32, "greedy_f32_text": tok.decode(g32, skip_special_tokens=False),
               "greedy_bf16_text": tok.decode(g16, skip_special_tokens=False), "greedy_f32_eq_bf16": g32 == g16,
               "min_margin_f32": min(m32s)}
        info["prompts"].append(rec)
        log("demo golden %d (%s) %r -> %r" % (i, kind, text, rec["greedy_f32_text"]))
    w.add_list("meta.n_prompts", "i32", [1], [len(PROMPTS)])
    w.write(os.path.join(out_dir, "golden.bin"))
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        json.dump(info, f, indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(8)
    write_goldens(args.model, args.out)


if __name__ == "__main__":
    main()
