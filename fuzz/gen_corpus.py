#!/usr/bin/env python3
"""Writes the generated seeds of fuzz/corpus/ (small models and tokenizers the loaders accept).

    python3 fuzz/gen_corpus.py          # rewrites the generated files; the others are kept

The files are deterministic (fixed seed), so running it again changes nothing. Seeds copied from
the tests (pattern configs) are copied by the same script.
"""
import json
import random
import shutil
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
HF_SEP = b"\n--mi-fuzz-file--\n"  # fuzz_hf.c's separator

rng = random.Random(1)

# ---- GPT-2 byte-level vocabulary: 256 byte tokens, a few merges, specials ------------------


def byte_to_cp():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2C = byte_to_cp()
MERGES = ["h e", "l l", "he ll", "Ġ w", "o r", "Ġ t", "Ġt he", "i n", "1 2"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bpe_vocab():
    toks = [B2C[b] for b in range(256)]
    for m in MERGES:
        a, b = m.split(" ")
        toks.append(a + b)
    return toks + SPECIALS


# ---- SentencePiece vocabulary: <unk> <s> </s>, byte fallback, pieces with scores -------------

SPM_PIECES = ["▁", "▁h", "e", "l", "o", "▁he", "ll", "▁hell", "▁hello", "w", "r", "d", "▁w",
              "or", "▁wor", "▁world", "1", "2", "3", "a", "b", "c", "é", "中"]


def spm_vocab():
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + SPM_PIECES
    types = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(SPM_PIECES))]
    return toks, types, scores


# ---- tensor bytes --------------------------------------------------------------------------

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30
BLOCK = {Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
         Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210)}


def f16(v):
    return struct.pack("<e", v)


def tensor_bytes(gtype, rows, cols, scale=0.1, offset=0.0):
    n = rows * cols
    if gtype == F32:
        return struct.pack("<%df" % n, *[offset + scale * rng.uniform(-1, 1) for _ in range(n)])
    if gtype == F16:
        return b"".join(f16(offset + scale * rng.uniform(-1, 1)) for _ in range(n))
    if gtype == BF16:
        return b"".join(struct.pack("<f", offset + scale * rng.uniform(-1, 1))[2:]
                        for _ in range(n))
    per, size = BLOCK[gtype]
    assert cols % per == 0
    out = bytearray()
    for _ in range(n // per):
        b = bytearray(rng.getrandbits(8) for _ in range(size))
        d = f16(scale / 8)
        if gtype in (Q4_0, Q5_0, Q8_0):
            b[0:2] = d
        elif gtype in (Q4_1, Q5_1):
            b[0:2] = d
            b[2:4] = f16(-scale)
        elif gtype in (Q4_K, Q5_K):
            b[0:2] = d
            b[2:4] = f16(scale / 16)
        elif gtype == Q6_K:
            b[208:210] = f16(scale / 64)
        out += b
    return bytes(out)


# ---- GGUF ----------------------------------------------------------------------------------

U32, I32, GF32, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors):
    """kvs: [(key, type, value)], value a list for arrays ((elem_type, list)); tensors:
    [(name, gtype, ne0, ne1 or 0, bytes)]."""
    out = bytearray(struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(kvs)))
    for key, t, v in kvs:
        out += gstr(key) + struct.pack("<I", t)
        if t == U32:
            out += struct.pack("<I", v)
        elif t == I32:
            out += struct.pack("<i", v)
        elif t == GF32:
            out += struct.pack("<f", v)
        elif t == BOOL:
            out += struct.pack("<B", v)
        elif t == STR:
            out += gstr(v)
        else:
            et, items = v
            out += struct.pack("<IQ", et, len(items))
            for it in items:
                out += (gstr(it) if et == STR else struct.pack("<i", it) if et == I32
                        else struct.pack("<f", it))
    off = 0
    for name, gtype, ne0, ne1, data in tensors:
        nd = 2 if ne1 else 1
        out += gstr(name) + struct.pack("<I", nd) + struct.pack("<Q", ne0)
        if ne1:
            out += struct.pack("<Q", ne1)
        out += struct.pack("<IQ", gtype, off)
        off += (len(data) + 31) // 32 * 32
    out += b"\0" * ((32 - len(out) % 32) % 32)
    for *_, data in tensors:
        out += data + b"\0" * ((32 - len(data) % 32) % 32)
    return bytes(out)


