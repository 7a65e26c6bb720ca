#!/usr/bin/env python3
"""Trains petrel's bundled demo model: a ~28M-parameter Llama on the King James
Bible (public domain; Debian package bible-kjv-text), with a byte-level BPE
tokenizer (8192 tokens) and ChatML turns so that it answers chat requests for a
book, chapter and verse.  Ends as an MLX 4-bit checkpoint (group size 32) plus
golden greedy continuations computed by transformers on the dequantized
weights.

  python3 tools/train-demo/train.py --text kjv.txt --out DIR [--seconds 210]

writes DIR/model/ (the checkpoint for models/<name>/), DIR/golden/ (for
tests/fixtures/demo/) and DIR/train_log.json.  Runs on one CUDA GPU (bf16
autocast); tokenizer training, quantization and goldens run on the CPU.
kjv.txt is the output of tools/train-demo/extract_kjv.sh.
What it is not: a general-purpose model; it recites (and misremembers) verses.
"""

import argparse
import json
import math
import os
import random
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

import demo_goldens  # noqa: E402
import mlxq  # noqa: E402
import stio  # noqa: E402

BOOKS = [("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"), ("Deu", "Deuteronomy"),
         ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"), ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"),
         ("1Ki", "1 Kings"), ("2Ki", "2 Kings"), ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"),
         ("Ezra", "Ezra"), ("Neh", "Nehemiah"), ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"),
         ("Prv", "Proverbs"), ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
         ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
         ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"), ("Mic", "Micah"),
         ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"),
         ("Mal", "Malachi"), ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"),
         ("Acts", "Acts"), ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"),
         ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
         ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"), ("2Tim", "2 Timothy"),
         ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "1 Peter"),
         ("2Pet", "2 Peter"), ("1Jn", "1 John"), ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"),
         ("Rev", "Revelation")]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOT, IM_START, IM_END = 0, 1, 2
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
ASKS = ["Recite {ref}.", "What does {ref} say?", "Quote {ref}.", "Give me {ref}.", "{ref}", "Please recite {ref}.",
        "What is written in {ref}?", "Read {ref} to me."]
SYSTEMS = ["You are a helpful assistant.", "You recite the King James Bible.", "Answer with the verse."]
MODEL_CFG = dict(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=64, max_position_embeddings=512, rms_norm_eps=1e-5,
                 rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=[IM_END, EOT],
                 pad_token_id=EOT)
SEQ = 512
GROUP = 32
GOLDEN_MAX = 64


def render(messages, add_generation_prompt):
    s = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in messages)
    return s + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def parse(path):
    names = dict(BOOKS)
    rx = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
    verses = []
    with open(path, encoding="utf-8") as f:
        for ln in f:
            m = rx.match(ln.rstrip("\n"))
            if not m:
                continue
            verses.append((names[m.group(1)], int(m.group(2)), int(m.group(3)), m.group(4).strip()))
    assert len(verses) == 31102, len(verses)
    return verses


def documents(verses, rng):
    """Plain chapters ("Genesis 1:1 In the beginning ...", one verse a line) and
    ChatML conversations asking for a verse, a short range or a short chapter."""
    chapters = {}
    for b, c, v, t in verses:
        chapters.setdefault((b, c), []).append((v, t))
    docs = []
    for (b, c), vs in chapters.items():
        # Twice: with a reference per verse, and as running text (so that a
        # plain prompt such as "In the beginning God" continues the verse).
        docs.append("".join("%s %d:%d %s\n" % (b, c, v, t) for v, t in vs))
        docs.append("".join("%s\n" % t for v, t in vs))
    idx = {(b, c, v): i for i, (b, c, v, _) in enumerate(verses)}
    n_chat = 0
    for rep in range(2):
        for i, (b, c, v, t) in enumerate(verses):
            r = rng.random()
            if r < 0.75:
                ref, ans = "%s %d:%d" % (b, c, v), t
            elif r < 0.95:
                n = rng.randint(2, 4)
                span = [verses[j] for j in range(i, min(i + n, len(verses))) if verses[j][0] == b and verses[j][1] == c]
                if len(span) < 2:
                    ref, ans = "%s %d:%d" % (b, c, v), t
                else:
                    ref = "%s %d:%d-%d" % (b, c, v, span[-1][2])
                    ans = " ".join(x[3] for x in span)
            else:
                vs = chapters[(b, c)]
                if v != 1 or len(vs) > 12:
                    continue
                ref = "%s %d" % (b, c) if b != "Psalms" else "Psalm %d" % c
                ans = "\n".join("%d %s" % (vv, tt) for vv, tt in vs)
            msgs = []
            if rng.random() < 0.25:
                msgs.append({"role": "system", "content": rng.choice(SYSTEMS)})
            msgs.append({"role": "user", "content": rng.choice(ASKS).format(ref=ref)})
            msgs.append({"role": "assistant", "content": ans})
            docs.append(render(msgs, False))
            n_chat += 1
    del idx
    return docs, len(chapters), n_chat


def build_tokenizer(docs, out_path, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    tok.save(out_path)
    return tok


def write_tokenizer_files(d, tok_json):
    import shutil
    shutil.copy(tok_json, os.path.join(d, "tokenizer.json"))
    added = {str(i): {"content": s, "lstrip": False, "rstrip": False, "normalized": False,
                      "single_word": False, "special": True} for i, s in enumerate(SPECIALS)}
    tc = {"add_bos_token": False, "add_eos_token": False, "added_tokens_decoder": added, "bos_token": None,
          "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML,
          "model_max_length": SEQ, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tc, f, indent=2)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [IM_END, EOT], "pad_token_id": EOT, "do_sample": False}, f, indent=2)


