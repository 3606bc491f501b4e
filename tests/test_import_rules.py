"""Which parts of the trainer package may speak HTTP: the disaggregated runtime, and the two
clients of an outside server (`regenerate`'s chat endpoint, and `serve/llama_server.py`, which
drives a llama-server process on the loopback for `eval --engine llama.cpp`). The local training
path (the
training loop, backends, data, models, features, export and serving, the launcher) never imports
an HTTP module, not even through another module, so a local run never pays for, or depends on,
the runtime's servers.

The import graph is the one `test_import_cycles` reads from the source (deferred imports count,
`if TYPE_CHECKING:` ones do not).
"""

from __future__ import annotations

from test_import_cycles import Edge, discover_modules, module_graph

RUNTIME = "specdraft.trainer.runtime"
HTTP_MODULES = (f"{RUNTIME}.http_server", f"{RUNTIME}.http_client")
# Who may import an HTTP module, and which: the disaggregated runtime all of them, corpus
# regeneration only the client (it calls an OpenAI-compatible chat endpoint such as SGLang).
ALLOWED = {
    "specdraft.trainer.disagg": HTTP_MODULES,
    "specdraft.trainer.regenerate.endpoint": (f"{RUNTIME}.http_client",),
    "specdraft.trainer.serve.llama_server": (f"{RUNTIME}.http_client",),
}
# Serving through llama.cpp is a client of llama-server: left out of the local path's starts
# (nothing on that path may import them either: a chain from train/ to them is still found).
LLAMA_CLIENTS = ("specdraft.trainer.serve.llama_server", "specdraft.trainer.serve.llama_served")
# The local training path: every module of these sub-packages (and these loose modules).
LOCAL_PATH = (
    "specdraft.trainer.train",
    "specdraft.trainer.backends",
    "specdraft.trainer.data",
    "specdraft.trainer.models",
    "specdraft.trainer.features",
    "specdraft.trainer.assets",
    "specdraft.trainer.export",
    "specdraft.trainer.serve",
    "specdraft.trainer.launch",
    "specdraft.trainer.integrity",
    f"{RUNTIME}.atomic",
    f"{RUNTIME}.cache",
    f"{RUNTIME}.distributed",
    f"{RUNTIME}.private",
    f"{RUNTIME}.run_secret",
    f"{RUNTIME}.service_process",
)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def http_import_offenders(edges: list[Edge]) -> list[str]:
    """Imports of an HTTP module by a module that `ALLOWED` does not let import it."""
    offenders = []
    for edge in edges:
        if edge.target not in HTTP_MODULES or _within(edge.source, RUNTIME):
            continue
        allowed = [targets for prefix, targets in ALLOWED.items() if _within(edge.source, prefix)]
        if not any(edge.target in targets for targets in allowed):
            offenders.append(f"{edge.path}:{edge.line}: {edge.source} imports {edge.target}")
    return offenders


def http_paths_from(starts: list[str], edges: list[Edge]) -> list[str]:
    """For each HTTP module reachable from `starts`, one import chain that reaches it."""
    graph: dict[str, list[Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
    found = []
    seen: dict[str, Edge | None] = {start: None for start in starts}
    frontier = list(starts)
    while frontier:
        following = []
        for node in frontier:
            for edge in graph.get(node, []):
                if edge.target in seen:
                    continue
                seen[edge.target] = edge
                following.append(edge.target)
        frontier = following
    for target in HTTP_MODULES:
        if target not in seen:
            continue
        chain, node = [], target
        while (edge := seen[node]) is not None:
            chain.insert(0, f"{edge.source} -> {edge.target} ({edge.path}:{edge.line})")
            node = edge.source
        found.append("\n    ".join(chain))
    return found


def test_only_the_disaggregated_runtime_imports_an_http_module():
    """An HTTP module is imported by disagg/ (and the chat endpoint client), nowhere else."""
    modules = discover_modules()
    for name in HTTP_MODULES:
        assert name in modules, f"{name} moved: update HTTP_MODULES"
    offenders = http_import_offenders(module_graph())
    assert not offenders, "HTTP imports outside the disaggregated runtime:\n" + "\n".join(offenders)


def test_the_local_training_path_reaches_no_http_module():
    """Not even through another module: from train/, backends/, models/, ... no chain of
    imports ends in an HTTP module."""
    modules = discover_modules()
    starts = [
        name
        for name in modules
        if any(_within(name, p) for p in LOCAL_PATH) and name not in LLAMA_CLIENTS
    ]
    assert f"{RUNTIME}.private" in starts and "specdraft.trainer.train.rank_entry" in starts
    paths = http_paths_from(starts, module_graph())
    assert not paths, "the local training path imports HTTP:\n    " + "\n    ".join(paths)


def test_the_rules_catch_an_http_import_from_the_training_loop():
    """The checks fail on the imports they forbid (they would pass vacuously otherwise)."""
    edges = [
        Edge(
            "specdraft.trainer.train.rank_entry", "specdraft.trainer.disagg.x", "rank_entry.py", 3
        ),
        Edge("specdraft.trainer.disagg.x", HTTP_MODULES[0], "x.py", 5),
        Edge("specdraft.trainer.regenerate.endpoint", HTTP_MODULES[0], "endpoint.py", 7),
        Edge("specdraft.trainer.regenerate.endpoint", HTTP_MODULES[1], "endpoint.py", 8),
    ]
    assert http_import_offenders(edges) == [
        f"endpoint.py:7: specdraft.trainer.regenerate.endpoint imports {HTTP_MODULES[0]}"
    ]
    (path,) = http_paths_from(["specdraft.trainer.train.rank_entry"], edges)
    assert path.startswith(
        "specdraft.trainer.train.rank_entry -> specdraft.trainer.disagg.x (rank_entry.py:3)"
    )
