"""run_on_ray: a corpus run's shards on a Ray cluster, through the local engine's own shard function.

The pending shards (those not yet in the run folder) become a Ray Data data set of shard numbers, mapped by a pool
of actors (map_batches with a callable class, one shard per batch). Each actor loads the model once, by its name,
folder or file, checks that its weights are the manifest's, and for each shard computes
attnviz.corpus.shards.shard_rows on that shard's windows and writes the shard into the folder itself (written aside,
then renamed): the folder must be one every node sees. Only a small record per shard comes back to the driver, which
reports progress as they arrive.

Actors are restarted when their process dies (a node lost, a worker killed), and the shard they held is run again
on the new one; it rewrites the same whole file, so a window is never missing or written twice. Ray is the
`cluster` extra: it is imported only here, inside the functions that need it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path

from attnviz.corpus.shards import model_fingerprint, shard_rows
from attnviz.corpus.sources import CorpusError
from attnviz.corpus.store import RunFolder
from attnviz.models import ModelError, load_model

RESTARTS = 3  # tries of a dead actor and of its shard: a shard that kills its actor every time fails the run
SPARE_CPUS = 1  # left to Ray Data's own tasks: a pool holding every CPU starves them and the run waits forever
OBJECT_STORE_BYTES = 256 * 2**20  # a local Ray's object store: only shard numbers and small records go through it


def run_on_ray(model, tokenizer, folder: RunFolder, *, progress=None, actors: int | None = None) -> None:
    """Every shard of `folder` not yet there, on the Ray cluster RAY_ADDRESS names (else a local Ray started for
    this call and stopped after it; a Ray already started in this process is used as it is). model: a name, a
    folder or a .gguf file, which each actor loads itself. actors: the pool's size (default: one per node).
    progress(done, total) in windows, called here as each shard is written."""
    if tokenizer is not None or not isinstance(model, (str, Path)):
        raise CorpusError("engine='ray' needs the model as a name, a folder or a .gguf file, which each Ray actor "
                          "loads itself: a model object cannot be sent to the cluster.")
    if actors is not None and actors < 1:
        raise CorpusError("actors must be at least 1.")
    ray = _import_ray()
    manifest = folder.manifest()
    size, total, n_shards = manifest["shard_windows"], manifest["n_windows"], manifest["n_shards"]
    done = folder.done_shards()
    pending = [shard for shard in range(n_shards) if shard not in done]
    finished = sum(min(size, total - shard * size) for shard in done)
    if progress is not None:
        progress(finished, total)
    if not pending:
        return
    with _cluster(ray), _quiet_data(ray):
        records = _shard_pool(ray, model, folder, pending, actors)
        # closed in any case, so that the pipeline and its actors end here even when a refusal ends the loop
        with contextlib.closing(iter(records.iter_batches(batch_size=1, batch_format="numpy",
                                                          prefetch_batches=0))) as batches:
            for batch in batches:
                if batch["error"][0]:
                    raise CorpusError(str(batch["error"][0]))
                finished += int(batch["windows"].sum())
                if progress is not None:
                    progress(finished, total)
    missing = sorted(set(pending) - folder.done_shards())
    if missing:
        raise CorpusError(f"The Ray run ended without {len(missing)} of its shards: run the same command again to "
                          "compute them.")


def _shard_pool(ray, model, folder: RunFolder, pending: list[int], actors: int | None):
    """The data set of one record per pending shard: their numbers mapped by a pool of ShardWorker actors sized by
    actor_sizing on this cluster, each restarted up to RESTARTS times and its shard tried again as often."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    node_cpus = max(n["Resources"].get("CPU", 0) for n in nodes)
    n_actors, cpus, threads = actor_sizing(ray.cluster_resources().get("CPU", 1), node_cpus, actors or len(nodes),
                                           len(nodes))
    shards = ray.data.from_items([{"shard": shard} for shard in pending], override_num_blocks=len(pending))
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing max_restarts and max_task_retries this way but names no other: without them
        # Ray Data retries a dead actor forever, and a shard that kills its actor would never end the run
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated", DeprecationWarning)
        return shards.map_batches(
            ShardWorker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=min(n_actors, len(pending))),
            num_cpus=cpus, max_restarts=RESTARTS, max_task_retries=RESTARTS,
            fn_constructor_kwargs={"model": _portable(model), "folder": str(folder.path.resolve()),
                                   "name": folder.name, "threads": threads})


