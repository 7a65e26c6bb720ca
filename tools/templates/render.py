#!/usr/bin/env python3
"""Renders chat templates with Python's jinja2 in the environment transformers'
apply_chat_template uses (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, tojson with ensure_ascii=False, raise_exception,
strftime_now pinned). Produces the goldens petrel's template tests compare
against.

usage:
  render.py --check GOLDENS.json TEMPLATE_DIR     compare with existing goldens
  render.py --fixtures DIR     render DIR/*.jinja over DIR/inputs/*.json into
        DIR/goldens/TEMPLATE__INPUT.out (the output) or .err (the error)
  render.py --features CASES.json OUT   render each {"name", "template",
        "vars"} case of CASES.json into OUT (adds "output" or "error")
  render.py --shared-extra TEMPLATE_DIR FIXTURES_DIR   render every template
        in TEMPLATE_DIR (../shared/data/chat-templates) over FIXTURES_DIR's
        inputs/*.json and extra-conversations.json into
        FIXTURES_DIR/shared-extra-goldens.json
  render.py --cases CASES.json TEMPLATE_DIR OUT   render every template in
        TEMPLATE_DIR over every case in CASES.json ({"name": {vars...}}) and
        write OUT (a JSON list of {template, case, input, output|error})
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2026, 3, 14, 15, 9, 26)


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, variables):
    """Returns ("output", text) or ("error", "Type: message") or ("compile_error", msg)."""
    try:
        tmpl = env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return "compile_error", e.message
    except SyntaxError as e:  # e.g. {% break %} outside a loop reaches Python's compiler
        return "compile_error", f"{type(e).__name__}: {e.msg}"
    try:
        return "output", tmpl.render(**variables)
    except Exception as e:  # the reference records every refusal the same way
        return "error", f"{type(e).__name__}: {e}"


def main():
    env = make_env()
    if sys.argv[1] == "--check":
        goldens = json.load(open(sys.argv[2]))
        bad = 0
        for r in goldens:
            src = open(os.path.join(sys.argv[3], r["template"])).read()
            if "compile_error" in r:
                kind, val = render(env, src, {})
                ok = kind == "compile_error"
            else:
                kind, val = render(env, src, r["input"])
                ok = (kind == "output" and val == r.get("output")) or (kind == "error" and "error" in r)
            if not ok:
                bad += 1
                print("MISMATCH", r["template"], r["case"], kind, repr(val)[:200])
        print(len(goldens) - bad, "of", len(goldens), "match")
        return 1 if bad else 0
    if sys.argv[1] == "--fixtures":
        d = sys.argv[2]
        gd = os.path.join(d, "goldens")
        os.makedirs(gd, exist_ok=True)
        for f in os.listdir(gd):
            os.unlink(os.path.join(gd, f))
        for name in sorted(os.listdir(d)):
            if not name.endswith(".jinja"):
                continue
            src = open(os.path.join(d, name), encoding="utf-8").read()
            for inp in sorted(os.listdir(os.path.join(d, "inputs"))):
                variables = json.load(open(os.path.join(d, "inputs", inp), encoding="utf-8"))
                kind, val = render(env, src, variables)
                stem = name[:-6] + "__" + inp[:-5]
                ext = ".out" if kind == "output" else ".err"
                with open(os.path.join(gd, stem + ext), "w", encoding="utf-8", newline="") as f:
                    f.write(val)
        return 0
    if sys.argv[1] == "--features":
        cases = json.load(open(sys.argv[2], encoding="utf-8"))
        for case in cases:
            kind, val = render(env, case["template"], case.get("vars", {}))
            for k in ("output", "error", "compile_error"):
                case.pop(k, None)
            case[kind] = val
        with open(sys.argv[3], "w", encoding="utf-8") as f:
            json.dump(cases, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return 0
    if sys.argv[1] == "--shared-extra":
        tdir, fdir = sys.argv[2], sys.argv[3]
        inputs = {}
        for inp in sorted(os.listdir(os.path.join(fdir, "inputs"))):
            inputs[inp[:-5]] = json.load(open(os.path.join(fdir, "inputs", inp), encoding="utf-8"))
        inputs.update(json.load(open(os.path.join(fdir, "extra-conversations.json"), encoding="utf-8")))
        records = []
        for name in sorted(os.listdir(tdir)):
            if not name.endswith(".jinja"):
                continue
            src = open(os.path.join(tdir, name), encoding="utf-8").read()
            for case, variables in inputs.items():
                kind, val = render(env, src, variables)
                records.append({"template": name, "case": case, kind: val})
        out = {"about": "the 65 templates of ../shared/data/chat-templates rendered over these inputs by Python's"
                        " jinja2 in apply_chat_template's environment (tools/templates/render.py --shared-extra);"
                        " strftime_now pinned to 2026-03-14T15:09:26; each input is JSON text (kept as text so 1.0"
                        " stays a float)",
               "inputs": {k: json.dumps(v, ensure_ascii=False) for k, v in inputs.items()},
               "records": records}
        with open(os.path.join(fdir, "shared-extra-goldens.json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=0)
        return 0
    if sys.argv[1] == "--cases":
        cases = json.load(open(sys.argv[2]))
        out = []
        for name in sorted(os.listdir(sys.argv[3])):
            if not name.endswith(".jinja"):
                continue
            src = open(os.path.join(sys.argv[3], name)).read()
            for case, variables in cases.items():
                kind, val = render(env, src, variables)
                rec = {"template": name, "case": case, "input": variables, kind: val}
                out.append(rec)
        with open(sys.argv[4], "w") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