def gguf_model(arch, types, tokenizer, hidden=32, heads=2, kv=1, ffn=32, layers=1, extra=()):
    hd = hidden // heads
    kvs = [("general.architecture", STR, arch), ("general.name", STR, "tiny"),
           (arch + ".block_count", U32, layers), (arch + ".embedding_length", U32, hidden),
           (arch + ".feed_forward_length", U32, ffn), (arch + ".attention.head_count", U32, heads),
           (arch + ".attention.head_count_kv", U32, kv), (arch + ".context_length", U32, 256),
           (arch + ".attention.layer_norm_rms_epsilon", GF32, 1e-5),
           (arch + ".rope.freq_base", GF32, 10000.0)] + list(extra)
    if tokenizer == "gpt2":
        vocab = bpe_vocab()
        kvs += [("tokenizer.ggml.model", STR, "gpt2"), ("tokenizer.ggml.pre", STR, "smollm"),
                ("tokenizer.ggml.tokens", ARR, (STR, vocab)),
                ("tokenizer.ggml.token_type", ARR, (I32, [1] * (len(vocab) - 3) + [3] * 3)),
                ("tokenizer.ggml.merges", ARR, (STR, MERGES)),
                ("tokenizer.ggml.bos_token_id", U32, len(vocab) - 2),
                ("tokenizer.ggml.eos_token_id", U32, len(vocab) - 1),
                ("tokenizer.ggml.add_bos_token", BOOL, 0)]
    else:
        vocab, ttypes, scores = spm_vocab()
        kvs += [("tokenizer.ggml.model", STR, "llama"),
                ("tokenizer.ggml.tokens", ARR, (STR, vocab)),
                ("tokenizer.ggml.token_type", ARR, (I32, ttypes)),
                ("tokenizer.ggml.scores", ARR, (GF32, scores)),
                ("tokenizer.ggml.bos_token_id", U32, 1), ("tokenizer.ggml.eos_token_id", U32, 2),
                ("tokenizer.ggml.unknown_token_id", U32, 0)]
    nv = len(vocab)
    t = [("token_embd.weight", types["embd"], hidden, nv,
          tensor_bytes(types["embd"], nv, hidden, 0.5)),
         ("output_norm.weight", F32, hidden, 0, tensor_bytes(F32, 1, hidden, 0.1, 1.0))]
    if "out" in types:
        t.append(("output.weight", types["out"], hidden, nv, tensor_bytes(types["out"], nv, hidden)))
    for layer in range(layers):
        def w(name, gtype, rows, cols, scale=0.2, offset=0.0):
            t.append(("blk.%d.%s" % (layer, name), gtype, cols, 0 if rows == 1 else rows,
                      tensor_bytes(gtype, rows, cols, scale, offset)))
        w("attn_norm.weight", F32, 1, hidden, 0.1, 1.0)
        w("ffn_norm.weight", F32, 1, hidden, 0.1, 1.0)
        w("attn_q.weight", types["q"], hidden, hidden)
        w("attn_k.weight", types["k"], kv * hd, hidden)
        w("attn_v.weight", types["v"], kv * hd, hidden)
        w("attn_output.weight", types["o"], hidden, hidden)
        w("ffn_gate.weight", types["g"], ffn, hidden)
        w("ffn_up.weight", types["u"], ffn, hidden)
        w("ffn_down.weight", types["d"], hidden, ffn)
        if arch == "qwen2":
            w("attn_q.bias", F32, 1, hidden)
            w("attn_k.bias", F32, 1, kv * hd)
            w("attn_v.bias", F32, 1, kv * hd)
    return gguf(kvs, t)


