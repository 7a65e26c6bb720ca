#!/usr/bin/env python3
"""Records the intermediate values of transformers' Qwen3.5 forward pass (the
bf16 run of a fixture, as the goldens compute it) so that petrel's bf16
rounding points can be compared op by op.

  python3 tools/oracle/trace_qwen35.py --fixture tests/fixtures/qwen3_5_text --out DIR [--dtype bf16]

Loads the fixture like make_fixtures.py does (from_pretrained, eager
attention, on the CPU) and runs every prompt of its golden.bin once, with
forward hooks on the modules and wrappers around the module-level functions
of transformers.models.qwen3_5.modeling_qwen3_5 (causal_conv1d_fn, l2norm,
torch_chunk_gated_delta_rule, eager_attention_forward). Writes:

  DIR/trace.bin    golden format (tests/fixtures/README.md); names
                   p<prompt>.l<layer>.<what> (batch dimension dropped), dtype
                   as the reference holds it (bf16 or f32), and
                   p<prompt>.logits, p<prompt>.ids;
  DIR/trace.json   names, shapes, dtypes, the check that the traced logits
                   equal the fixture's stored logits, library versions and
                   the CPU capability torch reports;
  DIR/modeling_qwen3_5.py (or modeling_qwen3_5_moe.py)  the source of the
                   module that ran (the exact reference code, for reading the
                   rounding points).

<what> per Gated DeltaNet layer: x (layer input), ln1 (input_layernorm out),
qkv, z, b, a (projection outputs), conv (after conv1d + SiLU, [T, C]),
conv_pre (the conv1d module output before SiLU, if the module is called),
l2in.N / l2out.N (each l2norm call's input and output), dq, dk, dv, dg, dbeta
(the delta-rule inputs), core (its output), gnorm (the gated norm output),
out (out_proj), mid (the residual after the mixer), ln2, mlp, y (layer output).
Per attention layer: qp, kp, vp (projections), qn, kn (q/k norms), attn (the
attention output before the gate), gated (o_proj input), out, mid, ln2, mlp,
y. MoE blocks add router (the router's outputs), experts, shared and
shared_gate (module outputs, batch dimension kept). Then final (the final norm
output).

What it is not: a fixture generator; nothing it writes is committed as a
golden (the parity goldens stay those of make_fixtures.py)."""

import argparse
import inspect
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from goldfile import GoldenWriter  # noqa: E402
from goldfile import read as gold_read  # noqa: E402

REC = None          # {name: tensor} of the run in progress
CUR = {"layer": -1}


def log(*a):
    print(*a, flush=True)


def put(name, t):
    if REC is None or not torch.is_tensor(t):
        return
    key = "l%d.%s" % (CUR["layer"], name) if CUR["layer"] >= 0 else name
    k, i = key, 1
    while k in REC:
        k = "%s.%d" % (key, i)
        i += 1
    REC[k] = t.detach().clone()


def first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def patch_module_functions(M):
    """Wraps the module-level functions the Gated DeltaNet and the attention
    call; returns {name: (original, wrapper)}."""
    done = {}

    def wrap(fname, rec):
        orig = getattr(M, fname, None)
        if orig is None or not callable(orig):
            log("  (no %s in %s)" % (fname, M.__name__))
            return

        def w(*a, **k):
            out = orig(*a, **k)
            try:
                rec(a, k, out)
            except Exception as e:  # recording must never change the run
                log("  record %s failed: %r" % (fname, e))
            return out
        setattr(M, fname, w)
        done[fname] = (orig, w)

    def rec_conv(a, k, out):
        put("conv", first(out)[0].transpose(0, 1))  # [B, C, T] -> [T, C]

    def rec_l2(a, k, out):
        put("l2in", a[0] if a else k.get("x"))
        put("l2out", out)

    def rec_delta(a, k, out):
        names = ["query", "key", "value", "g", "beta"]
        vals = {}
        for i, n in enumerate(names):
            if i < len(a):
                vals[n] = a[i]
            elif n in k:
                vals[n] = k[n]
        for n, short in zip(names, ["dq", "dk", "dv", "dg", "dbeta"]):
            if n in vals and torch.is_tensor(vals[n]):
                put(short, vals[n][0])
        put("core", first(out)[0])

    def rec_attn(a, k, out):
        put("attn", first(out)[0])

    wrap("causal_conv1d_fn", rec_conv)
    wrap("l2norm", rec_l2)
    wrap("torch_chunk_gated_delta_rule", rec_delta)
    wrap("torch_recurrent_gated_delta_rule", rec_delta)
    wrap("eager_attention_forward", rec_attn)
    return done


