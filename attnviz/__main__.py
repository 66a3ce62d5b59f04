"""The command line: python -m attnviz capture --model NAME --text TEXT --out FILE, and python -m attnviz models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnviz", description="attnviz from the command line.")
    commands = parser.add_subparsers(dest="command", required=True)

    cap = commands.add_parser("capture", help="Capture every head's attention on a text and write it to a file.")
    cap.add_argument("--model", required=True, help="a model name (see `models`), a local folder or a cached hub id")
    source = cap.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to run the model on")
    source.add_argument("--text-file", type=Path, help="read the text from this UTF-8 file")
    cap.add_argument("--out", required=True, type=Path, help="output file, .npz or .safetensors")
    cap.add_argument("--layers", help="comma-separated layer indices (default: all)")
    cap.add_argument("--float16", action="store_true", help="store the pattern as float16 (half the size)")
    cap.add_argument("--scores", action="store_true", help="also store the pre-softmax scores")
    cap.add_argument("--stats", type=Path, help="also write the per-head statistics table to this CSV file")
    cap.add_argument("--device", help="torch device, or 'auto' to spread a big model (default: CUDA if present)")

    commands.add_parser("models", help="List the models attnviz knows by name.")
    args = parser.parse_args(argv)

    from attnviz.capture import CaptureError
    from attnviz.models import ModelError

    try:
        if args.command == "models":
            return _models()
        return _capture(args)
    except (CaptureError, ModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _models() -> int:
    from attnviz.models import available_models

    for spec in available_models():
        state = "installed" if spec.installed else f"not installed: {spec.install_command}"
        print(f"{spec.name:18} {spec.family:8} {spec.source:8} {state}")
    return 0


def _capture(args) -> int:
    import numpy as np

    from attnviz.capture import CaptureError, capture_attention, save_capture
    from attnviz.models import load_model

    if args.out.suffix.lower() not in (".npz", ".safetensors"):
        raise CaptureError(f"--out {args.out.name!r} must end in .npz or .safetensors.")
    if args.text_file is not None:
        try:
            text = args.text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CaptureError(f"Cannot read --text-file: {exc}") from exc
    else:
        text = args.text
    layers = None
    if args.layers:
        try:
            layers = [int(x) for x in args.layers.split(",") if x.strip()]
        except ValueError as exc:
            raise CaptureError(f"--layers must be comma-separated integers, not {args.layers!r}.") from exc
    loaded = load_model(args.model, device=args.device, progress=lambda msg: print(msg, file=sys.stderr))
    capture = capture_attention(loaded, text, layers=layers, dtype=np.float16 if args.float16 else np.float32,
                                with_scores=args.scores)
    save_capture(capture, args.out)
    print(f"wrote {args.out}: pattern [layer, head, query, key] = {list(capture.pattern.shape)}, "
          f"{len(capture.tokens)} tokens")
    if args.stats:
        from attnviz.stats import head_stats

        head_stats(capture).to_csv(args.stats, index=False)
        print(f"wrote {args.stats}: per-head statistics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
