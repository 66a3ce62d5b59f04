"""The command line (the `attnviz` console script, or python -m attnviz): attnviz capture --model NAME --text TEXT
--out FILE; attnviz stats --model NAME --text-file FILE --out stats.csv (every head's statistics at any length; with
--window, averaged over windows of one or several files); attnviz corpus run|summary|top (statistics over a whole
corpus, attnviz.corpus.cli); attnviz models; attnviz app (the Streamlit app)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnviz.corpus import cli as corpus_cli


def _model_and_text(command) -> None:
    """The --model and --text / --text-file arguments that capture and stats share."""
    command.add_argument("--model", required=True,
                         help="a model name (see `models`), a local folder or a cached hub id")
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to run the model on")
    source.add_argument("--text-file", type=Path, action="append",
                        help="read the text from this UTF-8 file (stats --window: repeat it for several files)")


def _parser() -> argparse.ArgumentParser:
    """The command line: capture, stats, report, corpus, models and app."""
    parser = argparse.ArgumentParser(prog="attnviz", description="attnviz from the command line.")
    commands = parser.add_subparsers(dest="command", required=True)

    _capture_command(commands)
    _stats_command(commands)
    _report_command(commands)
    corpus_cli.add_commands(commands)
    commands.add_parser("models", help="List the models attnviz knows by name.")
    commands.add_parser("app", help="Start the Streamlit app (streamlit run app.py); any further arguments, "
                              "such as --server.port 8502, go to streamlit.")
    return parser


def _capture_command(commands) -> None:
    cap = commands.add_parser("capture", help="Capture every head's attention on a text and write it to a file.")
    _model_and_text(cap)
    cap.add_argument("--out", required=True, type=Path, help="output file, .npz or .safetensors")
    cap.add_argument("--layers", help="comma-separated layer indices (default: all)")
    cap.add_argument("--float16", action="store_true", help="store the pattern as float16 (half the size)")
    cap.add_argument("--scores", action="store_true", help="also store the pre-softmax scores")
    cap.add_argument("--stats", type=Path, help="also write the per-head statistics table to this CSV file")
    cap.add_argument("--device", help="torch device, or 'auto' to spread a big model (default: CUDA if present)")


def _stats_command(commands) -> None:
    st = commands.add_parser("stats", help="Every captured head's statistics (entropy, sink mass, distance, "
                             "previous-token, self, induction) as CSV, at any text length: the N x N pattern is "
                             "never built.")
    _model_and_text(st)
    st.add_argument("--out", required=True, type=Path, help="output CSV file")
    st.add_argument("--layers", help="comma-separated layer indices (default: all)")
    st.add_argument("--window", type=int, help="average the statistics over windows of this many tokens of the "
                    "text(s), each run on its own (attnviz.corpus); a row per head with the mean, the spread "
                    "(<column>_std) and n_windows")
    st.add_argument("--max-windows", type=int, default=64, help="with --window: at most this many windows in all "
                    "(default 64)")
    st.add_argument("--device", help="torch device, or 'auto' to spread a big model (default: CUDA if present)")


def _report_command(commands) -> None:
    rep = commands.add_parser("report", help="Write one offline HTML file: the model, the text, the chosen heads' "
                              "maps, every head's statistics, knock-outs if asked, and the code behind each.")
    _model_and_text(rep)
    rep.add_argument("--out", required=True, type=Path, help="output file, .html")
    rep.add_argument("--heads", help="layer.head pairs, comma-separated, e.g. 1.2,3.0 (default: the best head of "
                     "each role: sink, previous token, induction, ...)")
    rep.add_argument("--layers", help="comma-separated layer indices to capture (default: all)")
    rep.add_argument("--hide-sink", action="store_true", help="draw the maps with token 0's weight hidden")
    rep.add_argument("--knockout", action="store_true", help="also knock out each chosen head alone and report "
                     "the change in the text's next-token loss (decoders only)")
    rep.add_argument("--device", help="torch device (default: CUDA if present)")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "app":
        return _app(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    from attnviz.errors import AttnvizError

    try:
        if args.command == "models":
            return _models()
        if args.command == "corpus":
            return corpus_cli.run(args)
        if args.command == "stats":
            return _stats(args)
        if args.command == "report":
            return _report(args)
        return _capture(args)
    except AttnvizError as exc:  # every refusal; anything else is a bug and shows its traceback
        detail = getattr(exc, "detail", None)  # on the command line the path and the library's words help
        print(f"error: {exc}" + (f" ({detail})" if detail else ""), file=sys.stderr)
        return 2


def app_script() -> Path | None:
    """The app's entry point, app.py, beside the attnviz package (a checkout of the repository, installed with
    pip install -e .), or None when attnviz was installed without it."""
    script = Path(__file__).resolve().parent.parent / "app.py"
    return script if script.is_file() else None


def _app(streamlit_args: list[str]) -> int:
    """attnviz app: becomes `streamlit run app.py` with the arguments given, in this Python (the same process, so
    Ctrl-C and a service manager's signals reach streamlit)."""
    import importlib.util
    import os

    script = app_script()
    if script is None:
        print("error: attnviz app runs the Streamlit app of a checkout of the attnviz repository (its app.py and "
              "app_pages/), and this attnviz was installed without one. Clone the repository and run "
              "bash scripts/setup.sh there (it installs attnviz from the checkout).", file=sys.stderr)
        return 2
    if importlib.util.find_spec("streamlit") is None:
        print("error: the app needs streamlit and plotly: pip install -e '.[app]' in the checkout.", file=sys.stderr)
        return 2
    os.execv(sys.executable, [sys.executable, "-m", "streamlit", "run", str(script), *streamlit_args])
    return 0  # not reached: execv does not return


def _models() -> int:
    from attnviz.models import available_models

    for spec in available_models():
        state = "installed" if spec.installed else f"not installed: {spec.install_command}"
        print(f"{spec.name:18} {spec.family:8} {spec.source:8} {state}")
    return 0


def _texts(args) -> list[str]:
    """The --text, or the text of each --text-file."""
    from attnviz.capture import CaptureError

    if args.text_file is None:
        return [args.text]
    texts = []
    for path in args.text_file:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise CaptureError(f"Cannot read --text-file: {exc}") from exc
    return texts


def _text_and_layers(args):
    from attnviz.capture import CaptureError

    texts = _texts(args)
    if len(texts) > 1 and not getattr(args, "window", None):
        raise CaptureError("Several --text-file need stats --window (statistics averaged over their windows).")
    text = texts[0]
    layers = None
    if args.layers:
        try:
            layers = [int(x) for x in args.layers.split(",") if x.strip()]
        except ValueError as exc:
            raise CaptureError(f"--layers must be comma-separated integers, not {args.layers!r}.") from exc
    return text, layers


def _stats(args) -> int:
    import time

    from attnviz.capture import capture_attention, records_inputs
    from attnviz.models import load_model
    from attnviz.stats import head_stats

    text, layers = _text_and_layers(args)
    started = time.perf_counter()
    loaded = load_model(args.model, device=args.device, progress=lambda msg: print(msg, file=sys.stderr))
    if args.window:
        return _window_stats(args, loaded, layers, started)
    # the qk store keeps only q and k, O(N d) per layer; families whose q and k are not recorded need the pattern
    store = "qk" if records_inputs(loaded.model) else "pattern"

    def report(stage):
        def show(done, total):
            print(f"\r{stage}: layer {done}/{total} ({time.perf_counter() - started:.0f} s)", end="",
                  file=sys.stderr, flush=True)
            if done == total:
                print(file=sys.stderr)
        return show

    if store == "qk":
        # each layer's attention output and statistics come from one pass over its scores during the forward
        # pass (attnviz.stats.streaming_attend); its q and k are then dropped: memory holds one layer's inputs
        from attnviz.stats import streaming_attend

        ids = loaded.tokenizer(text, return_tensors="pt").input_ids[0].tolist()
        during = streaming_attend(ids, keep_inputs=False)
        capture = capture_attention(loaded, text, layers=layers, store="qk", during=during,
                                    progress=report("forward pass and statistics"))
    else:
        capture = capture_attention(loaded, text, layers=layers, store=store, progress=report("forward pass"))
    frame = head_stats(capture, progress=report("statistics") if store != "qk" else None)
    frame.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {capture.n_layers} layers x {capture.n_heads} heads, {capture.n_tokens:,} tokens "
          f"({store} store, {time.perf_counter() - started:.1f} s)")
    return 0