# ---- safetensors / HF folders --------------------------------------------------------------

ST_NAME = {F32: "F32", F16: "F16", BF16: "BF16"}


def safetensors(tensors):
    """tensors: [(name, dtype, shape, bytes)]"""
    hdr, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dt, shape, data in tensors:
        hdr[name] = {"dtype": ST_NAME[dt], "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(d for *_, d in tensors)


def hf_tensors(qwen2, dt, nv, hidden=32, heads=2, kv=1, ffn=32):
    hd = hidden // heads
    t = [("model.embed_tokens.weight", dt, [nv, hidden], tensor_bytes(dt, nv, hidden, 0.5)),
         ("model.norm.weight", F32, [hidden], tensor_bytes(F32, 1, hidden, 0.1, 1.0))]
    p = "model.layers.0."

    def w(name, rows, cols, d=dt, scale=0.2, offset=0.0):
        shape = [cols] if rows == 1 else [rows, cols]
        t.append((p + name, d, shape, tensor_bytes(d, rows, cols, scale, offset)))
    w("input_layernorm.weight", 1, hidden, F32, 0.1, 1.0)
    w("post_attention_layernorm.weight", 1, hidden, F32, 0.1, 1.0)
    w("self_attn.q_proj.weight", hidden, hidden)
    w("self_attn.k_proj.weight", kv * hd, hidden)
    w("self_attn.v_proj.weight", kv * hd, hidden)
    w("self_attn.o_proj.weight", hidden, hidden)
    w("mlp.gate_proj.weight", ffn, hidden)
    w("mlp.up_proj.weight", ffn, hidden)
    w("mlp.down_proj.weight", hidden, ffn)
    if qwen2:
        w("self_attn.q_proj.bias", 1, hidden, F32)
        w("self_attn.k_proj.bias", 1, kv * hd, F32)
        w("self_attn.v_proj.bias", 1, kv * hd, F32)
    return t


def hf_config(model_type, nv, **extra):
    c = {"model_type": model_type, "hidden_size": 32, "intermediate_size": 32,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
         "vocab_size": nv, "tie_word_embeddings": True, "bos_token_id": nv - 2,
         "eos_token_id": nv - 1}
    c.update(extra)
    return json.dumps(c, separators=(",", ":")).encode()


def bpe_tokenizer_json(pre, added_ids=True, **extra):
    vocab = bpe_vocab()
    base = vocab[:-3]
    tj = {"version": "1.0",
          "added_tokens": [{"id": len(base) + i, "content": s, "special": True}
                           for i, s in enumerate(SPECIALS)] if added_ids else [],
          "normalizer": None, "pre_tokenizer": pre,
          "post_processor": None, "decoder": {"type": "ByteLevel"},
          "model": {"type": "BPE", "vocab": {s: i for i, s in enumerate(base)},
                    "merges": MERGES}}
    tj.update(extra)
    return json.dumps(tj, ensure_ascii=False, separators=(",", ":")).encode()


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
PRE = {
    "gpt2": BYTE_LEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "llama3": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?"
                                      "\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*"
                                      "[\\r\\n]+|\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False}, {**BYTE_LEVEL, "use_regex": False}]},
    "qwen2": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?"
                                      "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                      "\\s+(?!\\S)|\\s+"},
         "behavior": "Isolated", "invert": False}, {**BYTE_LEVEL, "use_regex": False}]},
}


