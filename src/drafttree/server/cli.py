"""``drafttree serve``: load one model and serve it over an OpenAI-compatible HTTP API plus a web page."""

from __future__ import annotations

import sys

from drafttree.errors import DraftTreeError


def cmd_serve(args) -> int:
    import drafttree
    from drafttree.server.app import create_server

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if not 0 <= args.port <= 65535:
        raise DraftTreeError(f"--port must be in 0..65535, got {args.port}")
    sm = drafttree.SpeculativeModel.from_pretrained(
        args.model, method=args.method, draft_model=args.draft_model, head=args.head or "auto",
        dtype=args.dtype, device=args.device,
    )
    try:
        server = create_server(sm, args.host, args.port, quiet=args.quiet)
    except OSError as e:
        raise DraftTreeError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    url = server.url
    dtype = str(sm.target.dtype).replace("torch.", "")
    print(f"drafttree serving {sm.target.name} ({dtype}, {sm.target.device}, method {sm.method}) at {url}",
          flush=True)
    print(f"  web page {url}   OpenAI API {url}v1   (Ctrl+C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("drafttree: server stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0


def add_parser(sub) -> None:
    from drafttree.drafters import METHODS

    s = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API with a web page",
                       description="OpenAI-compatible server: /v1/chat/completions, /v1/completions, /v1/models, "
                                   "/health; a web page at / that colours tokens by target forward.")
    s.add_argument("--model", default="smollm2-135m-instruct", help="built-in name, .gguf file, HF dir or hub id")
    s.add_argument("--method", default="auto", help=f"default method: auto or one of {', '.join(METHODS)} "
                                                    "(requests may pick another with the 'method' field)")
    s.add_argument("--draft-model", default=None, help="draft LM for --method draft (same tokenizer)")
    s.add_argument("--head", default=None, help="EAGLE head directory (default: the one shipped for the model)")
    s.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    s.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (auto: cuda if available)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=8000, help="TCP port (0 picks a free one)")
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    s.add_argument("--quiet", action="store_true", help="do not log each request")
    s.set_defaults(func=cmd_serve)
