"""A tiny random-weight Llama plus a locally trained byte-level BPE tokenizer, for serving tests.

Nothing is downloaded. The same seed gives byte-identical files, so greedy outputs can be compared
across runs and machines. Shapes are chosen for tensor parallelism 2: 4 query heads and 2 KV heads
(one KV head per rank), intermediate and vocab sizes even.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from r2cc_serve.errors import UserError

HIDDEN = 256
LAYERS = 4
VOCAB = 1024
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 512
MAX_POSITIONS = 2048
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>"]  # ids 0, 1, 2
# Minimal template so /v1/chat/completions works too.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
MARKER = "r2cc_model.json"  # says the folder is ours, so `make` may overwrite it


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise UserError(f"{out} is not empty and was not made by `r2cc model make`; pick another folder")


def _train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from r2cc_testbed.model.corpus import training_text

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodable
        show_progress=False,
    )
    tok.train_from_iterator(training_text(), trainer=trainer)
    # Exactly VOCAB: a sampled id with no token would break detokenization in the server.
    if tok.get_vocab_size() != VOCAB:
        raise AssertionError(f"tokenizer vocab {tok.get_vocab_size()} != model vocab {VOCAB}; enlarge the corpus")
    return tok


def _config(dtype: str):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,  # lm_head is sharded by vLLM over TP ranks: keep it separate
        dtype=dtype,
        architectures=["LlamaForCausalLM"],
    )


def _fill_weights(model, seed: int) -> None:
    """Overwrite every parameter from one seeded generator, in name order.

    We do not rely on transformers' own init, whose RNG use may change between versions.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32) * 0.02)


def _save_quietly(model, out: Path) -> None:
    """save_pretrained without its one-shard tqdm bar (our step log already says what happens)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out, safe_serialization=True)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def make_model(dir: str | Path, seed: int = 0, dtype: str = "bfloat16", log: Callable[[str], None] = print) -> Path:
    """Write the tiny model and tokenizer into `dir` (created if needed) and return its path."""
    out = Path(dir)
    _check_target(out)
    t0 = time.monotonic()

    def step(msg: str) -> None:
        log(f"[{time.monotonic() - t0:5.1f}s] {msg}")

    step("importing torch and transformers")
    import torch
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    step(f"training byte-level BPE tokenizer (vocab {VOCAB})")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(),
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2],
        model_max_length=MAX_POSITIONS,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)

    step(f"building Llama: hidden {HIDDEN}, {LAYERS} layers, {HEADS} heads / {KV_HEADS} kv heads, seed {seed}")
    model = LlamaForCausalLM(_config(dtype))
    _fill_weights(model, seed)
    model = model.to(getattr(torch, dtype))
    n_params = sum(p.numel() for p in model.parameters())
    _save_quietly(model, out)
    (out / MARKER).write_text(json.dumps({"generator": "r2cc_testbed.model", "seed": seed}) + "\n")
    step(f"wrote {out} ({n_params / 1e6:.1f}M parameters, {dtype})")
    return out