def rebind_instance_attrs(model, patched):
    """Older modeling code stores the functions on each layer in __init__
    (self.chunk_gated_delta_rule = ...): point those at the wrappers too."""
    n = 0
    originals = {id(o): w for o, w in patched.values()}
    for mod in model.modules():
        for name, val in list(vars(mod).items()):
            if callable(val) and id(val) in originals:
                setattr(mod, name, originals[id(val)])
                n += 1
        for cls in type(mod).__mro__:  # ... or on the class
            for name, val in list(vars(cls).items()):
                fn = getattr(val, "__func__", val)
                if callable(fn) and id(fn) in originals:
                    setattr(cls, name, staticmethod(originals[id(fn)]))
                    n += 1
    return n


def add_hooks(model):
    hooks = []
    layers = None
    for path in ("model.language_model", "model"):
        m = model
        ok = True
        for a in path.split("."):
            if hasattr(m, a):
                m = getattr(m, a)
            else:
                ok = False
                break
        if ok and hasattr(m, "layers"):
            layers, final_norm = m.layers, m.norm
            break
    assert layers is not None, "decoder layers not found"

    def out_hook(name):
        return lambda mod, inp, out: put(name, first(out)[0])

    def in_hook(name):
        return lambda mod, inp: put(name, first(inp)[0])

    for li, layer in enumerate(layers):
        def enter(mod, args, kwargs, li=li):
            CUR["layer"] = li
            put("x", (args[0] if args else kwargs["hidden_states"])[0])

        def leave(mod, args, kwargs, out, li=li):
            put("y", first(out)[0])
            CUR["layer"] = -1
        hooks.append(layer.register_forward_pre_hook(enter, with_kwargs=True))
        hooks.append(layer.register_forward_hook(leave, with_kwargs=True))
        hooks.append(layer.input_layernorm.register_forward_hook(out_hook("ln1")))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(in_hook("mid")))
        hooks.append(layer.post_attention_layernorm.register_forward_hook(out_hook("ln2")))
        hooks.append(layer.mlp.register_forward_hook(out_hook("mlp")))
        for n, short in (("gate", "router"), ("experts", "experts"), ("shared_expert", "shared"),
                         ("shared_expert_gate", "shared_gate")):  # MoE blocks
            sub = getattr(layer.mlp, n, None)
            if isinstance(sub, torch.nn.Module):
                hooks.append(sub.register_forward_hook(
                    lambda mod, inp, out, short=short: put(short, first(out))))
        la = getattr(layer, "linear_attn", None)
        if la is not None:
            for n, short in (("in_proj_qkv", "qkv"), ("in_proj_z", "z"), ("in_proj_b", "b"), ("in_proj_a", "a"),
                             ("out_proj", "out"), ("conv1d", "conv_pre")):
                if hasattr(la, n):
                    hooks.append(getattr(la, n).register_forward_hook(out_hook(short)))

            def norm_pre(mod, args, kwargs):
                hs = args[0] if args else kwargs.get("hidden_states")
                gate = args[1] if len(args) > 1 else kwargs.get("gate")
                put("norm_in", hs)
                put("norm_gate", gate)
            hooks.append(la.norm.register_forward_pre_hook(norm_pre, with_kwargs=True))
            hooks.append(la.norm.register_forward_hook(lambda mod, inp, out: put("gnorm", first(out))))
        sa = getattr(layer, "self_attn", None)
        if sa is not None:
            for n, short in (("q_proj", "qp"), ("k_proj", "kp"), ("v_proj", "vp"), ("q_norm", "qn"),
                             ("k_norm", "kn"), ("o_proj", "out")):
                if hasattr(sa, n):
                    hooks.append(getattr(sa, n).register_forward_hook(out_hook(short)))
            hooks.append(sa.o_proj.register_forward_pre_hook(in_hook("gated")))
    hooks.append(final_norm.register_forward_hook(out_hook("final")))
    return hooks


