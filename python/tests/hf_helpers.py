"""Small randomly initialised transformers models, an in-memory tokenizer and comparison helpers
for the patch tests (CPU and GPU). Nothing is downloaded."""

import json

import torch

ARCHS = ("llama", "qwen2", "mistral")


def make_model(arch="llama", layers=2, hidden=256, heads=4, kv_heads=2, vocab=512, seed=0,
               dtype=torch.float32, device="cpu", max_positions=32768, **extra):
    import transformers as tf

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                  rope_theta=1e6 if arch != "llama" else 5e5)
    common.update(extra)
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(**common), tf.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    elif arch == "mistral":
        common.setdefault("sliding_window", None)
        cfg, cls = tf.MistralConfig(**common), tf.MistralForCausalLM
    else:
        raise ValueError(arch)
    cfg._attn_implementation = "sdpa"
    model = cls(cfg)
    # Sharper attention than the default init (std 0.02 gives near-uniform rows, where every
    # pattern looks alike): scale the query projections up.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
    return model.to(device=device, dtype=dtype).eval()


def make_tokenizer(vocab=512):
    """A word-level tokenizer over the words w0 .. w{vocab-3} (plus <pad> and <eos>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1}
    for i in range(vocab - 2):
        words[f"w{i}"] = i + 2
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    return fast


def random_ids(n, vocab=512, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (batch, n), generator=g)


def left_pad(seqs, pad_id=0):
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, L - len(s):] = s
        mask[i, L - len(s):] = 1
    return ids, mask


def right_pad(seqs, pad_id=0):
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


@torch.no_grad()
def prefill_logits(model, ids, mask=None):
    kw = {} if mask is None else {"attention_mask": mask.to(model.device)}
    return model(ids.to(model.device), **kw).logits.float()


@torch.no_grad()
def generate(model, ids, mask=None, n=8):
    kw = {} if mask is None else {"attention_mask": mask.to(model.device)}
    return model.generate(ids.to(model.device), max_new_tokens=n, do_sample=False, pad_token_id=0,
                          **kw).cpu()


def rel_l2(a, b):
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def write_config(path, n_layers, n_heads, entries):
    """entries: one [pattern, vertical_size, slash_size] per head (cycled), every layer."""
    data = [{str(h): list(entries[h % len(entries)]) + [1.0] for h in range(n_heads)}
            for _ in range(n_layers)]
    with open(path, "w") as f:
        json.dump(data, f)
    return str(path)


def full_budget_entries(L):
    """Patterns that cover every causal key at length L (so the result equals dense)."""
    out = [["vertical_and_slash", L, L], ["stream_llm", L, L], ["vertical_and_slash", 64, L]]
    if (L + 63) // 64 <= 100:  # block_sparse heads keep 100 blocks per row block
        out.append(["block_sparse", 0, 0])
    return out


def sparse_entries():
    return [["vertical_and_slash", 64, 256], ["stream_llm", 64, 192], ["vertical_and_slash", 30, 100],
            ["block_sparse", 0, 0]]


def _gpt2_byte_chars():
    """GPT-2's byte -> character map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def save_for_runner(model, path):
    """Writes model (make_model's) as a folder the C model runner loads: its safetensors and
    config.json, and a byte-level tokenizer.json (no merges) of the model's vocabulary, so that
    token ids mean the same to both."""
    import json
    import os

    model.save_pretrained(path, safe_serialization=True)
    vocab = int(model.config.vocab_size)
    chars = _gpt2_byte_chars()
    v = {chars[b]: b for b in range(256)}
    v.update({f"<r{i}>": i for i in range(256, vocab - 2)})
    tok = {"model": {"type": "BPE", "vocab": v, "merges": []},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "added_tokens": [{"id": vocab - 2, "content": "<s>", "special": True},
                            {"id": vocab - 1, "content": "</s>", "special": True}]}
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    return path
