"""Per-head statistics over many texts.

  windows   a text cut into windows of tokens, each run on its own, the statistics averaged (the Heads page's
            "Many texts" tab, `attnviz stats --window`), and two models' tables compared
  sources   data as people keep it (.txt files and folders, JSON Lines, Parquet, a `datasets` folder saved with
            save_to_disk) read into documents, each bad input named by file and line or row
  store     a corpus run's folder: its manifest, window plan and Parquet shards, each written aside then renamed
  run       corpus_run: every window of every document through the model, shard by shard, resumable
  results   CorpusRun, the finished run: summary, top windows, SQL (DuckDB) and comparison
  ray       the same shard function on a Ray cluster (Ray Data, an actor pool), an optional extra
"""

from attnviz.corpus.results import CorpusRun
from attnviz.corpus.run import corpus_run
from attnviz.corpus.sources import CorpusError, Document, read_documents
from attnviz.corpus.windows import (MAX_WINDOWS, compare_heads, corpus_stats, layer_means, text_windows,
                                    token_windows, window_spans, window_summary)

__all__ = ["MAX_WINDOWS", "CorpusError", "CorpusRun", "Document", "compare_heads", "corpus_run", "corpus_stats",
           "layer_means", "read_documents", "text_windows", "token_windows", "window_spans", "window_summary"]