def _window_stats(args, loaded, layers, started: float) -> int:
    """stats --window: head_stats averaged over windows of every text (attnviz.corpus)."""
    import time

    from attnviz.capture import CaptureError
    from attnviz.corpus import corpus_stats, token_windows, window_summary

    if args.window < 2 or args.max_windows < 1:
        raise CaptureError("--window must be at least 2 tokens and --max-windows at least 1.")
    texts = _texts(args)
    if any(not t.strip() for t in texts):
        raise CaptureError("A text is empty: give every --text-file some text.")
    windows = []
    for text in texts:
        windows += token_windows(loaded, text, args.window, max_windows=args.max_windows - len(windows))
        if len(windows) >= args.max_windows:
            break

    def show(done, total):
        print(f"\rwindow {done}/{total} ({time.perf_counter() - started:.0f} s)", end="", file=sys.stderr, flush=True)
        if done == total:
            print(file=sys.stderr)

    frame = corpus_stats(loaded, windows, layers=layers, progress=show)
    frame.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {frame['layer'].nunique()} layers x {frame['head'].nunique()} heads, mean over "
          f"{window_summary(windows)} from {len(texts)} text{'s' if len(texts) > 1 else ''}")
    return 0


def _capture(args) -> int:
    import numpy as np

    from attnviz.capture import CaptureError, capture_attention
    from attnviz.capture.files import save_capture
    from attnviz.models import load_model

    if args.out.suffix.lower() not in (".npz", ".safetensors"):
        raise CaptureError(f"--out {args.out.name!r} must end in .npz or .safetensors.")
    text, layers = _text_and_layers(args)
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