def actor_sizing(total_cpus: float, node_cpus: float, actors: int, nodes: int = 1) -> tuple[int, float, int]:
    """(actors, CPUs each asks Ray for, torch threads each runs) for a pool of `actors` on a cluster of `nodes`
    nodes and total_cpus CPUs, whose biggest node has node_cpus. The pool asks Ray for all but SPARE_CPUS of them
    (half of them on a one-CPU machine), so Ray Data's own tasks always find a CPU to be scheduled on; a share of
    one CPU or more is a whole number no bigger than a node, so that each actor fits on one. Threads are counted
    from the cores, not from that reservation: Ray Data's tasks here only hand out shard numbers, so an actor alone
    on a node runs on all of its cores (the local engine's speed), and actors sharing a node split its cores."""
    usable = max(total_cpus - SPARE_CPUS, total_cpus / 2)
    cpus = usable / actors
    if cpus >= 1:
        cpus = float(min(int(cpus), int(node_cpus)))
    per_node = -(-actors // max(1, nodes))
    return actors, cpus, max(1, int(node_cpus) // per_node)


class ShardWorker:
    """One actor of the pool: the model loaded once, then shard_rows of each shard it is given, written into the
    run folder. A batch is {"shard": [k]}; it returns {"shard": [k], "windows": [its number of windows], "error":
    [""]}, or the message of what refused the actor in "error" (the driver raises it as a CorpusError: Ray would
    bury it in the actor's traceback)."""

    def __init__(self, model: str, folder: str, name: str, threads: int):
        import torch

        import attnviz.kernels  # noqa: F401  (chooses Triton's backend before a model imports triton.language)

        torch.set_num_threads(threads)  # the actor's share of the node's cores (actor_sizing)
        self.folder, self.refusal = RunFolder(folder, name), ""
        try:
            manifest = self.folder.manifest()
            self.size = manifest["shard_windows"]
            self.loaded = load_model(model)
            if model_fingerprint(self.loaded.model) != manifest["model_fingerprint"]:
                raise CorpusError("The model a Ray node loads has other weights than the one the run was planned "
                                  "with: give every node the same model.")
            self.plan = self.folder.windows(columns=["window_id", "ids"])
        except (CorpusError, ModelError) as exc:
            self.refusal = str(exc)

    def __call__(self, batch: dict) -> dict:
        records = {"shard": [], "windows": [], "error": []}
        for shard in map(int, batch["shard"]):
            windows, error = 0, self.refusal
            if not error:
                part = self.plan.iloc[shard * self.size:(shard + 1) * self.size]
                try:
                    self.folder.write_shard(shard, shard_rows(self.loaded, part["window_id"].tolist(),
                                                              part["ids"].tolist()))
                    windows = len(part)
                except CorpusError as exc:  # a full disk, a folder that cannot be written
                    error = str(exc)
            records["shard"].append(shard)
            records["windows"].append(windows)
            records["error"].append(error)
        return records


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise CorpusError("engine='ray' needs Ray Data: pip install attnviz[cluster]") from exc
    return ray


@contextlib.contextmanager
def _cluster(ray):
    """Ray as this process has it, or attached to RAY_ADDRESS's cluster, or a small local one; what this block
    started or attached is shut down after it."""
    if ray.is_initialized():
        yield
        return
    quiet = dict(log_to_driver=False, logging_level=logging.WARNING)
    address = os.environ.get("RAY_ADDRESS")
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            ray.init(object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False, **quiet)
    except ConnectionError as exc:
        raise CorpusError("Cannot reach the Ray cluster that RAY_ADDRESS names: start it (ray start --head), or "
                          "unset RAY_ADDRESS to run on a local Ray.") from exc
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def _quiet_data(ray):
    """No Ray Data progress bars, nor its lines saying how it starts, runs and reports progress, while the block
    runs: the run reports its own progress on one line. Its other warnings still show."""
    context = ray.data.DataContext.get_current()
    saved = context.enable_progress_bars, context.print_on_execution_start
    context.enable_progress_bars, context.print_on_execution_start = False, False
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.WARNING)
    bars = logging.getLogger("ray.data._internal.progress")
    bars.addFilter(_no_progress_lines)
    try:
        yield
    finally:
        context.enable_progress_bars, context.print_on_execution_start = saved
        log.setLevel(level)
        bars.removeFilter(_no_progress_lines)


def _no_progress_lines(record: logging.LogRecord) -> bool:
    return "Progress bars disabled" not in record.getMessage()


def _portable(model) -> str:
    """The model as an actor can load it: a folder or file that exists here by its absolute path (an actor's working
    folder is not the driver's), a name as it is."""
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else str(model)
