"""A finished (or partly finished) corpus run, read through DuckDB, embedded: `stats` is every shard's rows (one
per window, layer and head), `windows` the plan (one row per window, with its text). Summaries, top windows and
comparisons are SQL over those two views; .sql() runs any query over them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from attnviz.corpus.sources import CorpusError
from attnviz.corpus.store import SHARDS, WINDOWS, RunFolder
from attnviz.stats import COLUMNS

QUANTILES = (0.1, 0.5, 0.9)


class CorpusRun:
    """The run folder `path` (attnviz.corpus.store): .summary(), .top(stat, layer, head, k), .sql(query) and
    .compare(other). name: how messages call it (a page passes the run's name)."""

    def __init__(self, path: str | Path, name: str | None = None):
        self.folder = RunFolder(path, name)
        self.manifest = self.folder.manifest()
        if self.manifest is None:
            raise CorpusError(f"{self.folder.name} is not a corpus run: it has no manifest.")
        self.columns = [c for c in (*COLUMNS, "learned_sink") if c in self._stat_columns()]

    def __repr__(self) -> str:
        m = self.manifest
        return (f"CorpusRun({self.folder.name!r}: {m['model']}, windows {m['windows']}, {self.n_windows_done:,} of "
                f"{m['n_windows']:,} windows done)")

    @property
    def complete(self) -> bool:
        return self.folder.complete()

    @property
    def n_windows_done(self) -> int:
        return int(self.sql("SELECT count(DISTINCT window_id) AS n FROM stats")["n"].iloc[0]) if self._shards() else 0

    def sql(self, query: str) -> pd.DataFrame:
        """Any DuckDB query over the views `stats` (window_id, layer, head, kv_head, each statistic) and `windows`
        (window_id, window, doc, source, offset, n_tokens, text), as a DataFrame."""
        import duckdb

        with duckdb.connect() as con:
            con.execute(f"CREATE VIEW windows AS SELECT * EXCLUDE (ids) FROM read_parquet({_quoted(self._windows())})")
            shards = self._shards()
            if shards:
                con.execute(f"CREATE VIEW stats AS SELECT * FROM read_parquet({_quoted(shards)})")
            else:  # no shard yet: an empty table of the same columns
                con.execute("CREATE VIEW stats AS SELECT * FROM (SELECT 0::BIGINT AS window_id, 0::BIGINT AS layer, "
                            "0::BIGINT AS head, 0::BIGINT AS kv_head) WHERE false")
            return con.execute(query).df()

    def summary(self) -> pd.DataFrame:
        """One row per (window length, layer, head): for each statistic its mean, its spread over windows (std,
        population), its 10th, 50th and 90th percentiles (`<stat>_q10`, `_q50`, `_q90`), and n_windows. NaN
        statistics (induction in a window where no token repeats) are left out of that statistic only."""
        parts = [f"avg({c}) AS {c}, stddev_pop({c}) AS {c}_std, "
                 + ", ".join(f"quantile_cont({c}, {q}) AS {c}_q{round(q * 100):02d}" for q in QUANTILES)
                 for c in self.columns]
        return self.sql(f"""
            SELECT w.window, s.layer, s.head, any_value(s.kv_head) AS kv_head, {', '.join(parts)},
                   count(DISTINCT s.window_id) AS n_windows
            FROM (SELECT * REPLACE ({', '.join(f'CASE WHEN isnan({c}) THEN NULL ELSE {c} END AS {c}'
                                               for c in self.columns)}) FROM stats) s
            JOIN windows w USING (window_id)
            GROUP BY w.window, s.layer, s.head ORDER BY w.window, s.layer, s.head""")

    def top(self, stat: str, layer: int, head: int, k: int = 10, *, window: int | None = None) -> pd.DataFrame:
        """The k windows where head `head` of layer `layer` scores highest on `stat`, with their text, source and
        offset; window: only windows of this length."""
        self._check_stat(stat)
        where = f"AND w.window = {int(window)}" if window is not None else ""
        return self.sql(f"""
            SELECT s.window_id, w.window, w.source, w.offset, w.n_tokens, s.{stat}, w.text
            FROM stats s JOIN windows w USING (window_id)
            WHERE s.layer = {int(layer)} AND s.head = {int(head)} AND NOT isnan(s.{stat}) {where}
            ORDER BY s.{stat} DESC, s.window_id LIMIT {int(k)}""")

    def against_length(self, stat: str) -> pd.DataFrame:
        """Each head's mean of `stat` at each window length: rows (layer, head), one column per length."""
        self._check_stat(stat)
        table = self.summary()
        return table.pivot_table(index=["layer", "head"], columns="window", values=stat)

    def compare(self, other: CorpusRun, stat: str | None = None) -> pd.DataFrame:
        """Head by head where the two runs' models have the same layers and heads: for each window length both
        share, this run's mean of each statistic (`<stat>_a`), the other's (`_b`) and their difference
        (`<stat>_diff`); stat: only that one. Runs of different shapes are compared by relative depth instead:
        attnviz.corpus.layer_means on each summary."""
        a, b = self.summary(), other.summary()
        if (self.manifest["layers"], self.manifest["heads"]) != (other.manifest["layers"], other.manifest["heads"]):
            raise CorpusError(f"The two runs' models differ in shape ({self.manifest['layers']} x "
                              f"{self.manifest['heads']} against {other.manifest['layers']} x "
                              f"{other.manifest['heads']}): compare them by relative depth (layer_means).")
        stats = [stat] if stat else [c for c in self.columns if c in other.columns]
        merged = a[["window", "layer", "head", *stats]].merge(b[["window", "layer", "head", *stats]],
                                                             on=["window", "layer", "head"], suffixes=("_a", "_b"))
        for c in stats:
            merged[f"{c}_diff"] = merged[f"{c}_a"] - merged[f"{c}_b"]
        return merged

    # -- reading the folder ----------------------------------------------------------------------------------------

    def _windows(self) -> list[str]:
        return [str(self.folder.path / WINDOWS)]

    def _shards(self) -> list[str]:
        return sorted(str(p) for p in (self.folder.path / SHARDS).glob("shard-*.parquet"))

    def _stat_columns(self) -> list[str]:
        import pyarrow.parquet as pq

        shards = self._shards()
        return pq.read_schema(shards[0]).names if shards else list(COLUMNS)

    def _check_stat(self, stat: str) -> None:
        if stat not in self.columns:
            raise CorpusError(f"No statistic {stat!r}: choose one of {', '.join(self.columns)}.")


def _quoted(paths: list[str]) -> str:
    """A DuckDB list literal of file paths."""
    return "[" + ", ".join("'" + p.replace("'", "''") + "'" for p in paths) + "]"
