"""``drafttree serve``: load one model and serve it over an OpenAI-compatible HTTP API plus a web page."""

from __future__ import annotations

import os
import sys

from drafttree.batching.admission import PREFILL_CHUNK, check_chunk
from drafttree.errors import DraftTreeError, positive_int


def cmd_serve(args) -> int:
    import drafttree
    from drafttree.server import WEB_STACK

    try:
        from drafttree.server import create_app, serve
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in WEB_STACK:
            raise
        raise DraftTreeError(f"drafttree serve needs {e.name}, which is not installed: pip install fastapi "
                             "uvicorn") from None

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if not 0 <= args.port <= 65535:
        raise DraftTreeError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch <= 0 or args.max_queue <= 0:
        raise DraftTreeError(f"--max-batch and --max-queue must be > 0, got {args.max_batch} and {args.max_queue}")
    from drafttree.server.tools import PARSERS

    if args.prefix_cache_tokens is not None and not args.enable_prefix_caching:
        raise DraftTreeError("--prefix-cache-tokens sizes the prefix cache: it needs --enable-prefix-caching")
    if args.prefix_cache_tokens is not None and args.prefix_cache_tokens <= 0:
        raise DraftTreeError(f"--prefix-cache-tokens must be > 0, got {args.prefix_cache_tokens}")
    check_chunk(args.prefill_chunk)
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise DraftTreeError(f"--enable-auto-tool-choice needs --tool-call-parser ({', '.join(PARSERS)})")
    api_key = args.api_key or os.environ.get("DRAFTTREE_API_KEY") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        print(f"drafttree: warning: listening on {args.host} without --api-key: anyone who can reach it may use it",
              file=sys.stderr)
    sm = drafttree.SpeculativeModel.from_pretrained(
        args.model, method=args.method, draft_model=args.draft_model, head=args.head or "auto",
        draft_vocab=args.draft_vocab,
        dtype=args.dtype, device=args.device, prefix_cache=args.enable_prefix_caching,
    )
    sm.prefill_chunk = args.prefill_chunk
    if args.batch_invariant:
        sm.batch_target().batch_invariant = True
    if args.prefix_cache_tokens is not None:
        sm.batch_target().pool.max_tokens = args.prefix_cache_tokens
    app = create_app(sm, api_key=api_key, max_batch=args.max_batch, max_queue=args.max_queue,
                     tool_parser=args.tool_call_parser)
    dtype = str(sm.target.dtype).replace("torch.", "")

    def started(server):
        sock = server.servers[0].sockets[0].getsockname()
        host = "127.0.0.1" if sock[0] == "0.0.0.0" else sock[0]
        url = f"http://[{host}]:{sock[1]}/" if ":" in host else f"http://{host}:{sock[1]}/"
        print(f"drafttree serving {sm.target.name} ({dtype}, {sm.target.device}, method {sm.method}, up to "
              f"{args.max_batch} requests per batch) at {url}", flush=True)
        print(f"  web page {url}   OpenAI API {url}v1   docs {url}docs   (Ctrl+C stops)", flush=True)

    try:
        serve(app, args.host, args.port, quiet=args.quiet, on_start=started)
    except OSError as e:
        raise DraftTreeError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    return 0


def add_parser(sub) -> None:
    from drafttree.drafters import METHODS
    from drafttree.server.tools import PARSERS

    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API with a web page",
                       description="OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/models, "
                                   "/health; a web page at / that colours tokens by target forward.")
    s.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, .gguf file, HF dir or hub id")
    s.add_argument("--method", default="auto", help=f"default method: auto or one of {', '.join(METHODS)} "
                                                    "(requests may pick another with the 'method' field)")
    s.add_argument("--draft-model", default=None, help="draft LM for --method draft (same tokenizer)")
    s.add_argument("--head", default=None, help="EAGLE head directory, or mtp: the MTP layer in the model's own "
                   "checkpoint (default: the head shipped for the model, else that MTP layer)")
    s.add_argument("--draft-vocab", type=positive_int, default=None, metavar="N",
                   help="the head drafts over the first N token ids only (an MTP layer, an EAGLE-1 head: fewer LM head "
                   "rows per draft level on a big vocabulary; the output is unchanged)")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    s.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (auto: cuda if available)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (0 picks a free one)")
    s.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 routes "
                                                    "(default: $DRAFTTREE_API_KEY; none = open, loopback only)")
    s.add_argument("--max-batch", type=int, default=16, help="requests decoded together (rows per forward)")
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting beyond the batch; more get 503")
    s.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK,
                   help="prompt tokens a round prefills at most while requests decode (default %(default)s): a long "
                        "prompt joins a chunk a round instead of stalling every running stream for its whole "
                        "prefill (chunked prefill); 0: newcomers are prefilled at once")
    s.add_argument("--quiet", action="store_true", help="do not log each request")
    s.add_argument("--batch-invariant", action="store_true",
                   help="a request's greedy text never depends on what else is being served, in bf16 too (a packed "
                        "prefill of short prompts costs ~8-10%% more; also $DRAFTTREE_BATCH_INVARIANT=1)")
    s.add_argument("--enable-prefix-caching", action="store_true",
                   help="keep finished requests' keys for requests that begin the same way (a chat's next turn, a "
                        "shared system prompt), as vLLM's flag: those compute only the rest; usage then reports "
                        "prompt_tokens_details.cached_tokens. A reused prefix's logits may differ from a fresh "
                        "prefill's in the last bits")
    s.add_argument("--prefix-cache-tokens", type=int, default=None,
                   help="tokens the prefix cache keeps at most, least recently used out first (default 32768; each "
                        "token holds every layer's keys and values: ~23 KB for SmolLM2-135M in bf16)")
    s.add_argument("--tool-call-parser", choices=PARSERS, default=None,
                   help="tool_choice 'auto' (the default with tools) reads the model's calls in this format (hermes: "
                        "<tool_call> blocks, as Qwen2.5, Hermes and SmolLM2 write them; llama3_json: Llama 3's JSON "
                        "calls); without it 'auto' is a 400")
    s.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted as vLLM's command line has it (needs --tool-call-parser)")
    s.set_defaults(func=cmd_serve)