def spm_tokenizer_json():
    toks, _, scores = spm_vocab()
    merges = ["▁ h", "h e", "l l", "▁h e", "▁he ll", "▁hell o", "▁ w", "o r", "▁w or",
              "▁wor l", "▁worl d"]
    tj = {"version": "1.0",
          "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                           {"id": 1, "content": "<s>", "special": True},
                           {"id": 2, "content": "</s>", "special": True}],
          "normalizer": {"type": "Sequence", "normalizers": [
              {"type": "Prepend", "prepend": "▁"}, {"type": "Replace",
                                                    "pattern": {"String": " "}, "content": "▁"}]},
          "pre_tokenizer": None,
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "special_tokens": {"<s>": {"id": "<s>", "ids": [1],
                                                        "tokens": ["<s>"]}}},
          "decoder": {"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
              {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ",
                                                          "start": 1, "stop": 0}]},
          "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True,
                    "fuse_unk": True, "vocab": {s: i for i, s in enumerate(toks)},
                    "merges": [m for m in merges
                               if all(p in toks for p in m.split(" "))
                               and m.replace(" ", "") in toks]}}
    _ = scores
    return json.dumps(tj, ensure_ascii=False, separators=(",", ":")).encode()


# ---- KV session files (docs/kv-cache.md; fuzz_kv_session.c's model and pools) ---------------


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF


def kv_session(dtype, rows, page=4, kv_heads=2, head_dim=8):
    elem = {0: 4, 1: 2, 2: 2, 3: 1}[dtype]
    hdr = bytearray(b"MIKVSEQ\0" + struct.pack("<II", 1, 128))
    hdr += b"llama".ljust(32, b"\0")
    hdr += struct.pack("<6i", len(rows), 4, kv_heads, head_dim, 32, 300)
    hdr += struct.pack("<QIIq", 0x0123456789ABCDEF, dtype, page, max(rows))
    hdr += b"\0" * 28
    hdr += struct.pack("<I", crc32c(hdr))
    body = bytearray()
    for n in rows:
        body += struct.pack("<q", n)
        for start in range(0, n, page):
            r = min(page, n - start)
            for _kv in range(2):
                for _h in range(kv_heads):
                    if dtype == 0:
                        body += struct.pack("<%df" % (r * head_dim),
                                            *[rng.uniform(-1, 1) for _ in range(r * head_dim)])
                    elif dtype in (1, 2):
                        body += b"".join(f16(rng.uniform(-1, 1)) if dtype == 1 else
                                         struct.pack("<f", rng.uniform(-1, 1))[2:]
                                         for _ in range(r * head_dim))
                    else:
                        body += bytes(rng.choice(range(0x30, 0x50)) for _ in range(r * head_dim))
            if dtype == 3:
                body += struct.pack("<%df" % (2 * kv_heads), *[1.0 / 64] * (2 * kv_heads))
    return bytes(hdr + body + struct.pack("<I", crc32c(body)))