def tensor_entry(w, name, t):
    t = t.detach().cpu()
    while t.dim() > 4:
        t = t.reshape(-1, *t.shape[-3:])
    if t.dim() == 0:
        t = t.reshape(1)
    if t.dtype == torch.bfloat16:
        w.add_tensor(name, t.contiguous(), "bf16")
    else:
        w.add_tensor(name, t.float().contiguous(), "f32")


def main():
    global REC
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    info = {"transformers": transformers.__version__, "torch": torch.__version__,
            "cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")(),
            "mkldnn": bool(torch.backends.mkldnn.is_available()), "threads": args.threads,
            "fixture": args.fixture, "dtype": args.dtype}
    log("trace:", json.dumps(info))
    dt = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.fixture, dtype=dt, attn_implementation="eager").eval()
    info["model_class"] = type(model).__name__
    # the modeling module of the loaded class (qwen3_5 or qwen3_5_moe): its source, and its functions wrapped
    # (module globals are looked up at call time, so wrapping after loading is enough)
    M = sys.modules[type(model).__module__]
    info["module"] = M.__name__
    with open(os.path.join(args.out, M.__name__.split(".")[-1] + ".py"), "w") as f:
        f.write(inspect.getsource(M))
    patched = patch_module_functions(M)
    info["patched"] = sorted(patched)
    info["rebound_instance_attrs"] = rebind_instance_attrs(model, patched)
    info["param_dtypes"] = sorted({"%s:%s" % (n.split(".")[-2] if "." in n else n, str(p.dtype))
                                   for n, p in model.named_parameters() if p.dtype != dt})
    add_hooks(model)
    gold = gold_read(os.path.join(args.fixture, "golden.bin"))
    n_prompts = struct.unpack("<i", gold["meta.n_prompts"][2])[0]
    w = GoldenWriter()
    info["prompts"] = []
    key = "logits.bf16" if args.dtype == "bf16" else "logits.f32"
    for p in range(n_prompts):
        dtype_s, shape, raw = gold["prompt.%d.ids" % p]
        ids = list(struct.unpack("<%di" % shape[0], raw))
        REC = {}
        CUR["layer"] = -1
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0]
        rec, REC = REC, None
        gd, gshape, graw = gold["prompt.%d.%s" % (p, key)]
        if gd == "bf16":
            g = torch.frombuffer(bytearray(graw), dtype=torch.int16).view(torch.bfloat16).float()
        else:
            g = torch.frombuffer(bytearray(graw), dtype=torch.float32)
        g = g.reshape(gshape)
        diff = float((lg.float() - g).abs().max())
        log("  prompt %d (%d ids): %d records, traced logits vs stored golden max|d| %g" % (p, len(ids), len(rec),
                                                                                            diff))
        w.add_list("p%d.ids" % p, "i32", [len(ids)], ids)
        tensor_entry(w, "p%d.logits" % p, lg)
        names = []
        for k, t in rec.items():
            tensor_entry(w, "p%d.%s" % (p, k), t)
            names.append([k, list(t.shape), str(t.dtype)])
        info["prompts"].append({"n": len(ids), "logits_vs_golden_max_abs_diff": diff, "records": names})
    w.add_list("meta.n_prompts", "i32", [1], [n_prompts])
    w.write(os.path.join(args.out, "trace.bin"))
    with open(os.path.join(args.out, "trace.json"), "w") as f:
        json.dump(info, f, indent=1)
    log("wrote", args.out, "records per prompt:", [len(x["records"]) for x in info["prompts"]])


if __name__ == "__main__":
    main()