def train(model, stream, starts, seconds, batch, lr_peak, log):
    """Half of each batch starts at a document start (as a prompt does), half
    at a random position."""
    dev = torch.device("cuda")
    model.to(dev).train()
    data = torch.tensor(stream, dtype=torch.long, device=dev)
    n = data.numel() - SEQ - 1
    starts = torch.tensor([s for s in starts if s < n], dtype=torch.long, device=dev)
    opt = torch.optim.AdamW(model.parameters(), lr=lr_peak, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    g = torch.Generator(device=dev).manual_seed(0)
    t0 = time.time()
    step, losses = 0, []
    ar = torch.arange(SEQ + 1, device=dev)
    while True:
        el = time.time() - t0
        if el > seconds:
            break
        frac = el / seconds
        lr = lr_peak * min(1.0, (step + 1) / 200) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        for pg in opt.param_groups:
            pg["lr"] = lr
        off = torch.randint(0, n, (batch, 1), device=dev, generator=g)
        at_doc = starts[torch.randint(0, starts.numel(), (batch // 2, 1), device=dev, generator=g)]
        off = torch.cat([at_doc, off[batch // 2:]])
        seq = data[off + ar]
        x, y = seq[:, :-1], seq[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            losses.append((step, round(time.time() - t0, 1), float(loss.detach())))
            if step % 500 == 0:
                log("step %d t=%.0fs loss %.4f lr %.2e" % (step, time.time() - t0, float(loss.detach()), lr))
    model.eval()
    # Final loss: mean over 20 fresh batches without updates.
    with torch.no_grad():
        tot = 0.0
        for _ in range(20):
            off = torch.randint(0, n, (batch, 1), device=dev, generator=g)
            seq = data[off + ar]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids=seq[:, :-1], use_cache=False).logits
            tot += float(torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                             seq[:, 1:].reshape(-1)))
    model.cpu()
    return step, losses, tot / 20


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=210)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    logs = []

    def log(s):
        print(s, flush=True)
        logs.append(s)
    torch.manual_seed(0)
    torch.set_num_threads(6)
    rng = random.Random(0)
    t_all = time.time()
    verses = parse(args.text)
    docs, n_chap, n_chat = documents(verses, rng)
    log("documents: %d plain chapters (each twice), %d chat conversations" % (n_chap, n_chat))
    mdir = os.path.join(args.out, "model")
    gdir = os.path.join(args.out, "golden")
    os.makedirs(mdir, exist_ok=True)
    os.makedirs(gdir, exist_ok=True)
    tok_json = os.path.join(args.out, "tokenizer.json")
    tok = build_tokenizer(docs, tok_json, MODEL_CFG["vocab_size"])
    log("tokenizer: %d tokens (%.0fs)" % (tok.get_vocab_size(), time.time() - t_all))
    rng.shuffle(docs)
    stream, starts = [], []
    for enc in tok.encode_batch(docs):
        starts.append(len(stream))
        stream.extend(enc.ids)
        stream.append(EOT)
    log("stream: %d tokens" % len(stream))
    cfg = LlamaConfig(**MODEL_CFG)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    n_params = sum(p.numel() for p in model.parameters())
    log("model: %d parameters" % n_params)
    steps, losses, final_loss = train(model, stream, starts, args.seconds, args.batch, args.lr, log)
    log("trained %d steps, final loss %.4f (t=%.0fs)" % (steps, final_loss, time.time() - t_all))
    # bf16 weights, then MLX 4-bit g32 (every Linear and the tied embedding).
    sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    entries = {}
    for k, v in sorted(sd.items()):
        if k.endswith(".weight") and v.ndim == 2 and v.shape[-1] % GROUP == 0:
            p = k[: -len(".weight")]
            packed, s, b = mlxq.quantize_torch(v, 4, GROUP)
            entries[k] = stio.u32_bytes(packed)
            entries[p + ".scales"] = stio.tensor_bytes(s)
            entries[p + ".biases"] = stio.tensor_bytes(b)
        else:
            entries[k] = stio.tensor_bytes(v)
    stio.write(os.path.join(mdir, "model.safetensors"), entries, {"format": "mlx"})
    cfgd = cfg.to_dict()
    for k in ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "_attn_implementation_autoset",
              "id2label", "label2id", "chunk_size_feed_forward", "is_encoder_decoder", "output_attentions",
              "output_hidden_states", "problem_type", "return_dict", "pretraining_tp"):
        cfgd.pop(k, None)
    cfgd["architectures"] = ["LlamaForCausalLM"]
    cfgd["torch_dtype"] = "bfloat16"
    q = {"group_size": GROUP, "bits": 4, "mode": "affine"}
    cfgd["quantization"] = q
    cfgd["quantization_config"] = q
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump(cfgd, f, indent=4, sort_keys=True)
    write_tokenizer_files(mdir, tok_json)
    # Goldens: transformers (eager, CPU) on the dequantized weights.
    demo_goldens.write_goldens(mdir, gdir, log)
    # Unquantized comparison for the README.
    model.float().eval()
    for kind, text in demo_goldens.PROMPTS:
        rendered = text if kind == "plain" else render([{"role": "user", "content": text}], True)
        g, _ = greedy(model, tok.encode(rendered).ids, GOLDEN_MAX, (IM_END, EOT))
        log("unquantized %r -> %r" % (text, tok.decode(g, skip_special_tokens=False)))
    with open(os.path.join(args.out, "train_log.json"), "w") as f:
        json.dump({"steps": steps, "final_loss": final_loss, "n_params": n_params, "losses": losses,
                   "batch": args.batch, "seq": SEQ, "seconds": args.seconds, "lr": args.lr,
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(0), "log": logs, "config": MODEL_CFG}, f, indent=1)
    log("done in %.0fs" % (time.time() - t_all))


if __name__ == "__main__":
    main()
