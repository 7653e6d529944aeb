"""The import layers of ARCHITECTURE.md, read from the code: every import of every tfpar module,
lazy ones (inside a function) included, ``from package import module`` read as an import of the
module (as import-linter reads it)."""

import ast
import os

from tests.conftest import ROOT

PURE = frozenset(
    {
        "tfpar._checks",
        "tfpar._files",
        "tfpar._lazy",
        "tfpar._tasks",
        "tfpar._tasks.env",
        "tfpar._tasks.heartbeat",
        "tfpar._tasks.timeline_files",
        "tfpar._tasks.elastic_batch",
        "tfpar._local",
        "tfpar._local.processes",
        "tfpar._local.loopback",
        "tfpar.cluster",
        "tfpar.cluster.addresses",
        "tfpar.cluster.slurm",
        "tfpar.launch.job",
        "tfpar.launch.supervisor",
        "tfpar.launch.node",
        "tfpar.launch.rendezvous",
        "tfpar.launch.rendezvous.static",
        "tfpar.launch.rendezvous.protocol",
        "tfpar.launch.rendezvous.rounds",
        "tfpar.launch.rendezvous.elastic",
        "tfpar.launch.elastic",
        "tfpar.launch.elastic.discovery",
        "tfpar.launch.elastic.membership",
        "tfpar.pipeline.schedule",
        "tfpar.pipeline.streams",
        "tfpar.pipeline.simulation",
        "tfpar.data.plan",
        "tfpar.data.batching",
        "tfpar.tensor_parallel.plan",
        "tfpar.tensor_parallel.rules",
    }
)
"""Layer 1: planning and protocol, no TensorFlow (tests/unit/test_public_names.py loads them)."""

LAYERS = {
    2: ("tfpar._keras", "tfpar._compat", "tfpar._owned", "tfpar._timing"),
    3: (
        "tfpar.devices",
        "tfpar.precision",
        "tfpar.optimizers",
        "tfpar._topology",
        "tfpar._local.server",
        "tfpar.remat",
    ),
    4: (
        "tfpar._parallelism",
        "tfpar.strategies",
        "tfpar.pipeline",
        "tfpar.tensor_parallel",
        "tfpar.data",
        "tfpar.quantization",
    ),
    5: ("tfpar.callbacks", "tfpar._factory", "tfpar.integrations"),
    6: (
        "tfpar",
        "tfpar.__main__",
        "tfpar.launch",
        "tfpar.cli",
        "tfpar.demo",
        "tfpar.verify",
        "tfpar.tune",
        "tfpar.report",
        "tfpar.doctor",
        "tfpar.install_horovod",
    ),
}
"""Layers 2 to 6 of ARCHITECTURE.md: the modules (and packages, with their modules) of each."""


def layer_of(module):
    """The layer of ``module`` (1 to 6), or None if ARCHITECTURE.md gives it none."""
    if module in PURE:
        return 1
    for layer in sorted(LAYERS, reverse=True):  # "tfpar" (6) is the package only, not its modules
        for name in LAYERS[layer]:
            if module == name or (name != "tfpar" and module.startswith(name + ".")):
                return layer
    return None


def _modules():
    """{module name: path} of every module of the tfpar package."""
    modules = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "tfpar")):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = os.path.relpath(path[:-3], ROOT).replace(os.sep, ".")
                modules[module.removesuffix(".__init__")] = path
    return modules


def _imports():
    """{module: the tfpar modules it imports}, lazy imports included."""
    modules = _modules()

    def known(name):  # the module ``name`` names, or the package that holds the name
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                submodules = [f"{base}.{alias.name}" for alias in node.names]
                names.update(submodules if all(s in modules for s in submodules) else [base])
        graph[module] = {known(n) for n in names if n.split(".")[0] == "tfpar"} - {module, ""}
    return graph


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component, member = set(), None
            while member != module:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
            if len(component) > 1:
                found.append(frozenset(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_the_walk_sees_lazy_imports_and_reads_submodule_imports_as_modules():
    graph = _imports()
    # imported inside a function
    assert "tfpar._tasks.timeline_files" in graph["tfpar.launch.command"]
    # from tfpar.quantization import deploy
    assert "tfpar.quantization.deploy" in graph["tfpar.quantization.export"]
    assert "tfpar.quantization" not in graph["tfpar.quantization.export"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_the_pure_modules_import_only_pure_modules():
    graph = _imports()
    assert PURE <= graph.keys()
    upward = {module: sorted(graph[module] - PURE) for module in PURE if graph[module] - PURE}
    assert upward == {}, f"layer-1 modules import from higher layers: {upward}"


def test_every_module_has_a_layer_and_imports_only_its_own_layer_or_lower():
    graph = _imports()
    assert [m for m in sorted(graph) if layer_of(m) is None] == [], (
        "give each module a layer in ARCHITECTURE.md"
    )
    upward = [
        f"{m} ({layer_of(m)}) -> {t} ({layer_of(t)})"
        for m in sorted(graph)
        for t in sorted(graph[m])
        if layer_of(t) > layer_of(m)
    ]
    assert upward == [], f"imports from a higher layer: {upward}"


def test_no_import_cycle():
    cycles = _cycles(_imports())
    assert [sorted(cycle) for cycle in cycles] == [], (
        "import cycles (ARCHITECTURE.md: layers point down)"
    )


def test_the_training_runtime_never_imports_the_launcher():
    """Layers 2 to 5 (the seams, the runtime, the engines, the callbacks) share only `_tasks` and
    `_local` with `tfpar launch`: importing any part of `tfpar.launch` would run its package."""
    graph = _imports()
    runtime = [m for m in graph if layer_of(m) in (2, 3, 4, 5)]
    assert len(runtime) > 50
    reached = {
        m: sorted(t for t in graph[m] if t == "tfpar.launch" or t.startswith("tfpar.launch."))
        for m in runtime
    }
    assert {m: t for m, t in reached.items() if t} == {}
