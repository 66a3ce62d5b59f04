"""`attnviz corpus ...` on the command line:

  attnviz corpus run --model M --data PATH [--data PATH ...] --window N [--window N2 ...] --out DIR
                     [--engine local|ray] [--field text] [--max-windows K]
  attnviz corpus summary DIR [--out FILE.csv]
  attnviz corpus top DIR --stat STAT --head LxHy [-k 10] [--window N]

A run shows its progress on stderr (windows done, windows per second, time left); started again with the same
arguments after a kill, it goes on from its last whole shard.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from attnviz.corpus.results import CorpusRun
from attnviz.corpus.run import Rate, corpus_run
from attnviz.corpus.sources import CorpusError


def add_commands(commands) -> None:
    corpus = commands.add_parser("corpus", help="Every head's statistics over a corpus, written to Parquet shards "
                                 "in a run folder (resumable), with summaries and top windows read through DuckDB.")
    verbs = corpus.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser("run", help="Run a model over every window of the data.")
    run.add_argument("--model", required=True, help="a model name (see `models`), a local folder or a .gguf file")
    run.add_argument("--data", required=True, action="append", type=Path,
                     help=".txt file or folder, .jsonl, .parquet, or a folder saved by datasets' save_to_disk "
                          "(repeat for several)")
    run.add_argument("--window", required=True, action="append", type=int,
                     help="window length in tokens (repeat for several: statistics against context length)")
    run.add_argument("--out", required=True, type=Path, help="the run folder (new, or this run's to go on)")
    run.add_argument("--engine", choices=("local", "ray"), default="local",
                     help="local (default) or ray: Ray Data on the cluster RAY_ADDRESS names, else a local one")
    run.add_argument("--field", default="text", help="the text field of JSON Lines, the text column of Parquet")
    run.add_argument("--max-windows", type=int, help="at most this many windows per window length")
    run.add_argument("--actors", type=int, help="--engine ray: the actor pool's size")
    summary = verbs.add_parser("summary", help="One row per (window length, layer, head): mean, spread, quantiles.")
    summary.add_argument("dir", type=Path)
    summary.add_argument("--out", type=Path, help="write the table to this CSV file (default: print it)")
    top = verbs.add_parser("top", help="The windows where one head scores highest on one statistic.")
    top.add_argument("dir", type=Path)
    top.add_argument("--stat", required=True, help="entropy, sink_mass, mean_distance, prev_token, self, induction")
    top.add_argument("--head", required=True, help="layer and head as LxHy, e.g. L3H0")
    top.add_argument("-k", type=int, default=10, help="how many windows (default 10)")
    top.add_argument("--window", type=int, help="only windows of this length")


def run(args) -> int:
    if args.verb == "run":
        return _run(args)
    result = CorpusRun(args.dir)
    if args.verb == "summary":
        table = result.summary()
        if args.out:
            table.to_csv(args.out, index=False)
            print(f"wrote {args.out}: {len(table):,} rows (window length, layer, head) from "
                  f"{result.n_windows_done:,} windows")
        else:
            table.to_csv(sys.stdout, index=False)
        return 0
    layer, head = parse_head(args.head)
    table = result.top(args.stat, layer, head, args.k, window=args.window)
    for row in table.itertuples():
        text = " ".join(row.text.split())
        print(f"{getattr(row, args.stat):.4f}  window {row.window_id} ({row.window} tokens) {row.source} "
              f"@{row.offset}: {text[:160]}{'…' if len(text) > 160 else ''}")
    return 0


def parse_head(text: str) -> tuple[int, int]:
    """'L3H0' (or 3,0 / 3:0) -> (3, 0)."""
    match = re.fullmatch(r"\s*[Ll]?(\d+)\s*(?:[Hh]|[,:])\s*(\d+)\s*", text)
    if not match:
        raise CorpusError(f"--head {text!r}: give the layer and head as LxHy, e.g. L3H0.")
    return int(match.group(1)), int(match.group(2))


def _run(args) -> int:
    rate = Rate()

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {rate.line(done, total)}   ", end="", file=sys.stderr,
              flush=True)
        if done == total:
            print(file=sys.stderr)

    result = corpus_run(args.model, args.data, window=args.window, out=args.out, engine=args.engine,
                        field=args.field, max_windows=args.max_windows, progress=show, actors=args.actors)
    m = result.manifest
    print(f"wrote {args.out}: {m['n_windows']:,} windows of {', '.join(map(str, m['windows']))} tokens from "
          f"{m['documents']:,} documents, {m['layers']} layers x {m['heads']} heads ({m['n_shards']} shard"
          f"{'s' if m['n_shards'] != 1 else ''})")
    return 0
