"""`r2cc model make DIR [--seed S]`: write the tiny random-weight Llama used by serving tests."""

from __future__ import annotations

from r2cc_serve.errors import UserError


def _make(args) -> int:
    if args.seed < 0:
        raise UserError(f"--seed must be >= 0, got {args.seed}")
    try:
        from r2cc_testbed.model.tiny_llama import make_model
    except ImportError as exc:  # transformers/tokenizers come with vLLM
        raise UserError(f"cannot make a model: {exc}; run scripts/install_vllm.sh first") from exc
    make_model(args.dir, seed=args.seed, dtype=args.dtype)
    return 0


def register(sub) -> None:
    p = sub.add_parser("model", help="test models for serving")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    m = msub.add_parser("make", help="write a tiny random-weight Llama + tokenizer into DIR (no downloads)")
    m.add_argument("dir", metavar="DIR", help="output folder (created; must be empty or made by this command)")
    m.add_argument("--seed", type=int, default=0, help="weight seed; same seed -> byte-identical files (default 0)")
    m.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16",
                   help="weight dtype on disk (default bfloat16)")
    m.set_defaults(func=_make)