def write(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def main():
    # GGUF: the quantized types, both tokenizers, both architectures, RoPE scaling keys
    q = {"embd": Q8_0, "q": F32, "k": F32, "v": Q4_0, "o": F16, "g": Q4_1, "u": Q5_0, "d": Q5_1}
    write("fuzz_gguf", "llama_bpe.gguf", gguf_model("llama", q, "gpt2"))
    write("fuzz_gguf", "qwen2_bpe.gguf",
          gguf_model("qwen2", dict(q, embd=F16, out=BF16, v=Q8_0), "gpt2"))
    write("fuzz_gguf", "llama_spm_kquant.gguf",
          gguf_model("llama", dict(q, g=Q8_0, u=Q8_0, d=Q6_K), "spm", ffn=256,
                     extra=[("llama.rope.scaling.type", STR, "yarn"),
                            ("llama.rope.scaling.factor", GF32, 4.0),
                            ("llama.rope.scaling.original_context_length", U32, 64)]))
    write("fuzz_gguf", "mistral_window.gguf",
          gguf_model("mistral", dict(q, o=F32, d=Q4_K), "gpt2", ffn=256,
                     extra=[("mistral.attention.sliding_window", U32, 16)]))

    # HF folders: config.json, tokenizer.json, index, shards (fuzz_hf.c's layout)
    nv = len(bpe_vocab())
    tj = bpe_tokenizer_json(PRE["smollm"])
    t = hf_tensors(False, F16, nv)
    half = len(t) // 2
    index = json.dumps({"metadata": {}, "weight_map": {
        n: "model-%05d.safetensors" % (1 if i < half else 2)
        for i, (n, *_) in enumerate(t)}}).encode()
    write("fuzz_hf", "llama_sharded", HF_SEP.join([
        hf_config("llama", nv, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 64}),
        tj, index, safetensors(t[:half]), safetensors(t[half:])]))
    write("fuzz_hf", "qwen2_single", HF_SEP.join([
        hf_config("qwen2", nv, eos_token_id=[nv - 1, nv - 3], sliding_window=16,
                  use_sliding_window=True, rope_scaling={"type": "yarn", "factor": 4.0}),
        bpe_tokenizer_json(PRE["qwen2"]), b"", safetensors(hf_tensors(True, BF16, nv))]))
    snv = len(spm_vocab()[0])
    write("fuzz_hf", "mistral_spm", HF_SEP.join([
        hf_config("mistral", snv, bos_token_id=1, eos_token_id=2, sliding_window=32,
                  rope_parameters={"rope_theta": 5e5, "rope_type": "linear", "factor": 2.0}),
        spm_tokenizer_json(), b"", safetensors(hf_tensors(False, F16, snv))]))

    # tokenizer.json alone (fuzz_tokenizer_json.c: 512 embedding rows)
    for name, pre in PRE.items():
        write("fuzz_tokenizer_json", "bpe_%s.json" % name, bpe_tokenizer_json(pre))
    write("fuzz_tokenizer_json", "spm_byte_fallback.json", spm_tokenizer_json())
    write("fuzz_tokenizer_json", "bpe_no_added.json",
          bpe_tokenizer_json(PRE["gpt2"], added_ids=False,
                             post_processor={"type": "ByteLevel", "trim_offsets": False}))

    # pattern configs: the API tests' files, and one with every pattern
    for f in sorted((ROOT / "tests" / "api" / "data").glob("*.json")):
        shutil.copyfile(f, CORPUS / "fuzz_config" / f.name) if (CORPUS / "fuzz_config").is_dir() \
            else (write("fuzz_config", f.name, f.read_bytes()))
    write("fuzz_config", "all_patterns.json", json.dumps([
        {"0": ["vertical_and_slash", 1000, 6096, 0.9], "1": ["stream_llm", 4, 64, 0.5],
         "2": ["block_sparse", 8, 0, 0.7], "3": ["dense", 0, 0, 1.0]},
        {"1": ["tri_shape", 4, 64, 0.1], "0": ["vertical_and_slash", 64, 128, 0.25]}],
        indent=1).encode())

    # KV session files: every dtype, full and partial pages, an empty layer
    for dtype, name in enumerate(["f32", "f16", "bf16", "fp8"]):
        write("fuzz_kv_session", "%s.mikv" % name, kv_session(dtype, [6, 6] if dtype else [9, 0]))
    write("fuzz_kv_session", "empty.mikv", kv_session(0, [0, 0]))

    # texts for the tokenizer (first byte: options, see fuzz_tokenize.c)
    texts = {
        "ascii": b"\x00Hello world, the 12345 quick foxes.\n",
        "bos_special": b"\x03<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        "utf8": "\x00café 中文 ✓ 𝄞 Привет  \t\r\n  ".encode(),
        "digits": b"\x00 1234567890 3.14159 x=42;",
        "invalid_utf8": b"\x00\xff\xfe\xc3(\xe2\x82 \xf0\x9f\x98\x80\x80abc",
        "chat": b"\x0cYou are helpful.",
        "contractions": b"\x00I'm you'll they'd it's WE'RE   trailing   ",
    }
    for name, data in texts.items():
        write("fuzz_tokenize", name, data)


if __name__ == "__main__":
    main()
