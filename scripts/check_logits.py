#!/usr/bin/env python3
"""Compares the C model runner with Hugging Face transformers on the same GGUF file and writes
the golden fixture tests/model/golden_smollm2.json.

transformers dequantizes the GGUF to fp32 and runs its own llama implementation; the C runner
keeps the weights quantized and dots them row by row. Both see identical weight values, so the
logits should agree to fp32 rounding of the accumulation order.

Recorded in the fixture:
  prompt, prompt_ids (ours, which must equal transformers'), greedy tokens from both, the max
  |logit difference| over the prompt's last position and each greedy step (teacher-forced on our
  tokens), and tokenizer cases (text -> transformers ids) that the C tokenizer test replays.

Usage: scripts/check_logits.py --dump BUILD/tests/model/model_dump_logits [--model GGUF|HF_DIR]
       [--out tests/model/golden_smollm2.json] [--steps 16]
Needs: pip install torch transformers gguf accelerate (CPU torch is enough).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
          "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France? Answer in one "
          "sentence.<|im_end|>\n<|im_start|>assistant\n")

TOKENIZER_CASES = [
    "Hello world",
    "The year 2024 had 365 days, or 8784 hours.",
    "it's, they're, we've, I'll, he'd, I'M, DON'T",
    "  leading spaces and   inner   runs  ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "naïve café résumé Ünïcödé",
    "日本語のテキストと中文字符",
    "emoji 🙂🚀 and symbols ©®™ ≤≥ ∑∫",
    "code: def f(x):\n    return x ** 2  # square\n",
    "<|im_start|>user\nhi<|im_end|>",
    "mixed123abc 4.5e-3 0x1F -42",
    "Ελληνικά και русский текст",
    "trailing space ",
    "",
]


def find_model():
    env = os.environ.get("MI_MODEL")
    if env and os.path.exists(env):
        return env
    out = subprocess.run(["bash", os.path.join(HERE, "fetch_model.sh")], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()
    return out[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True, help="path of the model_dump_logits test program")
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "model", "golden_smollm2.json"))
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_path = args.model or find_model()
    # a GGUF file, or a Hugging Face directory (config.json, safetensors, tokenizer.json)
    if os.path.isdir(model_path):
        d, f, load_kw = model_path, os.path.basename(model_path.rstrip("/")), {}
    else:
        d, f = os.path.dirname(model_path), os.path.basename(model_path)
        load_kw = {"gguf_file": f}

    with tempfile.TemporaryDirectory() as tmp:
        logits_path = os.path.join(tmp, "logits.f32")
        res = subprocess.run([args.dump, model_path, PROMPT, str(args.steps), logits_path] +
                             TOKENIZER_CASES, check=True, capture_output=True, text=True)
        ours = json.loads(res.stdout)
        vocab = ours["vocab"]
        our_logits = np.fromfile(logits_path, dtype=np.float32).reshape(args.steps, vocab)

    tok = AutoTokenizer.from_pretrained(d, **load_kw)
    hf_prompt_ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    cases = []
    tok_mismatch = 0
    for text, our_ids in zip(TOKENIZER_CASES, ours["tokenized"]):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        cases.append({"text": text, "ids": ids})
        if ids != our_ids:
            tok_mismatch += 1
            print(f"tokenizer mismatch on {text!r}:\n  hf   {ids}\n  ours {our_ids}")
    if hf_prompt_ids != ours["prompt_ids"]:
        print("prompt ids differ:\n  hf  ", hf_prompt_ids, "\n  ours", ours["prompt_ids"])

    # fp32 compute over the stored weights (bf16 checkpoints are widened exactly)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **load_kw)
    model.eval()
    n = len(ours["prompt_ids"])
    seq = torch.tensor([ours["prompt_ids"] + ours["greedy"][:-1]])
    with torch.no_grad():
        hf_logits = model(seq).logits[0, n - 1:, :].float().numpy()
        gen = model.generate(torch.tensor([hf_prompt_ids]), max_new_tokens=args.steps,
                             do_sample=False, attention_mask=torch.ones(1, len(hf_prompt_ids),
                                                                         dtype=torch.long))
    hf_greedy = gen[0, len(hf_prompt_ids):].tolist()
    # transformers stops at the end-of-sequence token; ours ran a fixed number of steps.
    ours_greedy = ours["greedy"][:len(hf_greedy)]
    diff = np.abs(hf_logits - our_logits)
    max_diff = float(diff.max())
    per_step = [float(x) for x in diff.max(axis=1)]
    scale = float(np.abs(hf_logits).max())

    fixture = {
        "model": f,
        "prompt": PROMPT,
        "prompt_ids": ours["prompt_ids"],
        "hf_prompt_ids": hf_prompt_ids,
        "greedy_ours": ours_greedy,
        "greedy_hf": hf_greedy,
        "greedy_text": tok.decode(hf_greedy),
        "max_logit_diff": max_diff,
        "max_logit_diff_per_step": per_step,
        "max_abs_logit": scale,
        "tokenizer_cases": cases,
        "generator": "scripts/check_logits.py (transformers "
                     + __import__("transformers").__version__ + ", torch "
                     + torch.__version__ + ")",
    }
    text = json.dumps(fixture, ensure_ascii=False, indent=1)
    # one line per number list keeps the fixture readable in diffs
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda mt: "[" + ", ".join(x.strip() for x in mt.group(1).split(",")
                                             if x.strip()) + "]", text)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    print(f"prompt tokens {n}; greedy ours {ours_greedy}\n"
          f"              greedy hf   {hf_greedy}\n"
          f"max |logit diff| {max_diff:.3e} (max |logit| {scale:.1f}); "
          f"tokenizer mismatches {tok_mismatch}/{len(cases)}; wrote {args.out}")
    ok = (ours_greedy == hf_greedy and hf_prompt_ids == ours["prompt_ids"]
          and tok_mismatch == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