def _heads(spec: str | None) -> list[tuple[int, int]] | None:
    """--heads 1.2,3.0 as [(1, 2), (3, 0)]."""
    from attnviz.capture import CaptureError

    if not spec:
        return None
    try:
        return [(int(layer), int(head)) for layer, head in (p.strip().split(".") for p in spec.split(",") if p.strip())]
    except ValueError as exc:
        raise CaptureError(f"--heads must be layer.head pairs, comma-separated (1.2,3.0), not {spec!r}.") from exc


def _report(args) -> int:
    from attnviz import report
    from attnviz.capture.front import capture
    from attnviz.models import load_model

    text, layers = _text_and_layers(args)
    heads = _heads(args.heads)
    loaded = load_model(args.model, device=args.device, progress=lambda msg: print(msg, file=sys.stderr))
    cap = capture(loaded, text, layers=layers, store="auto")
    stats = cap.stats()
    heads = report.default_heads(stats, cap) if heads is None else heads
    for layer, head in heads:
        cap.index_of(layer)  # refuses a layer that was not captured
    experiments = None
    if args.knockout:
        experiments = {"Each head knocked out alone": report.knockout_table(loaded, text, heads, model=args.model)}
    settings = {"hide the sink": "yes" if args.hide_sink else "no"}
    path = report.write_report(args.out, cap, text, heads=heads, stats=stats, experiments=experiments,
                               hide_sink=args.hide_sink, settings=settings, model=args.model)
    print(f"wrote {path}: {len(heads)} head{'s' if len(heads) > 1 else ''}, the statistics of "
          f"{cap.n_layers} x {cap.n_heads} heads" + (", knock-outs" if experiments else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
